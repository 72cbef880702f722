"""Reference data for kvpool's GGUF reader and dequantisers, made with the gguf package
(0.19.0), which kvpool did not write.

Usage: make_gguf_reference.py OUT_DIR

Writes into OUT_DIR:
  quant.gguf      a GGUF v3 file (GGUFWriter) with metadata of every value type (scalars, strings,
                  arrays of each type, nested arrays) and one or more tensors of every type kvpool
                  dequantises. Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/BF16/MXFP4 data is random f32 quantised with
                  gguf.quants.quantize; Q2_K..Q6_K, IQ4_NL, IQ4_XS (which the package cannot quantise) are
                  random raw blocks with finite f16 scales; F16 includes all 65536 bit patterns.
  fuzz.gguf       the same metadata with three small tensors (for corruption sweeps).
  aligned.gguf    a small file with general.alignment = 64.
  <tensor>.f32    gguf.quants.dequantize of each tensor's bytes, raw little-endian float32.
  expected.json   metadata as gguf.GGUFReader reads it back from quant.gguf, tensor infos as the
                  reader reports them, and ggml's (block size, type size) table.
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

QUANTISABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.MXFP4]
RAW_K = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]
NESTED_INT = [[1, 2], [3], [4, 5, 6]]
NESTED_STR = [["p", "q"], ["r"]]


def random_k_blocks(rng, qtype, num_blocks):
    """Random bytes for each block, with its f16 scale fields set to finite positive values."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(num_blocks, type_size), dtype=np.uint8)
    def f16_bytes(lo, hi):
        return rng.uniform(lo, hi, size=(num_blocks, 1)).astype(np.float16).view(np.uint8)
    if qtype in (T.IQ4_NL, T.IQ4_XS):  # d at the start
        blocks[:, 0:2] = f16_bytes(1e-4, 0.05)
    elif qtype in (T.Q4_K, T.Q5_K):  # d, dmin at the start
        blocks[:, 0:2] = f16_bytes(1e-4, 0.05)
        blocks[:, 2:4] = f16_bytes(1e-4, 0.05)
    elif qtype in (T.Q3_K, T.Q6_K):  # d at the end
        blocks[:, type_size - 2:] = f16_bytes(1e-4, 0.05)
    elif qtype == T.Q2_K:  # d, dmin at the end
        blocks[:, type_size - 4:type_size - 2] = f16_bytes(1e-4, 0.05)
        blocks[:, type_size - 2:] = f16_bytes(1e-4, 0.05)
    return blocks


