#!/usr/bin/env bash
# kvpool against llama.cpp on this CPU (issue 14's goals): the same GGUF files, the same thread
# count, interleaved runs (kvpool, llama.cpp, kvpool, llama.cpp, ...), medians of REPS runs each.
#
#   decode  tok/s at batch 1 after a 512-token prompt
#           llama.cpp: llama-bench -p 0 -n 128 -d 512 -t T -r 1   (tg128 @ d512: mean of 128 tokens)
#           kvpool:    model_cpu_bench --prompt 512 --decode 128 --batch 1,1 --threads T
#                      (1 / median decode step over context 512..640)
#   prefill tok/s of one 512-token prompt
#           llama.cpp: llama-bench -p 512 -n 0 -t T -r 1   (after llama-bench's own warm-up run)
#           kvpool:    the same model_cpu_bench run's prefill of 512 tokens
#   Both kvpool numbers come from the second `--batch 1` pass of the run (the first warms up, as
#   llama-bench's warm-up run does). model_cpu_bench also prints the copy bandwidth (memcpy 1 GiB)
#   and the weight bytes a decode step reads; the floor column is (weight + KV bytes) / copy
#   bandwidth of the same run, as tok/s, i.e. what kvpool's decode would reach at full bandwidth.
#   peak RSS (/usr/bin/time -v, "Maximum resident set size"), once per model:
#           llama.cpp: the llama-bench decode run above (context 640, f16 KV)
#           kvpool:    `kvpool bench --workload offline --requests 1`, a 512-token prompt and 128
#                      output tokens, KV blocks for prompt + decode + 128 tokens. Not
#                      model_cpu_bench, whose 1 GiB copy buffers would dominate its peak.
#
# llama.cpp is built from source as docs say (/work/shared/PEERS.md): the llama-cpp-python sdist
# from PyPI carries the llama.cpp tree (0.3.36: llama.cpp 0c1e570); `cmake -DGGML_NATIVE=ON
# -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release`, target llama-bench. Give --llama-dir to reuse a
# tree that has build/bin/llama-bench; without it the script downloads and builds into
# build/peers/ (about 20-40 min on 2 cores, once).
#
# Run from the repository root, after `make build`:
#   bench/cpu/compare_llamacpp.sh                                  # both default models, -t 2, 5 reps
#   bench/cpu/compare_llamacpp.sh --reps 3 --decode 32 /work/peers/llama8b-q4km.gguf   # the 8B
#       (scripts/make_llama8b_q4km.py writes it; --prompt / --decode change 512 / 128 everywhere)
#   bench/cpu/compare_llamacpp.sh --llama-dir /work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp \
#       --threads 2 --reps 5 --out build/compare-llamacpp models/SmolLM2-135M-Instruct.Q4_1.gguf
# On a shared machine, --quiet-wait S waits (at most S seconds) before every rep until no other
# process is runnable (procs_running in /proc/stat); the table prints the load average at the
# start of each rep either way.
# Raw outputs of every run and the table (table.md) go to --out. The kvpool binaries are copied
# there first, so a rebuild of build/release during the run does not change what is measured.
set -u -o pipefail

