#!/bin/bash
# Alternates benchmark binaries, one run each per round:
#   rounds.sh OUTDIR ROUNDS NAME=BIN... -- [benchmark args...]
out=$1; rounds=$2; shift 2
names=(); bins=()
while [ "$1" != "--" ]; do names+=("${1%%=*}"); bins+=("${1#*=}"); shift; done
shift
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
  for k in "${!names[@]}"; do
    { date -u +%T; uptime; "${bins[$k]}" "$@"; } > "$out/${names[$k]}.$i.txt" 2>&1
  done
done
