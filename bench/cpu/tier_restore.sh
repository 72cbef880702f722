#!/usr/bin/env bash
# Issue 16's CPU goal: an idle session restored from the host tier against its history
# re-prefilled, on this CPU with the default model, at several history lengths. 4 agents, each
# first sends an H-token turn (a document), then 2 turns of 64 tokens 1 s apart; the pool holds
# about two histories, so every later turn finds its session evicted: with no tier its history
# is prefilled again, with a host tier it is copied back. The figure is the TTFT of the later
# turns (kvpool bench's "TTFT later turns"), tiers none and host one after the other.
#   bench/cpu/tier_restore.sh [KVPOOL] [H ...]     (default: build/release/apps/kvpool 1024 4096)
set -u -o pipefail
kvpool=${1:-build/release/apps/kvpool}
shift || true
lengths=${*:-1024 4096}
model=${KVP_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${KVP_THREADS:-2}
echo "# $(date -u) $(git rev-parse --short HEAD 2>/dev/null) model $model threads $threads load $(cut -d' ' -f1-3 /proc/loadavg)"
for h in $lengths; do
  blocks=$(( (h * 5 / 2 + 15) / 16 + 16 ))
  for tier in none host; do
    extra=""
    [ "$tier" = host ] && extra="--host-tier-bytes 1073741824"
    echo "== history $h tokens, pool $blocks blocks of 16, tier $tier"
    "$kvpool" bench --model "$model" --workload agents --agents 4 --turns 3 \
      --system-prompt-tokens 0 --first-turn-tokens "$h" --turn-tokens 64 --reply-tokens 16 \
      --think-time 1 --max-seqs 2 --step-tokens 512 --blocks "$blocks" --block-size 16 \
      --threads "$threads" $extra 2>&1 | grep -iE "ttft|restor|prefilled|wall|moves|evict"
  done
done
