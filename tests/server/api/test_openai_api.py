"""The OpenAI wire format, through the real `openai` client where it fits."""
import json

from conftest import sse_events

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_health_and_models(server):
    assert server.json("GET", "/health") == (200, {"status": "ok"})
    models = server.client().models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_chat_completion_answers_with_usage(server):
    r = server.client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=24,
                                                temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_prompt_tokens_equal_tokenize_of_the_messages(server):
    r = server.client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    status, tok = server.json("POST", "/tokenize", {"messages": MESSAGES})
    assert status == 200
    assert tok["count"] == r.usage.prompt_tokens == len(tok["tokens"])
    status, text = server.json("POST", "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and "What is the capital of France?" in text["prompt"]


def test_streamed_chat_equals_the_whole_reply_and_ends_with_done(server):
    client = server.client()
    whole = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24,
                                           temperature=0)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens
    events = sse_events(server, "/v1/chat/completions",
                        {"messages": MESSAGES, "max_tokens": 8, "stream": True})
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


def test_completions_streamed_and_not(server):
    client = server.client()
    r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    chunks = list(client.completions.create(model="m", prompt="The capital of France is",
                                             max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    ids = client.completions.create(model="m", prompt=[504, 3575, 282], max_tokens=2)
    assert ids.usage.prompt_tokens == 3


def test_n_2_gives_two_choices(server):
    r = server.client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, n=2,
                                                temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content is not None for c in r.choices)
    events = sse_events(server, "/v1/chat/completions",
                        {"messages": MESSAGES, "max_tokens": 4, "n": 2, "stream": True})
    assert {e["choices"][0]["index"] for e in events[:-1]} == {0, 1}


def test_stop_string_ends_the_text_before_it(server):
    client = server.client()
    full = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24,
                                          temperature=0).choices[0].message.content
    assert "Paris" in full
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24,
                                       temperature=0, stop=["Paris"])
    assert r.choices[0].message.content == full[:full.index("Paris")]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=24,
                                                 temperature=0, stop="Paris", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        full[:full.index("Paris")]


def test_seed_reproduces_a_sampled_reply(server):
    client = server.client()
    args = dict(model="m", messages=MESSAGES, max_tokens=16, temperature=1.2, top_p=0.95,
                seed=1234)
    a = client.chat.completions.create(**args).choices[0].message.content
    b = client.chat.completions.create(**args).choices[0].message.content
    assert a == b


def test_logprobs_and_top_logprobs(server):
    r = server.client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=6,
                                                temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert abs(entry.logprob - entry.top_logprobs[0].logprob) < 1e-4
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob <= 0
    c = server.client().completions.create(model="m", prompt="Hello", max_tokens=4, logprobs=2,
                                           temperature=0)
    assert len(c.choices[0].logprobs.token_logprobs) == 4
    assert all(len(t) <= 2 for t in c.choices[0].logprobs.top_logprobs)


def test_metrics_parse_with_prometheus_client(server):
    server.client().chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    m = server.metrics()
    assert m["kvpool:generation_tokens_total"] >= 2
    assert m["kvpool:time_to_first_token_seconds_count"] >= 1
    assert m["kvpool:kv_cache_blocks_total"] > 0
    assert 'kvpool:sessions{tier="device"}' in m
    assert m["kvpool:tier_copies_out_not_waited_total"] == 0  # no tier, and the CPU copies at once