def add_metadata(w):
    w.add_key_value("test.u8", 200, V.UINT8)
    w.add_key_value("test.i8", -100, V.INT8)
    w.add_key_value("test.u16", 60000, V.UINT16)
    w.add_key_value("test.i16", -30000, V.INT16)
    w.add_key_value("test.u32", 4000000000, V.UINT32)
    w.add_key_value("test.i32", -2000000000, V.INT32)
    w.add_key_value("test.f32", 0.1, V.FLOAT32)
    w.add_key_value("test.bool_true", True, V.BOOL)
    w.add_key_value("test.bool_false", False, V.BOOL)
    w.add_key_value("test.string", "héllo, wörld ✓", V.STRING)
    w.add_key_value("test.empty_string", "", V.STRING)
    w.add_key_value("test.u64", 2**64 - 1, V.UINT64)
    w.add_key_value("test.i64", -(2**62) - 7, V.INT64)
    w.add_key_value("test.f64", 1.0 / 3.0, V.FLOAT64)
    w.add_key_value("test.arr.u8", [0, 1, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("test.arr.i8", [-128, 0, 127], V.ARRAY, sub_type=V.INT8)
    w.add_key_value("test.arr.u16", [1, 65535], V.ARRAY, sub_type=V.UINT16)
    w.add_key_value("test.arr.i16", [-32768, 32767], V.ARRAY, sub_type=V.INT16)
    w.add_key_value("test.arr.u32", [7, 4294967295], V.ARRAY, sub_type=V.UINT32)
    w.add_key_value("test.arr.i32", list(range(-5, 1000)), V.ARRAY, sub_type=V.INT32)
    w.add_key_value("test.arr.f32", [0.5, -1.25, 3.0e38, 1e-40], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("test.arr.bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_key_value("test.arr.string", ["a", "", "ünï", "x" * 300], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("test.arr.u64", [2**64 - 1, 0], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("test.arr.i64", [-(2**63), 2**63 - 1], V.ARRAY, sub_type=V.INT64)
    w.add_key_value("test.arr.f64", [0.1, -2.5e300], V.ARRAY, sub_type=V.FLOAT64)
    # Nested arrays: element type ARRAY; inner arrays are int32 / string (the writer's default).
    w.add_key_value("test.arr.nested", NESTED_INT, V.ARRAY)
    w.add_key_value("test.arr.nested_str", NESTED_STR, V.ARRAY)


def field_json(field):
    """A metadata field as GGUFReader reports it: its type chain and its contents."""
    types = [V(t).name for t in field.types]
    out = {"types": types}
    if field.types[0] == V.ARRAY and len(field.types) > 1 and field.types[1] == V.ARRAY:
        out["count"] = len(field.data)  # the reader does not decode nested arrays
        return out
    value = field.contents()
    if isinstance(value, float):
        value = float(value)
    if isinstance(value, list):
        value = [float(x) if isinstance(x, float) else x for x in value]
    out["value"] = value
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(20261122)

    path = os.path.join(out_dir, "quant.gguf")
    w = gguf.GGUFWriter(path, arch="kvptest")
    add_metadata(w)

    tensors = {}  # name -> (raw bytes as numpy, qtype)
    rows, cols = 6, 512
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[0, :40] = 0.0  # a block of zeros: scales of 0
    tensors["t.f32"] = (x, T.F32)
    tensors["t.f16"] = (x.astype(np.float16), T.F16)
    tensors["t.f16_all_patterns"] = (np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256), T.F16)
    for q in QUANTISABLE:
        tensors[f"t.{q.name.lower()}"] = (gguf.quants.quantize(x, q), q)
    # 3-d quantised tensor: rows are the innermost dimension, the other two flatten.
    tensors["t.q8_0_3d"] = (gguf.quants.quantize(rng.standard_normal((2, 3, 64)).astype(np.float32), T.Q8_0), T.Q8_0)
    for q in RAW_K:
        blocks = random_k_blocks(rng, q, rows * 2)
        tensors[f"t.{q.name.lower()}"] = (blocks.reshape(rows, -1), q)
    # MXFP4 blocks of every exponent byte (0 and 1 give subnormal scales, 255 overflows to inf)
    mx = rng.integers(0, 256, size=(256, 17), dtype=np.uint8)
    mx[:, 0] = np.arange(256, dtype=np.uint8)
    tensors["t.mxfp4_all_exponents"] = (mx.reshape(8, 32 * 17), T.MXFP4)
    tensors["t.bf16_special"] = (gguf.quants.quantize(np.array(
        [[0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 1e-40, 3.4e38]], dtype=np.float32), T.BF16), T.BF16)

    for name, (data, q) in tensors.items():
        if q in (T.F32, T.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    for name, (data, q) in tensors.items():
        with np.errstate(over="ignore"):  # MXFP4's largest exponents overflow to inf
            ref = gguf.quants.dequantize(data, q).astype(np.float32)
        ref.tofile(os.path.join(out_dir, name + ".f32"))

    reader = gguf.GGUFReader(path)
    expected = {
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "metadata": {name: field_json(f) for name, f in reader.fields.items()
                     if not name.startswith("GGUF.")},
        "metadata_order": [name for name in reader.fields if not name.startswith("GGUF.")],
        "tensors": [{"name": t.name, "type": t.tensor_type.name,
                     "dims": [int(d) for d in t.shape], "n_elements": int(t.n_elements),
                     "n_bytes": int(t.n_bytes), "data_offset": int(t.data_offset)}
                    for t in reader.tensors],
        "type_sizes": {q.name: list(gguf.GGML_QUANT_SIZES[q]) for q in gguf.GGML_QUANT_SIZES},
        "type_values": {q.name: int(q) for q in gguf.GGML_QUANT_SIZES},
        # The reader does not decode nested arrays: these are the values this script wrote.
        "nested_written": {"test.arr.nested": NESTED_INT, "test.arr.nested_str": NESTED_STR},
    }
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)

    # A small file with the same header and three small tensors, for the corruption sweep.
    w = gguf.GGUFWriter(os.path.join(out_dir, "fuzz.gguf"), arch="kvptest")
    add_metadata(w)
    w.add_tensor("f.q8_0", gguf.quants.quantize(x[:2, :64], T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("f.q4_k", random_k_blocks(rng, T.Q4_K, 2), raw_dtype=T.Q4_K)
    w.add_tensor("f.f16", x[:3, :8].astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    w = gguf.GGUFWriter(os.path.join(out_dir, "aligned.gguf"), arch="kvptest")
    w.add_custom_alignment(64)
    w.add_tensor("a", np.arange(3, dtype=np.float32))
    w.add_tensor("b", np.arange(5, dtype=np.float32) * -1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
