"""The reference reader for tests/server/metrics_test.cc: parses a Prometheus text exposition
file with prometheus_client's own parser and prints its metric families as JSON.

usage: prometheus_parse.py METRICS.txt > FAMILIES.json
Values are printed as Python's repr of the float ("5.0", "inf", "nan"), which JSON cannot hold.
"""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        text = f.read()
    families = []
    for family in text_string_to_metric_families(text):
        families.append({
            "name": family.name,
            "type": family.type,
            "help": family.documentation,
            "samples": [{"name": s.name, "labels": s.labels, "value": repr(s.value)}
                        for s in family.samples],
        })
    json.dump(families, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
