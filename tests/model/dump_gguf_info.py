"""Dumps what gguf.GGUFReader (the gguf package 0.19.0, which kvpool did not write) reports about
a GGUF file, for kvpool's reader to be compared against.

Usage: dump_gguf_info.py MODEL.gguf OUT_DIR

Writes OUT_DIR/info.json: alignment, data offset, every metadata key with its type chain (scalars
and strings with their value; arrays with their length and first elements), every tensor's name,
type, dims (ggml order), element count, byte size and absolute data offset. For the first tensor of
each type that gguf.quants can dequantise, writes its first two rows, dequantised, to
OUT_DIR/<tensor name>.rows.f32 (raw little-endian float32) and lists it under "dequantized".
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGUFValueType as V

NUM_ROWS = 2
NUM_ARRAY_ELEMENTS = 5


def py(x):
    if isinstance(x, (np.floating, float)):
        return float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def field_json(field):
    types = [V(t).name for t in field.types]
    out = {"types": types}
    if field.types[0] == V.ARRAY:
        out["count"] = len(field.data)
        if len(field.types) == 2:
            out["first"] = [py(v) for v in field.contents(slice(0, NUM_ARRAY_ELEMENTS))]
    else:
        out["value"] = py(field.contents())
    return out


def main():
    model, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    r = gguf.GGUFReader(model)
    info = {
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": {n: field_json(f) for n, f in r.fields.items() if not n.startswith("GGUF.")},
        "tensors": [{"name": t.name, "type": t.tensor_type.name, "dims": [int(d) for d in t.shape],
                     "n_elements": int(t.n_elements), "n_bytes": int(t.n_bytes),
                     "data_offset": int(t.data_offset)} for t in r.tensors],
        "dequantized": [],
    }
    seen = set()
    for t in r.tensors:
        if t.tensor_type in seen:
            continue
        seen.add(t.tensor_type)
        rows = t.data.reshape(-1, t.data.shape[-1])[:NUM_ROWS] if t.data.ndim > 1 else t.data[None, :]
        try:
            ref = gguf.quants.dequantize(rows, t.tensor_type)
        except NotImplementedError:
            continue
        ref.astype(np.float32).tofile(os.path.join(out_dir, t.name + ".rows.f32"))
        info["dequantized"].append({"name": t.name, "rows": int(ref.shape[0])})
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
