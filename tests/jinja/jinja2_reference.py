#!/usr/bin/env python3
"""Renders tests/jinja/cases.json with Python jinja2, in transformers' chat-template environment.

Usage: jinja2_reference.py CASES_JSON OUT_JSON

Each case is {"name", "template", "context"}; the output maps each name to {"output": text} or
{"error": message, "type": exception class}. The environment is the one transformers compiles chat
templates in (transformers.utils.chat_template_utils._compile_jinja_template: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols, its tojson,
raise_exception, strftime_now, dict and namespace), so the C++ interpreter is compared with exactly
what apply_chat_template runs.
"""
import json
import sys

from transformers.utils.chat_template_utils import _cached_compile_jinja_template


def render(case):
    try:
        template = _cached_compile_jinja_template(case["template"])
        return {"output": template.render(**case.get("context", {}))}
    except Exception as e:  # every failure is a result to compare with
        return {"error": str(e), "type": type(e).__name__}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    results = {case["name"]: render(case) for case in cases}
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
