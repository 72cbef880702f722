#!/usr/bin/env python3
"""Serving comparison (issue 13): `kvpool serve` against llama.cpp's `llama-server`.

Same GGUF, same threads, the same KV bytes, both on 127.0.0.1, one server at a time, driven by
this one client (http.client in threads; streaming /v1/chat/completions, temperature 0,
`ignore_eos` and a fixed max_tokens so that both servers produce exactly the same number of
tokens per request). Two workloads:

  agents   A agents x T turns, a shared system prompt of ~1K tokens; each turn sends the whole
           conversation (previous replies and a new user message of ~U tokens). At most C agents
           have a request in flight (closed loop), the others wait their turn. kvpool gets
           "session_id": "agent-N" (its KV stays in the pool between turns, docs/server.md);
           llama-server gets "cache_prompt": true (its slots keep their last prompt's KV and a
           request goes to the slot whose prompt shares the most).
  poisson  N independent requests (a ~P-token prompt each, no shared prefix beyond the chat
           template) arriving as a Poisson process at R requests/s, open loop.
  closed   N streamed /v1/completions whose prompts are random token ids (uniform length in
           [--prompt-ids-min, --prompt-ids-max], or the lengths of a `kvpool bench --csv` run:
           --prompt-lengths-csv), C clients each sending its next request when its last one ends: the load of `kvpool bench --workload closed`, so that the server can
           be compared with the engine in-process (scripts/gpu/server-bench.sh on the H100,
           with --kvpool-args naming a random-weight model shape and its filler tokenizer).

Reported per server and workload: requests done / failed, output tokens, total time, output
tok/s (output tokens / time from the first request to the last answer), TTFT p50 / p95 (request
sent -> first content token), ITL p50, prompt tokens and cached prompt tokens (kvpool:
usage.prompt_tokens_details.cached_tokens; llama-server: timings.cache_n), and the server's
peak RSS (VmHWM).

KV memory, matched: llama-server `-c SLOTS*SLOT_CTX --parallel SLOTS -ctk f16 -ctv f16` (SLOTS
slots of SLOT_CTX tokens, no unified KV) against kvpool `--kv-dtype f16 --block-size 16
--blocks SLOTS*SLOT_CTX/16 --max-seqs SLOTS`: the same tokens of f16 KV, the same number of
sequences decoding at once. llama-server's RAM prompt cache (--cache-ram, default 8 GiB there)
and kvpool's host tier (--host-tier-bytes) are both given --host-cache-mib (default 0: off on
both, so that neither keeps KV beyond the matched pool).

Bounds: a request is abandoned after 300 s (counted as failed); each workload stops issuing
new requests after --time-limit seconds (default 420). At the defaults (32 agents x 8 turns of
32 tokens, 48 Poisson requests at 0.5/s) a fast server takes a few minutes per workload on the
2-core machine; a slow one is cut off by the time limit (compare requests done, not only tok/s).
Scale down with --agents / --turns / --poisson-requests / --rate and say so.

Run from the repository root (kvpool built, llama-server built as bench/cpu/compare_llamacpp.sh
or /work/shared/PEERS.md says, with `--target llama-server`):
    .venv/bin/python bench/server/compare_llama_server.py \
        --llama-server /work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server \
        --out build/compare-server
    # --servers kvpool | llama to run one; --workloads agents | poisson to run one
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

REQUEST_TIMEOUT_S = 300
TOKENS_PER_WORD = 1.3

# --- prompts ------------------------------------------------------------------------------------

WORDS = ("the of and to in is for on that with as was by it at from this be are an or have "
         "which not but they his her one all were we when there can more if out so what up "
         "about into them some could time only other new than then now look these two may "
         "first way been call who its water long down day did get come made part over sound "
         "take place year live back give most very after thing our just name good sentence man "
         "think say great where help through much before line right too mean old any same tell "
         "boy follow came want show also around form three small set put end does another well "
         "large must big even such because turn here why ask went men read need land different "
         "home us move try kind hand picture again change off play spell air away animal house "
         "point page letter mother answer found study still learn should world high every near "
         "add food between own below country plant last school father keep tree never start city "
         "earth eye light thought head under story saw left few while along might close something "
         "seem next hard open example begin life always those both paper together got group often "
         "run important until children side feet car mile night walk white sea began grow took "
         "river four carry state once book hear stop without second later miss idea enough eat "
         "face watch far really almost let above girl sometimes mountain cut young talk soon list "
         "song being leave family").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompt(tokens: int) -> str:
    # ~1.3 tokens per word for these words (SmolLM2's tokenizer, measured); the usage of the
    # first turn reports the real count
    rng = random.Random(1234)
    return ("You are a careful assistant. Background notes follow. " +
            words(rng, int(tokens / TOKENS_PER_WORD)))


# --- one streamed request -----------------------------------------------------------------------

@dataclass
class Result:
    workload: str
    tag: str
    ok: bool = False
    error: str = ""
    sent: float = 0.0          # monotonic seconds
    first_token: float = 0.0
    done: float = 0.0
    output_tokens: int = 0     # content chunks counted
    usage_output_tokens: int = -1
    prompt_tokens: int = -1
    cached_tokens: int = -1
    text: str = ""
    token_times: list = field(default_factory=list)


def stream_request(port: int, body: dict, res: Result,
                   path: str = "/v1/chat/completions") -> Result:
    """POST a streaming chat completion (or completion); fill res with times, text and usage."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    res.sent = time.monotonic()
    try:
        conn.request("POST", path, json.dumps(body),
                     {"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return res
        parts = []
        for raw in resp:  # SSE: one "data: {...}" line per event, blank lines between
            now = time.monotonic()
            if now - res.sent > REQUEST_TIMEOUT_S:  # SSE pings keep the socket busy: bound it here
                res.error = f"over {REQUEST_TIMEOUT_S} s"
                break
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                res.ok = True
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content") or choice.get("text")
                if content:
                    if not res.first_token:
                        res.first_token = now
                    res.output_tokens += 1
                    res.token_times.append(now)
                    parts.append(content)
            usage = chunk.get("usage")
            if usage:
                res.usage_output_tokens = usage.get("completion_tokens", -1)
                res.prompt_tokens = usage.get("prompt_tokens", -1)
                details = usage.get("prompt_tokens_details") or {}
                if "cached_tokens" in details:
                    res.cached_tokens = details["cached_tokens"]
            timings = chunk.get("timings")  # llama-server
            if timings and "cache_n" in timings:
                res.cached_tokens = timings["cache_n"]
        res.text = "".join(parts)
        if not res.ok and not res.error:
            res.error = "stream ended without [DONE]"
    except Exception as e:  # noqa: BLE001 - a benchmark records the failure and goes on
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.done = time.monotonic()
        conn.close()
    return res


def request_body(server: str, messages: list | None, max_tokens: int, session: str | None,
                 prompt_ids: list | None = None) -> dict:
    body = {"model": "m", "stream": True, "temperature": 0,
            "max_tokens": max_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    if prompt_ids is not None:
        body["prompt"] = prompt_ids
    else:
        body["messages"] = messages
    if server == "kvpool" and session:
        body["session_id"] = session
    if server == "llama":
        body["cache_prompt"] = True
    return body


# --- workloads ----------------------------------------------------------------------------------

def run_agents(server: str, port: int, a) -> list[Result]:
    system = system_prompt(a.system_tokens)
    gate = threading.Semaphore(a.concurrency)
    deadline = time.monotonic() + a.time_limit
    results: list[Result] = []
    lock = threading.Lock()

    def agent(i: int) -> None:
        rng = random.Random(1000 + i)
        messages = [{"role": "system", "content": system}]
        for t in range(a.turns):
            messages.append({"role": "user", "content": f"Agent {i}, turn {t}: " +
                             words(rng, int(a.user_tokens / TOKENS_PER_WORD))})
            with gate:
                if time.monotonic() > deadline:
                    return
                r = stream_request(port, request_body(server, messages, a.max_tokens, f"agent-{i}"),
                                Result("agents", f"agent-{i}/turn-{t}"))
            with lock:
                results.append(r)
            if not r.ok:
                return
            messages.append({"role": "assistant", "content": r.text})

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(a.agents)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


def run_poisson(server: str, port: int, a) -> list[Result]:
    rng = random.Random(7)
    results: list[Result] = []
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + a.time_limit
    threads = []
    t_next = start
    for n in range(a.poisson_requests):
        t_next += rng.expovariate(a.rate)
        if t_next > deadline:
            break
        time.sleep(max(0.0, t_next - time.monotonic()))
        messages = [{"role": "user", "content": f"Request {n}: " +
                     words(rng, int(a.poisson_prompt_tokens / TOKENS_PER_WORD))}]

        def one(messages=messages, n=n):
            r = stream_request(port, request_body(server, messages, a.max_tokens, None),
                            Result("poisson", f"req-{n}"))
            with lock:
                results.append(r)

        th = threading.Thread(target=one)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return results


CLOSED_RUNS = [0]  # closed runs so far: each draws other token ids (no prefix-cache hit on a rerun)


def prompt_lengths(a, rng: random.Random) -> list[int]:
    """--prompt-lengths-csv's prompt_tokens column (a `kvpool bench --csv` file: the same prompt
    lengths as that run, in request order), else --closed-requests uniform lengths."""
    if a.prompt_lengths_csv:
        with open(a.prompt_lengths_csv) as f:
            header = f.readline().strip().split(",")
            col = header.index("prompt_tokens")
            rows = [line.strip().split(",") for line in f if line.strip()]
        rows.sort(key=lambda r: int(r[0]))  # request_id
        return [int(r[col]) for r in rows]
    return [rng.randint(a.prompt_ids_min, a.prompt_ids_max) for _ in range(a.closed_requests)]


def run_closed(server: str, port: int, a) -> list[Result]:
    rng = random.Random(11 + CLOSED_RUNS[0])
    CLOSED_RUNS[0] += 1
    prompts = [[rng.randrange(1000, 30000) for _ in range(n)] for n in prompt_lengths(a, rng)]
    results: list[Result] = []
    lock = threading.Lock()
    deadline = time.monotonic() + a.time_limit
    todo = list(range(len(prompts)))

    def client() -> None:
        while True:
            with lock:
                if not todo or time.monotonic() > deadline:
                    return
                n = todo.pop(0)
            r = stream_request(port, request_body(server, None, a.max_tokens, None, prompts[n]),
                               Result("closed", f"req-{n}"), path="/v1/completions")
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client) for _ in range(a.concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


WORKLOADS = {"agents": run_agents, "poisson": run_poisson, "closed": run_closed}


# --- servers --------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(server: str, a, port: int) -> list[str]:
    kv_tokens = a.slots * a.slot_ctx
    if server == "kvpool" and a.kvpool_args:
        return [a.kvpool, "serve", *shlex.split(a.kvpool_args), "--host", "127.0.0.1",
                "--port", str(port), "--quiet"]
    if server == "kvpool":
        cmd = [a.kvpool, "serve", "--model", a.model, "--threads", str(a.threads),
               "--host", "127.0.0.1", "--port", str(port), "--kv-dtype", "f16",
               "--block-size", "16", "--blocks", str(kv_tokens // 16),
               "--max-seqs", str(a.slots), "--quiet"]
        if a.host_cache_mib:
            cmd += ["--host-tier-bytes", f"{a.host_cache_mib}MiB"]
        return cmd
    return [a.llama_server, "-m", a.model, "-t", str(a.threads), "-tb", str(a.threads),
            "--host", "127.0.0.1", "--port", str(port), "-c", str(kv_tokens),
            "--parallel", str(a.slots), "--no-kv-unified", "-ctk", "f16", "-ctv", "f16",
            "--cache-ram", str(a.host_cache_mib), "--no-webui"]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not healthy in time")


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# --- report -----------------------------------------------------------------------------------------

def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(server: str, workload: str, results: list[Result], rss: float | None) -> dict:
    ok = [r for r in results if r.ok]
    t0 = min((r.sent for r in results), default=0.0)
    t1 = max((r.done for r in results), default=0.0)
    out_tokens = sum(r.usage_output_tokens if r.usage_output_tokens >= 0 else r.output_tokens
                     for r in ok)
    ttft = [r.first_token - r.sent for r in ok if r.first_token]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:])]
    return {
        "server": server, "workload": workload, "requests": len(ok),
        "failed": len(results) - len(ok), "output_tokens": out_tokens,
        "total_s": t1 - t0, "output_tok_s": out_tokens / (t1 - t0) if t1 > t0 else 0.0,
        "ttft_p50_ms": 1e3 * (pct(ttft, 0.5) or 0), "ttft_p95_ms": 1e3 * (pct(ttft, 0.95) or 0),
        "itl_p50_ms": 1e3 * (pct(itl, 0.5) or 0),
        "prompt_tokens": sum(max(r.prompt_tokens, 0) for r in ok),
        "cached_tokens": sum(max(r.cached_tokens, 0) for r in ok),
        "peak_rss_mib": rss,
        "errors": sorted({r.error for r in results if not r.ok})[:3],
    }


def table(rows: list[dict]) -> str:
    lines = ["| workload | server | requests ok / failed | output tokens | total s | output tok/s "
             "| TTFT p50 ms | TTFT p95 ms | ITL p50 ms | prompt tokens (cached) | peak RSS MiB |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        rss = f"{r['peak_rss_mib']:.0f}" if r["peak_rss_mib"] else "?"
        lines.append(
            f"| {r['workload']} | {r['server']} | {r['requests']} / {r['failed']} | "
            f"{r['output_tokens']} | {r['total_s']:.1f} | {r['output_tok_s']:.1f} | "
            f"{r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} | {r['itl_p50_ms']:.1f} | "
            f"{r['prompt_tokens']} ({r['cached_tokens']}) | {rss} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--kvpool", default="build/release/apps/kvpool")
    ap.add_argument("--llama-server", default="build/peers/llama_cpp_python-0.3.36/vendor/"
                    "llama.cpp/build/bin/llama-server")
    ap.add_argument("--servers", default="kvpool,llama", help="kvpool, llama, in this order")
    ap.add_argument("--workloads", default="agents,poisson")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8,
                    help="llama-server --parallel; kvpool --max-seqs; agents in flight at once")
    ap.add_argument("--slot-ctx", type=int, default=2048,
                    help="tokens of KV per llama-server slot; both servers get slots*slot_ctx")
    ap.add_argument("--host-cache-mib", type=int, default=0,
                    help="llama-server --cache-ram and kvpool --host-tier-bytes (0: off)")
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--user-tokens", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=None,
                    help="agents with a request in flight (default: --slots)")
    ap.add_argument("--rate", type=float, default=0.5, help="poisson: requests per second")
    ap.add_argument("--poisson-requests", type=int, default=48)
    ap.add_argument("--poisson-prompt-tokens", type=int, default=256)
    ap.add_argument("--closed-requests", type=int, default=64, help="closed: requests")
    ap.add_argument("--prompt-ids-min", type=int, default=256, help="closed: prompt ids from")
    ap.add_argument("--prompt-ids-max", type=int, default=1024, help="closed: prompt ids to")
    ap.add_argument("--prompt-lengths-csv", default="",
                    help="closed: the prompt lengths of a `kvpool bench --csv` run instead")
    ap.add_argument("--kvpool-args", default="",
                    help="kvpool serve's model, device and pool options instead of the matched "
                         "ones (e.g. '--random-model llama3-8b --tokenizer DIR --device cuda')")
    ap.add_argument("--time-limit", type=float, default=420,
                    help="seconds per workload after which no new request is sent")
    ap.add_argument("--out", default="build/compare-server")
    a = ap.parse_args()
    a.concurrency = a.concurrency or a.slots
    os.makedirs(a.out, exist_ok=True)

    rows = []
    for server in a.servers.split(","):
        port = free_port()
        cmd = server_command(server, a, port)
        log = open(os.path.join(a.out, f"{server}.log"), "w")
        print(f"== {server}: {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(port, proc, 180)
            for workload in a.workloads.split(","):
                print(f"   {workload} ...", flush=True)
                results = WORKLOADS[workload](server, port, a)
                row = summarize(server, workload, results, peak_rss_mib(proc.pid))
                rows.append(row)
                print(f"   {json.dumps(row)}", flush=True)
                with open(os.path.join(a.out, f"{server}.{workload}.jsonl"), "w") as f:
                    for r in results:
                        d = asdict(r)
                        d.pop("token_times")
                        f.write(json.dumps(d) + "\n")
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()

    closed = (f"closed {a.closed_requests} requests of {a.prompt_ids_min}-{a.prompt_ids_max} "
              f"prompt ids" if not a.prompt_lengths_csv else
              f"closed: the prompt lengths of {a.prompt_lengths_csv}") + \
        f", {a.max_tokens} output tokens, {a.concurrency} clients"
    if a.kvpool_args:
        header = f"kvpool serve {a.kvpool_args}; {closed}"
    else:
        header = (f"model {a.model}; threads {a.threads}; KV: {a.slots} slots x {a.slot_ctx} "
                  f"tokens f16 ({a.slots * a.slot_ctx} tokens), host cache {a.host_cache_mib} MiB; "
                  f"agents {a.agents} x {a.turns} turns, system ~{a.system_tokens} tokens, user ~"
                  f"{a.user_tokens}, {a.max_tokens} output tokens, {a.concurrency} in flight; "
                  f"poisson {a.poisson_requests} requests at {a.rate}/s, prompt "
                  f"~{a.poisson_prompt_tokens}; {closed}")
    text = header + "\n\n" + table(rows)
    print("\n" + text)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text + "\n")
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
