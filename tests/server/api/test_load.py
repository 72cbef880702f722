"""A bounded load test: 64 concurrent streaming agents x 4 turns with sessions on the default
model, then twice the server's capacity at once. Bounded in count and time; localhost only."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import sse_events

NUM_AGENTS = 64
NUM_TURNS = 4
TIME_LIMIT_S = 120


def agent(server, index, errors, counts):
    messages = [{"role": "system", "content": "You are a terse assistant."}]
    try:
        for turn in range(NUM_TURNS):
            messages.append({"role": "user", "content": f"Agent {index}, turn {turn}: say a word."})
            events = sse_events(server, "/v1/chat/completions",
                                {"messages": messages, "max_tokens": 8, "temperature": 0.7,
                                 "seed": index * 10 + turn, "stream": True,
                                 "stream_options": {"include_usage": True},
                                 "session_id": f"agent-{index}"})
            assert events[-1] == "[DONE]", events[-3:]
            usage = events[-2]["usage"]
            token_chunks = [e for e in events[:-2] if e["choices"][0]["finish_reason"] is None]
            assert len(token_chunks) == usage["completion_tokens"], (len(token_chunks), usage)
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-2])
            messages.append({"role": "assistant", "content": text})
            counts.append(usage["completion_tokens"])
    except Exception as e:  # noqa: BLE001 - every failure is reported below
        errors.append(f"agent {index}: {e!r}")


def test_64_streaming_agents_then_twice_the_capacity(start_server):
    s = start_server("--max-seqs", "32", "--max-queue", "32", "--quiet")
    errors, counts = [], []
    start = time.time()
    threads = [threading.Thread(target=agent, args=(s, i, errors, counts))
               for i in range(NUM_AGENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIME_LIMIT_S)
    elapsed = time.time() - start
    assert not any(t.is_alive() for t in threads), "agents still running after the time limit"
    assert errors == [], errors[:5]
    assert len(counts) == NUM_AGENTS * NUM_TURNS
    print(f"{NUM_AGENTS} agents x {NUM_TURNS} turns: {sum(counts)} tokens in {elapsed:.1f} s")

    # 2x overload: 128 requests at once against a capacity of 64 in flight
    body = {"prompt": "Once upon a time", "max_tokens": 32, "ignore_eos": True}
    with ThreadPoolExecutor(128) as pool:
        statuses = list(pool.map(lambda _: s.request("POST", "/v1/completions", body,
                                                     timeout=TIME_LIMIT_S), range(128)))
    codes = [st for st, _, _ in statuses]
    assert set(codes) <= {200, 429}, codes
    assert codes.count(429) > 0 and codes.count(200) >= 64 - 8, codes
    assert all(h.get("Retry-After") for st, h, _ in statuses if st == 429)

    # no block leaked: with every session deleted the pool holds nothing
    for i in range(NUM_AGENTS):
        assert s.json("DELETE", f"/v1/sessions/agent-{i}")[0] == 200
    m = s.metrics()
    assert m["kvpool:kv_cache_blocks_used"] == 0, m["kvpool:kv_cache_blocks_used"]
    assert m["kvpool:num_requests_running"] == 0 and m["kvpool:num_requests_waiting"] == 0
