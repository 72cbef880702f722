"""Every error is an OpenAI error object with the right status, naming the parameter."""
import json

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Hi"}]


def error_of(server, body, path="/v1/chat/completions", **kw):
    status, headers, text = server.request("POST", path, body, **kw)
    return status, headers, json.loads(text)["error"]


def test_malformed_json_is_400(server):
    status, _, error = error_of(server, None, raw=b'{"messages": [')
    assert status == 400 and "not valid JSON" in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("field,value,why", [
    ("temperature", "hot", "must be a number"),
    ("temperature", 7, "must be in"),
    ("top_p", 1.5, "must be in"),
    ("max_tokens", 0, "must be in"),
    ("max_tokens", 1.5, "must be an integer"),
    ("n", 100, "must be in"),
    ("stop", 5, "string or a list"),
    ("top_logprobs", 3, "needs 'logprobs'"),
    ("messages", [], "non-empty list"),
    ("messages", [{"role": "wizard", "content": "x"}], "is not one of"),
    ("session_id", "../etc/passwd", "starts with '.'"),
    ("session_id", "a/../../etc", "outside [A-Za-z0-9_.-]"),
])
def test_wrong_types_and_ranges_are_400_naming_the_param(server, field, value, why):
    body = {"messages": MESSAGES, "max_tokens": 2, field: value}
    status, _, error = error_of(server, body)
    assert status == 400, error
    assert error["param"] == field and why in error["message"], error


def test_openai_client_raises_bad_request(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="m", messages=MESSAGES, temperature=-1)
    assert e.value.body["param"] == "temperature"


def test_prompt_over_the_context_names_both_numbers(server):
    long_text = "hello " * 9000
    status, _, error = error_of(server, {"prompt": long_text, "max_tokens": 4},
                                path="/v1/completions")
    assert status == 400, error
    import re
    assert "8192" in error["message"] and re.search(r"\b9\d\d\d\b", error["message"]), error


def test_unknown_route_and_session_are_404(server):
    status, _, text = server.request("GET", "/v1/nothing")
    assert status == 404 and json.loads(text)["error"]["type"] == "not_found_error"
    status, body = server.json("GET", "/v1/sessions/never-made")
    assert status == 404 and "never-made" in body["error"]["message"]


def test_body_over_the_limit_is_413(start_server):
    s = start_server("--max-body", "4KiB")
    status, _, error = error_of(s, {"messages": [{"role": "user", "content": "x" * 8000}]})
    assert status == 413 and "4096" in error["message"]


def test_queue_full_is_429_with_retry_after(start_server):
    import http.client
    s = start_server("--max-seqs", "1", "--max-queue", "0")
    # a stream that holds the one place in flight (its first event read: it is running)
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions",
                 json.dumps({"prompt": "Once upon a time", "max_tokens": 400,
                             "ignore_eos": True, "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    while not resp.readline().startswith(b"data: "):  # pings until the first token
        pass
    try:
        status, headers, text = s.request("POST", "/v1/completions",
                                          {"prompt": "Hi", "max_tokens": 1})
        assert status == 429, text
        assert headers.get("Retry-After") == "1"
        assert json.loads(text)["error"]["type"] == "rate_limit_error"
    finally:
        conn.close()


def test_api_key_guards_every_endpoint_but_health(start_server, tmp_path):
    s = start_server("--api-key", "secret-key-1")
    assert s.json("GET", "/health")[0] == 200
    for path in ["/v1/models", "/metrics", "/v1/sessions"]:
        assert s.request("GET", path)[0] == 401
        assert s.request("GET", path, headers={"Authorization": "Bearer wrong-key"})[0] == 401
        assert s.request("GET", path, headers={"Authorization": "Bearer secret-key-1"})[0] == 200
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="nope").models.list()
    assert s.client(api_key="secret-key-1").models.list().data


def test_shutting_down_answers_503(start_server):
    import signal
    import threading
    import time
    s = start_server("--grace", "30")
    long = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}
    t = threading.Thread(target=s.request, args=("POST", "/v1/completions", long))
    t.start()
    time.sleep(0.5)
    s.proc.send_signal(signal.SIGTERM)
    status = None
    for _ in range(100):
        status, headers, text = s.request("POST", "/v1/completions",
                                          {"prompt": "Hi", "max_tokens": 1})
        if status == 503:
            break
        time.sleep(0.05)
    assert status == 503, text
    t.join()
    assert s.stop() == 0
