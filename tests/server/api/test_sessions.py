"""Sessions: an agent's KV stays between turns; edits, keys, disconnects and restarts."""
import http.client
import json
import signal
import time

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}


def chat(client, messages, session=None, **kw):
    extra = {"session_id": session} if session else None
    return client.chat.completions.create(model="m", messages=messages, max_tokens=12,
                                          temperature=0, extra_body=extra, **kw)


def test_second_turn_reports_the_first_as_cached_and_metrics_show_it(server):
    client = server.client()
    before = server.metrics().get("kvpool:session_hit_tokens_total", 0)
    turn1 = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    r1 = chat(client, turn1, session="agent-1")
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "Name another."}]
    r2 = chat(client, turn2, session="agent-1")
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens, (cached, r1.usage.prompt_tokens)
    assert r2.usage.prompt_tokens > cached
    # the same answer as without a session
    assert r2.choices[0].message.content == chat(client, turn2).choices[0].message.content
    after = server.metrics()
    assert after["kvpool:session_hit_tokens_total"] - before >= cached
    status, info = server.json("GET", "/v1/sessions/agent-1")
    assert status == 200 and info["tokens"] >= r2.usage.prompt_tokens and info["turns"] == 2
    listed = server.json("GET", "/v1/sessions")[1]["data"]
    assert "agent-1" in [s["id"] for s in listed]
    # the header names a session as well
    r3 = client.chat.completions.create(
        model="m", max_tokens=4, temperature=0, extra_headers={"X-Session-Id": "agent-1"},
        messages=turn2 + [{"role": "assistant", "content": r2.choices[0].message.content},
                          {"role": "user", "content": "Thanks."}])
    assert r3.usage.prompt_tokens_details.cached_tokens >= r2.usage.prompt_tokens
    assert server.json("DELETE", "/v1/sessions/agent-1")[0] == 200
    assert server.json("GET", "/v1/sessions/agent-1")[0] == 404


def test_an_edited_history_is_answered_as_if_new(server):
    client = server.client()
    turn1 = [SYSTEM, {"role": "user", "content": "What is 2 + 2?"}]
    r1 = chat(client, turn1, session="editor")
    edited = [SYSTEM, {"role": "user", "content": "What is the capital of Italy?"},
              {"role": "assistant", "content": "Rome."},
              {"role": "user", "content": "And of Spain?"}]
    r2 = chat(client, edited, session="editor")
    assert r2.choices[0].message.content == chat(client, edited).choices[0].message.content
    assert r2.usage.prompt_tokens_details.cached_tokens < r1.usage.prompt_tokens


def test_sessions_are_isolated_between_keys(start_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("key-alice-0001\nkey-bob-00002\n")
    s = start_server("--api-key-file", keys)
    alice = {"Authorization": "Bearer key-alice-0001"}
    bob = {"Authorization": "Bearer key-bob-00002"}
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "session_id": "shared-name"}
    assert s.json("POST", "/v1/chat/completions", body, headers=alice)[0] == 200
    assert s.json("GET", "/v1/sessions/shared-name", headers=alice)[0] == 200
    assert s.json("GET", "/v1/sessions/shared-name", headers=bob)[0] == 404
    assert s.json("DELETE", "/v1/sessions/shared-name", headers=bob)[0] == 404
    assert s.json("GET", "/v1/sessions", headers=bob)[1]["data"] == []
    # bob's own session of that name is another one
    assert s.json("POST", "/v1/chat/completions", body, headers=bob)[0] == 200
    assert s.json("GET", "/v1/sessions/shared-name", headers=bob)[1]["turns"] == 1
    assert s.json("GET", "/v1/sessions/shared-name", headers=alice)[1]["turns"] == 1


def test_a_disconnect_mid_stream_cancels_and_frees_the_blocks(server):
    baseline = server.metrics()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions",
                 json.dumps({"prompt": "Once upon a time", "max_tokens": 2000,
                             "ignore_eos": True, "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(3):
        assert resp.fp.readline()
    conn.sock.close()
    conn.close()
    aborted = 'kvpool:request_success_total{finished_reason="abort"}'
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m.get(aborted, 0) > baseline.get(aborted, 0) and \
                m["kvpool:kv_cache_blocks_used"] <= baseline["kvpool:kv_cache_blocks_used"]:
            break
        time.sleep(0.2)
    assert m.get(aborted, 0) == baseline.get(aborted, 0) + 1
    assert m["kvpool:kv_cache_blocks_used"] <= baseline["kvpool:kv_cache_blocks_used"]


def test_sigterm_saves_sessions_that_continue_identically_after_restart(start_server, tmp_path):
    folder = tmp_path / "sessions"
    s = start_server("--session-dir", folder)
    client = s.client()
    turn1 = [SYSTEM, {"role": "user", "content": "Tell me about cats."}]
    r1 = chat(client, turn1, session="keeper")
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And dogs?"}]
    assert s.stop() == 0
    assert "saved 1 session(s)" in s.output()
    assert list(folder.glob("*/keeper.kvc"))
    s2 = start_server("--session-dir", folder)
    status, info = s2.json("GET", "/v1/sessions/keeper")
    assert status == 200 and info["tier"] == "disk", info
    r2 = chat(s2.client(), turn2, session="keeper")
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens
    assert r2.choices[0].message.content == chat(s2.client(), turn2).choices[0].message.content


def test_save_and_load_through_the_api(start_server, tmp_path):
    s = start_server("--session-dir", tmp_path / "dir")
    client = s.client()
    r1 = chat(client, [{"role": "user", "content": "Hello"}], session="snap")
    status, saved = s.json("POST", "/v1/sessions/snap/save")
    assert status == 200 and saved["saved"]
    assert s.json("DELETE", "/v1/sessions/snap")[0] == 200
    status, loaded = s.json("POST", "/v1/sessions/snap/load")
    assert status == 200 and loaded["tier"] == "disk"
    assert loaded["tokens"] >= r1.usage.prompt_tokens
    assert s.json("POST", "/v1/sessions/other/load")[0] == 404
