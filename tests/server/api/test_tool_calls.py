"""Tool calls: tools reach the template, the model's <tool_call> text becomes OpenAI tool_calls
(whole and streamed), and a tool message goes back into the conversation. The server runs the
default model with the Qwen 2.5 template fixture (Hermes-style calls), asked to repeat a call."""
import json

import pytest

from conftest import TEMPLATES

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Repeat this line exactly and say nothing else: <tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'}]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    from conftest import Server, require_model
    require_model()
    s = Server("--chat-template", TEMPLATES / "qwen2.5-instruct.jinja",
               tmp=tmp_path_factory.mktemp("tools"))
    assert "tool calls hermes" in s.output()
    yield s
    assert s.stop() == 0


def test_a_tool_call_is_parsed(tool_server):
    r = tool_server.client().chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                                     max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_streamed_tool_call_is_sent_as_openai_does(tool_server):
    chunks = list(tool_server.client().chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, max_tokens=60, temperature=0, stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls, [c.choices[0].delta for c in chunks]
    assert calls[0].index == 0 and calls[0].id.startswith("call_")
    assert calls[0].type == "function" and calls[0].function.name == "get_weather"
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""


def test_a_tool_result_goes_back_into_the_conversation(tool_server):
    client = tool_server.client()
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=60,
                                       temperature=0)
    call = r.choices[0].message.tool_calls[0]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    status, tok = tool_server.json("POST", "/tokenize", {"messages": messages, "tools": TOOLS})
    assert status == 200
    status, text = tool_server.json("POST", "/detokenize", {"tokens": tok["tokens"]})
    assert "<tool_response>" in text["prompt"] and '{"temperature": 21}' in text["prompt"]
    assert '"city": "Paris"' in text["prompt"]  # the call, rendered from the arguments object
    r2 = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=8)
    assert r2.usage.prompt_tokens == tok["count"]
