#!/usr/bin/env bash
# Writes each tiny fixture (tests/model/fixtures/tiny/NAME) as DEST/tests/model/fixtures/tiny_gguf/
# NAME.gguf in llama.cpp's layout (tests/model/make_tiny_gguf.py, the `gguf` package from
# scripts/setup.sh's .venv), for the GPU test CudaTinyGguf: the GPU machine has no `gguf` package.
# Called by scripts/gpu/package.sh and package-engine.sh with their staging folder.
set -euo pipefail
dest=${1:?usage: tiny-gguf.sh DEST}
python=${KVP_PYTHON:-.venv/bin/python}
mkdir -p "$dest/tests/model/fixtures/tiny_gguf"
for dir in tests/model/fixtures/tiny/*/; do
  name=$(basename "$dir")
  "$python" tests/model/make_tiny_gguf.py "tests/model/fixtures/tiny/$name" \
    "$dest/tests/model/fixtures/tiny_gguf/$name.gguf" > /dev/null
done