LLAMA_VERSION=0.3.36   # llama-cpp-python sdist; its vendor/llama.cpp is what gets built
llama_dir=""
threads=2
reps=5
kvpool_build=build/release
out=""
quiet_wait=0
prompt=512    # tokens before decode, and the prefill length
decode=128    # decode tokens
models=()
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --llama-dir) llama_dir=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --kvpool-build) kvpool_build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quiet-wait) quiet_wait=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "unknown option $1" >&2; usage 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -eq 0 ] && models=(models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf)
out=${out:-build/compare-llamacpp-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
for m in "${models[@]}"; do [ -f "$m" ] || { echo "no model file $m" >&2; exit 2; }; done

# --- llama.cpp: reuse or build -------------------------------------------------------------
build_llama() {  # download the sdist into build/peers and build llama-bench there
  local peers=build/peers
  mkdir -p "$peers"
  local src="$peers/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  if [ ! -d "$src" ]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$peers" >&2 || return 1
    tar xzf "$peers/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$peers" || return 1
  fi
  local t0=$SECONDS
  (cd "$src" && cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >&2 &&
     nice cmake --build build -j "$(nproc)" --target llama-bench >&2) || return 1
  echo "llama.cpp built in $((SECONDS - t0)) s" >&2
  llama_dir=$src
}
if [ -z "$llama_dir" ]; then
  llama_dir=build/peers/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp
  [ -x "$llama_dir/build/bin/llama-bench" ] || build_llama || { echo "llama.cpp build failed" >&2; exit 1; }
fi
llama_bench=$llama_dir/build/bin/llama-bench
[ -x "$llama_bench" ] || { echo "no $llama_bench (build it, or omit --llama-dir)" >&2; exit 1; }

# --- kvpool: a snapshot of the binaries -----------------------------------------------------
for b in bench/model_cpu_bench apps/kvpool; do
  [ -x "$kvpool_build/$b" ] || { echo "no $kvpool_build/$b: make build first" >&2; exit 1; }
  cp "$kvpool_build/$b" "$out/"
done
kv_bench=$out/model_cpu_bench
kvpool=$out/kvpool

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  built=$(date -u -r "$kvpool_build/apps/kvpool" '+%Y-%m-%d %H:%M UTC')
  echo "kvpool: $(git -C "$kvpool_build" rev-parse --short HEAD 2>/dev/null) ($kvpool_build, built $built)"
  echo "llama.cpp: $llama_dir"
  echo "threads: $threads, reps: $reps, prompt: $prompt, decode: $decode"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/env.txt"

# Wait up to $quiet_wait s until five samples of procs_running over 1 s are all 1 (this shell).
wait_quiet() {
  local end=$((SECONDS + quiet_wait)) busy n line i
  while [ "$SECONDS" -lt "$end" ]; do
    busy=0
    for i in 1 2 3 4 5; do
      while read -r line; do
        case "$line" in procs_running*) n=${line#procs_running }; [ "$n" -gt 1 ] && busy=1 ;; esac
      done < /proc/stat
      sleep 0.2
    done
    [ "$busy" -eq 0 ] && return 0
    sleep 5
  done
  echo "  (machine still busy after ${quiet_wait} s; running anyway)" >&2
}

# --- interleaved runs ------------------------------------------------------------------------
for m in "${models[@]}"; do
  name=$(basename "$m" .gguf)
  for r in $(seq 1 "$reps"); do
    [ "$quiet_wait" -gt 0 ] && wait_quiet
    echo "== $name rep $r/$reps (load average $(cut -d' ' -f1 /proc/loadavg))" >&2
    cut -d' ' -f1 /proc/loadavg >> "$out/loadavg.txt"
    OPENBLAS_NUM_THREADS=$threads "$kv_bench" --model "$m" --threads "$threads" \
      --prompt "$prompt" --decode "$decode" --batch 1,1 > "$out/$name.kvpool.$r.txt" 2>&1 ||
      echo "  kvpool run failed (see $out/$name.kvpool.$r.txt)" >&2
    /usr/bin/time -v -o "$out/$name.llama.decode.$r.time" \
      "$llama_bench" -m "$m" -t "$threads" -r 1 -o json -p 0 -n "$decode" -d "$prompt" \
      > "$out/$name.llama.decode.$r.json" 2> "$out/$name.llama.decode.$r.err" ||
      echo "  llama-bench decode failed (see $out/$name.llama.decode.$r.err)" >&2
    "$llama_bench" -m "$m" -t "$threads" -r 1 -o json -p "$prompt" -n 0 \
      > "$out/$name.llama.prefill.$r.json" 2> "$out/$name.llama.prefill.$r.err" ||
      echo "  llama-bench prefill failed (see $out/$name.llama.prefill.$r.err)" >&2
  done
  echo "== $name kvpool peak RSS" >&2
  /usr/bin/time -v -o "$out/$name.kvpool.rss.time" "$kvpool" bench --model "$m" --threads "$threads" \
    --workload offline --requests 1 --prompt-tokens-min "$prompt" --prompt-tokens-max "$prompt" \
    --output-tokens-min "$decode" --output-tokens-max "$decode" --blocks $(((prompt + decode) / 16 + 8)) \
    > "$out/$name.kvpool.rss.txt" 2>&1 || echo "  kvpool bench failed (see $out/$name.kvpool.rss.txt)" >&2
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/env.txt"

# --- the table --------------------------------------------------------------------------------
python3 - "$out" "$reps" "$prompt" "$decode" "${models[@]}" <<'EOF' | tee "$out/table.md"
import json, os, re, statistics, sys

out, reps, prompt, decode, models = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]

