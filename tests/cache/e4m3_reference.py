"""Writes tests/cache/fixtures/e4m3_torch.bin: OCP float8 e4m3fn encodings and decodings as
PyTorch computes them (torch.float8_e4m3fn), the reference kvpool's e4m3 conversions
(common/dtype.h f32_to_e4m3 / e4m3_to_f32) are checked against bit for bit by
tests/cache/kv_quant_test.cc. kvpool's encoder saturates at ±448 and torch's cast does not (it
gives NaN past 464), so inputs are clamped to [-448, 448] before torch casts them; NaN stays NaN.

Format (little endian):
  [65536] u8   code of every f16 bit pattern i, as f32
  [65536] u8   code of every bf16 bit pattern i, as f32
  [256]   f32  value of every code
  u32 N, [N] f32 inputs, [N] u8 codes: ties between neighbouring codes and the f32 values
               1 and 2 ulps either side of them, the saturation edge, f32 subnormals, and
               log-uniform random values of both signs

Run: /tmp/tq/bin/python tests/cache/e4m3_reference.py   (any Python with torch >= 2.1 and numpy)
"""
import pathlib
import struct

import numpy as np
import torch


def codes(x: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(x.astype(np.float32)).clamp(-448.0, 448.0)
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def main() -> None:
    f16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    bf16 = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    values = values.to(torch.float32).numpy()

    finite = np.sort(values[np.isfinite(values) & (values >= 0)])
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    sample = [mids]
    for steps in (1, 2):
        up, down = mids.copy(), mids.copy()
        for _ in range(steps):
            up = np.nextafter(up, np.float32(np.inf))
            down = np.nextafter(down, np.float32(0))
        sample += [up, down]
    sample.append(finite)
    edge = np.array([448, 449, 463.99997, 464, 464.00003, 480, 1e4, 3e38, np.inf, 0.0,
                     2.0**-10, 2.0**-11, 1e-40, 1e-45, 2.0**-6, 2.0**-9 * 1.5], dtype=np.float32)
    sample.append(edge)
    rng = np.random.default_rng(17)
    sample.append(np.exp2(rng.uniform(-14.0, 10.0, 8000)).astype(np.float32))
    pos = np.concatenate(sample).astype(np.float32)
    inputs = np.concatenate([pos, -pos, np.array([np.nan, -np.nan], dtype=np.float32)])

    out = pathlib.Path(__file__).parent / "fixtures" / "e4m3_torch.bin"
    with open(out, "wb") as f:
        f.write(codes(f16).tobytes())
        f.write(codes(bf16).tobytes())
        f.write(values.astype("<f4").tobytes())
        f.write(struct.pack("<I", len(inputs)))
        f.write(inputs.astype("<f4").tobytes())
        f.write(codes(inputs).tobytes())
    print(f"{out}: {out.stat().st_size} bytes, {len(inputs)} sampled inputs")


if __name__ == "__main__":
    main()