def med(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), len(xs)) if xs else (None, 0)

def fmt(x, spec=".1f"):
    return "?" if x is None else format(x, spec)

def kvpool_run(path):
    """copy GB/s, weight MB/step, and the last prefill / decode rows of a model_cpu_bench run"""
    try:
        text = open(path).read()
    except OSError:
        return {}
    r = {}
    if m := re.search(r"copy bandwidth[^:]*:\s*([\d.]+) GB/s", text): r["bw"] = float(m[1])
    if m := re.search(r"weight bytes read per decode step:\s*([\d.]+) MB", text): r["wmb"] = float(m[1])
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0] == "prefill": r["prefill"] = float(f[4])
        if len(f) >= 7 and f[0] == "decode":
            r["decode"] = float(f[4])
            r["floor_ms"] = float(f[5]) if f[5] != "-" else None
    return r

def llama_ts(path):
    try:
        return float(json.load(open(path))[0]["avg_ts"])
    except (OSError, ValueError, IndexError, KeyError):
        return None

def llama_commit():
    for path in sorted(os.listdir(out)):
        if path.endswith(".json"):
            try:
                return json.load(open(f"{out}/{path}"))[0].get("build_commit")
            except (OSError, ValueError, IndexError, KeyError):
                pass
    return None

def max_rss_mb(path):
    try:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(path).read())
        return int(m[1]) / 1024 if m else None
    except OSError:
        return None

try:
    load = [float(x) for x in open(f"{out}/loadavg.txt").read().split()]
    load = f"{min(load):.1f}-{max(load):.1f}"
except (OSError, ValueError):
    load = "?"
print(f"decode: {decode} tokens after a {prompt}-token prompt, batch 1; prefill: {prompt} tokens")
print(f"llama.cpp build {llama_commit()}; medians of {reps} interleaved runs; "
      f"1-min load average at the start of a rep: {load}\n")
print("| model | phase | kvpool tok/s | llama.cpp tok/s | kvpool / llama.cpp | copy GB/s "
      "| kvpool floor tok/s | kvpool / floor | runs |")
print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
mem = []
for path in models:
    name = os.path.basename(path)[:-len(".gguf")]
    runs = [kvpool_run(f"{out}/{name}.kvpool.{r}.txt") for r in range(1, reps + 1)]
    bw, _ = med([x.get("bw") for x in runs])
    floor_ms, _ = med([x.get("floor_ms") for x in runs])
    floor_ts = 1000 / floor_ms if floor_ms else None
    for phase in ("decode", "prefill"):
        kv, nk = med([x.get(phase) for x in runs])
        ll, nl = med([llama_ts(f"{out}/{name}.llama.{phase}.{r}.json") for r in range(1, reps + 1)])
        ratio = kv / ll if kv and ll else None
        fl = floor_ts if phase == "decode" else None
        of_floor = kv / fl if kv and fl else None
        print(f"| {name} | {phase} | {fmt(kv)} | {fmt(ll)} | {fmt(ratio, '.2f')} | {fmt(bw)} | "
              f"{fmt(fl) if fl else '–'} | {fmt(of_floor, '.2f') if fl else '–'} | {nk} / {nl} |")
    wmb, _ = med([x.get("wmb") for x in runs])
    llama_rss, _ = med([max_rss_mb(f"{out}/{name}.llama.decode.{r}.time") for r in range(1, reps + 1)])
    mem.append((name, os.path.getsize(path) / 2**20, wmb, max_rss_mb(f"{out}/{name}.kvpool.rss.time"), llama_rss))

print()
print("| model | file MiB | kvpool weight MB read per decode step | kvpool peak RSS MiB | llama.cpp peak RSS MiB |")
print("|---|--:|--:|--:|--:|")
for name, size, wmb, kv_rss, ll_rss in mem:
    print(f"| {name} | {size:.0f} | {fmt(wmb)} | {fmt(kv_rss, '.0f')} | {fmt(ll_rss, '.0f')} |")
EOF
echo "raw outputs: $out" >&2
