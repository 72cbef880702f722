#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (fuzz/corpus/<target>/) from the real models in models/ and
the fixtures in tests/, each seed small (the whole folder stays well under 2 MB):

  gguf/            the real models' metadata with their arrays cut to the first few hundred
                   tokens and merges, one short tensor of every ggml type each model uses (raw
                   bytes of its first rows); once as is, once with a tiny model's dimensions
  safetensors/     the tiny fixtures' headers with their tensors cut to a few elements
  config/          the tiny fixtures' and the cache planner's config.json files
  tokenizer_json/  tokenizer.json files of the two real tokenizers, vocabularies cut (built with
                   the `tokenizers` package, as tests/tokenizer/hf_reference.py builds them)
  cache_file/      cache files of cache_file_fuzz.cc's running model (0, 5 and 13 tokens); their
                   first byte 0x01 asks the target to fix the checksum
  tokenizer/       lines of tests/tokenizer/corpus.txt (encode) and id runs (decode), each
                   behind tokenizer_fuzz.cc's mode byte
  chat_template/   the published chat templates of tests/server/fixtures/templates/ and the
                   models' GGUF templates, each with a conversation of
                   tests/server/fixtures/chat_conversations.json, then jinja constructs from
                   tests/jinja/cases.json and a few hand-written templates (HAND_TEMPLATES),
                   as chat_template_fuzz.cc reads them: template, NUL, JSON options
  request/         request bodies (REQUEST_BODIES) and model output with tool calls, each behind
                   request_fuzz.cc's mode byte
Inputs a fuzzer found (files named found_*) are kept when a folder is rewritten.

Usage (from the repository root, with the project's .venv):
  .venv/bin/python fuzz/make_corpus.py [--out fuzz/corpus] [--targets chat_template,request]
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "tokenizer"))
import hf_reference  # noqa: E402  (tests/tokenizer/hf_reference.py)

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
TARGETS = ("gguf", "safetensors", "config", "tokenizer_json", "cache_file", "tokenizer",
           "chat_template", "request")
NUM_TOKENS = 600  # tokens kept of a vocabulary (Gemma's bytes end at id 493)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def trimmed_vocab(reader):
    fields = reader.fields
    tokens = fields["tokenizer.ggml.tokens"].contents()[:NUM_TOKENS]
    kept = set(tokens)
    out = {"tokens": tokens}
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in fields:
            out[key] = fields[key].contents()[:NUM_TOKENS]
    if "tokenizer.ggml.merges" in fields:
        merges = []
        for m in fields["tokenizer.ggml.merges"].contents():
            a, _, b = m.partition(" ")
            if a in kept and b in kept and a + b in kept:
                merges.append(m)
        out["tokenizer.ggml.merges"] = merges
    return out


def gguf_seed(model_path, out_path, tiny_dims):
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    reader = gguf.GGUFReader(model_path)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out_path, arch)
    vocab = trimmed_vocab(reader)
    small = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
             "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
             "attention.value_length": 16, "context_length": 256, "vocab_size": NUM_TOKENS}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        if key == "tokenizer.ggml.tokens":
            writer.add_array(key, vocab["tokens"])
            continue
        if key in vocab:
            value = vocab[key]
            if key == "tokenizer.ggml.token_type":
                writer.add_key_value(key, [int(x) for x in value], gguf.GGUFValueType.ARRAY,
                                     sub_type=gguf.GGUFValueType.INT32)
            elif key == "tokenizer.ggml.scores":
                writer.add_key_value(key, [float(x) for x in value], gguf.GGUFValueType.ARRAY,
                                     sub_type=gguf.GGUFValueType.FLOAT32)
            else:
                writer.add_array(key, value)
            continue
        value = field.contents()
        short = key[len(arch) + 1:] if key.startswith(arch + ".") else None
        if tiny_dims and short in small:
            value = small[short]
        if vtype == gguf.GGUFValueType.ARRAY:
            if isinstance(value, list):
                value = value[:64]
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_key_value(key, value[:2048], vtype)
        else:
            writer.add_key_value(key, value, vtype)
    if tiny_dims and f"{arch}.vocab_size" not in reader.fields:
        writer.add_uint32(f"{arch}.vocab_size", NUM_TOKENS)
    # one short tensor of every type the model uses: the first two rows of 256 elements
    seen = set()
    for t in reader.tensors:
        if t.tensor_type in seen:
            continue
        seen.add(t.tensor_type)
        block, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        row_elements = 256 if t.n_elements >= 512 and 256 % block == 0 else int(t.shape[0])
        num_rows = 2 if t.n_elements >= 2 * row_elements else 1
        nbytes = num_rows * row_elements // block * type_size
        raw = np.frombuffer(bytes(t.data.view(np.uint8).reshape(-1)[:nbytes]), dtype=np.uint8)
        writer.add_tensor(t.name, raw, raw_shape=(num_rows, row_elements // block * type_size),
                          raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenizer_json_seeds(model_path, out_dir, name):
    reader = gguf.GGUFReader(model_path)
    v = hf_reference.read_gguf_vocab(model_path)
    vocab = trimmed_vocab(reader)
    v["tokens"] = vocab["tokens"]
    v["types"] = vocab.get("tokenizer.ggml.token_type")
    v["scores"] = vocab.get("tokenizer.ggml.scores")
    v["merges"] = vocab.get("tokenizer.ggml.merges")
    for key in ("bos", "eos", "unk"):
        if v[key] is not None and v[key] >= NUM_TOKENS:
            v[key] = None
    if v["model"] == "gpt2":
        tok = hf_reference.build_byte_level(v)
        write(os.path.join(out_dir, f"{name}.json"), tok.to_str().encode())
    else:
        for style in (None, "metaspace_first"):
            tok = hf_reference.build_spm(v, style)
            suffix = "" if style is None else "_" + style
            write(os.path.join(out_dir, f"{name}{suffix}.json"), tok.to_str().encode())


def safetensors_seeds(out_dir):
    for model in ("llama", "gemma3", "qwen2"):
        path = f"tests/model/fixtures/tiny/{model}/model.safetensors"
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for dtype, size in (("F32", 4), ("F16", 2), ("BF16", 2)):
            out, data = {"__metadata__": {"format": "pt"}}, b""
            for i, name in enumerate(k for k in sorted(header) if k != "__metadata__"):
                if i == 6:
                    break
                shape = [2, 3] if len(header[name]["shape"]) == 2 else [4]
                nbytes = int(np.prod(shape)) * size
                out[name] = {"dtype": dtype, "shape": shape,
                             "data_offsets": [len(data), len(data) + nbytes]}
                data += bytes((i * 7 + j) % 251 for j in range(nbytes))
            text = json.dumps(out).encode()
            text += b" " * (-len(text) % 8)
            write(os.path.join(out_dir, f"{model}_{dtype.lower()}.safetensors"),
                  struct.pack("<Q", len(text)) + text + data)


def cache_file_seeds(out_dir):
    # cache_file_fuzz.cc's running model: 3 layers (window 8 in the middle), 2 KV heads x 4, f32
    arch, weight_hash, heads, head_dim = b"testarch", 0x0123456789ABCDEF, 2, 4
    layers = [(0, 0), (1, 8), (0, 0)]
    for num_tokens in (0, 5, 13):
        body = b"KVPCACHE" + struct.pack("<II", 1, len(arch)) + arch
        body += struct.pack("<QIIII", weight_hash, len(layers), heads, head_dim, 0)
        for kind, window in layers:
            body += struct.pack("<II", kind, window)
        body += struct.pack("<Q", num_tokens)
        body += b"".join(struct.pack("<i", 3 + 5 * t) for t in range(num_tokens))
        for kind, window in layers:
            kept = min(num_tokens, window) if kind == 1 else num_tokens
            values = np.arange(2 * kept * heads * head_dim, dtype=np.float32) / 7.0
            body += values.tobytes()
        write(os.path.join(out_dir, f"tokens_{num_tokens}.kvc"), b"\x01" + body + bytes(8))


def tokenizer_seeds(out_dir):
    with open("tests/tokenizer/corpus.txt", encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip()]
    for i, line in enumerate(lines[:24]):
        mode = i % 8 & ~2  # encode, either tokenizer, special tokens parsed or not
        write(os.path.join(out_dir, f"encode_{i:02d}"), bytes([mode]) + line.encode()[:300])
    ids = [1, 2, 3, 100, 260, 1000, 30000, 49151, 262143, 238, 493, 0, -1, 1 << 20]
    for mode in (2, 3, 6, 7):  # decode, either tokenizer, skipping special tokens or not
        write(os.path.join(out_dir, f"decode_{mode}"),
              bytes([mode]) + b"".join(struct.pack("<i", x) for x in ids))


# Hand-written templates for chat_template/: the constructs the published templates use, and the
# ones that reach the interpreter's limits.
HAND_TEMPLATES = {
    "loop_controls": "{% for m in messages %}{% if loop.index0 > 5 %}{% break %}{% endif %}"
                     "{% if m.role == 'system' %}{% continue %}{% endif %}{{ loop.index }}:"
                     "{{ m['content'] | trim }}{% if not loop.last %}\n{% endif %}"
                     "{% else %}none{% endfor %}",
    "macro_caller": "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                    "{% for m in messages %}{% call wrap(m.role) %}{{ m.content }}{% endcall %}"
                    "{% endfor %}",
    "namespace_set_block": "{% set ns = namespace(sys='', n=0) %}{% for m in messages %}"
                           "{% if m.role == 'system' %}{% set ns.sys = m.content %}{% endif %}"
                           "{% set ns.n = ns.n + 1 %}{% endfor %}{% set head %}[{{ ns.sys }}]"
                           "{% endset %}{{ head | upper }} {{ ns.n }}",
    "tools_json": "{% if tools %}{% for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}"
                  "{% endif %}{% for m in messages %}{% if m.tool_calls %}"
                  "{% for c in m.tool_calls %}{{ c.function.name }}"
                  "({{ c.function.arguments | tojson }}){% endfor %}{% else %}"
                  "{{ m.content }}{% endif %}{% endfor %}",
    "filters": "{{ messages | map(attribute='role') | unique | list | join(',') }}"
               "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
               "{{ messages[-1].content | replace('a', 'b') | title | center(20) }}"
               "{{ (messages | last).content[1:4] }}{{ '%s-%d' | format('x', 3) }}"
               "{{ [3, 1, 2] | sort | reverse | list }}{{ {'b': 1, 'a': 2} | dictsort }}",
    "string_methods": "{% for m in messages %}{{ m.content.strip().split(' ') | first }}"
                      "{{ m.content.startswith('<') }}{{ m.content.lstrip('H').rstrip() }}"
                      "{{ m.role.capitalize() }}{{ m.content.find('o') }}{% endfor %}",
    "recursive_loop": "{% for item in extra_tree recursive %}{{ item.name }}"
                      "{% if item.children %}({{ loop(item.children) }}){% endif %}{% endfor %}",
    "with_filter_block": "{% with a = messages | length, b = bos_token %}{{ b }}{{ a }}"
                         "{% endwith %}{% filter upper %}{{ eos_token }} done{% endfilter %}",
    "raise_and_date": "{% if messages[0].role != 'system' %}"
                      "{{ raise_exception('first message must be system') }}{% endif %}"
                      "{{ strftime_now('%Y-%m-%d') }}",
    "limits": "{{ 'ab' * 1000 | length }}{% for i in range(300) %}{% for j in range(300) %}"
              "{% endfor %}{% endfor %}{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "dict_items_is_tests": "{% set d = dict(a=1, b=[1, 2], c=none) %}{% for k, v in d.items() %}"
                           "{{ k }}={{ v is none }}/{{ v is iterable }}/{{ v is number }};"
                           "{% endfor %}{{ d.get('z', 'default') }}{{ 7 // 2 }}{{ 7 % 3 }}"
                           "{{ 2 ** 10 }}{{ 1.5e3 }}{{ -3 | abs }}{{ 'x' in 'xyz' }}",
}

JINJA_CASES = ["text_plain", "for_else_empty", "macro_defaults", "loop_cycle", "tojson_sort_keys",
               "namespace_counter", "slice_negative_step", "string_escape_repr"]


def chat_template_seeds(models_dir, out_dir):
    conversations = json.load(open("tests/server/fixtures/chat_conversations.json"))
    templates = []
    fixtures = "tests/server/fixtures/templates"
    for name in sorted(os.listdir(fixtures)):
        if name.endswith(".jinja"):
            with open(os.path.join(fixtures, name), encoding="utf-8") as f:
                templates.append((name[:-len(".jinja")], f.read()))
    for model in MODELS:  # Gemma 3 270M is a base model: no template
        reader = gguf.GGUFReader(os.path.join(models_dir, model))
        if "tokenizer.chat_template" in reader.fields:
            name = model.split(".")[0].lower() + "_gguf"
            templates.append((name, reader.fields["tokenizer.chat_template"].contents()))
    for i, (name, template) in enumerate(templates):
        # templates with tool support get the tool conversations, the others plain ones
        tools = "tools" in template or "tool_calls" in template
        pool = [c for c in conversations if ("tools" in c) == tools] or conversations
        conv = pool[i % len(pool)]
        options = {"messages": conv["messages"], "add_generation_prompt": True}
        if "tools" in conv:
            options["tools"] = conv["tools"]
        if "extra" in conv:
            options["extra"] = conv["extra"]
        write(os.path.join(out_dir, f"{name}_{conv['name']}"),
              template.encode() + b"\0" + json.dumps(options).encode())
    first = conversations[0]["messages"]
    tree = [{"name": "a", "children": [{"name": "b", "children": []}]}, {"name": "c"}]
    for name, template in HAND_TEMPLATES.items():
        options = {"messages": first, "extra": {"extra_tree": tree}}
        write(os.path.join(out_dir, f"hand_{name}"),
              template.encode() + b"\0" + json.dumps(options).encode())
    cases = {c["name"]: c for c in json.load(open("tests/jinja/cases.json"))}
    for name in JINJA_CASES:
        if name not in cases:
            continue
        context = dict(cases[name].get("context", {}))
        options = {"messages": context.pop("messages", first),
                   "extra": {k: v for k, v in context.items()
                             if k not in ("tools", "documents", "add_generation_prompt")}}
        write(os.path.join(out_dir, f"case_{name}"),
              cases[name]["template"].encode() + b"\0" + json.dumps(options).encode())
    # a tool_use template beside the default one (tokenizer_config.json's named templates)
    tools_conv = next(c for c in conversations if "tools" in c)
    options = {"messages": tools_conv["messages"], "tools": tools_conv["tools"],
               "tool_use": HAND_TEMPLATES["tools_json"]}
    write(os.path.join(out_dir, "named_tool_use"),
          HAND_TEMPLATES["loop_controls"].encode() + b"\0" + json.dumps(options).encode())


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}}]

# request/: 'c' chat, 'p' completions, 'd' detokenize, 't' model output (request_fuzz.cc).
REQUEST_BODIES = {
    "chat_minimal": ("c", {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}),
    "chat_sampling": ("c", {
        "model": "smollm2", "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Count to 3."}],
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42,
        "presence_penalty": 0.5, "frequency_penalty": 0.2, "repetition_penalty": 1.1,
        "max_tokens": 32, "min_tokens": 2, "n": 2, "stop": ["\n\n", "END"],
        "stop_token_ids": [2], "logprobs": True, "top_logprobs": 3, "user": "u1",
        "logit_bias": {"50256": -100}, "response_format": {"type": "json_object"}}),
    "chat_stream": ("c", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say "},
                                                  {"type": "text", "text": "hello"}]}],
        "stream": True, "stream_options": {"include_usage": True},
        "max_completion_tokens": 8, "stop": "!", "ignore_eos": False,
        "skip_special_tokens": False}),
    "chat_tools": ("c", {
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function", "function": {
                             "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
        "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False}),
    "chat_session_kwargs": ("c", {
        "messages": [{"role": "developer", "content": "Think."},
                     {"role": "user", "content": "2+2?"},
                     {"role": "assistant", "content": "4", "reasoning_content": "easy"}],
        "session_id": "agent-7.run_1", "chat_template_kwargs": {"enable_thinking": False},
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "tools": TOOLS}),
    "completion_text": ("p", {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 16,
                              "temperature": 0, "logprobs": 2, "stop": ["."], "seed": -1}),
    "completion_ids": ("p", {"prompt": [1, 9690, 198, 2683], "max_tokens": 4, "echo": False,
                             "stream": True}),
    "completion_list": ("p", {"prompt": ["one prompt in a list"], "n": 3, "top_k": -1}),
    "detokenize": ("d", {"tokens": [1, 9690, 198, 2683, 0, 49151]}),
    "tokenize_chat": ("a", {"messages": [{"role": "user", "content": "Hello"}]}),
    "tokenize_prompt": ("b", {"prompt": "Hello world", "add_special_tokens": False}),
}

MODEL_OUTPUTS = {
    "hermes": 'Sure.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n',
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
              '{"name": "f", "parameters": {"x": [1, 2]}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]',
    "mistral_v11": '[TOOL_CALLS]get_weather[ARGS]{"city": "Lima"}',
    "not_a_call": 'Text <tool_call>{"name": oops</tool_call> and [TOOL_CALLS] more',
}


def request_seeds(out_dir):
    for name, (mode, body) in REQUEST_BODIES.items():
        write(os.path.join(out_dir, name), mode.encode() + json.dumps(body).encode())
    for name, text in MODEL_OUTPUTS.items():
        write(os.path.join(out_dir, f"output_{name}"), b"t" + text.encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fuzz/corpus")
    ap.add_argument("--models", default="models")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help="comma-separated seed folders to rewrite (default: all)")
    args = ap.parse_args()
    targets = args.targets.split(",")
    for target in targets:  # inputs the fuzzers found (found_*) stay: they are regressions
        folder = os.path.join(args.out, target)
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if not name.startswith("found_"):
                os.remove(os.path.join(folder, name))
    for model in MODELS:
        path = os.path.join(args.models, model)
        name = model.split(".")[0].split("-q")[0].lower()
        if "gguf" in targets:
            gguf_seed(path, os.path.join(args.out, "gguf", f"{name}.gguf"), tiny_dims=False)
            gguf_seed(path, os.path.join(args.out, "gguf", f"{name}_tiny_dims.gguf"),
                      tiny_dims=True)
        if "tokenizer_json" in targets:
            tokenizer_json_seeds(path, os.path.join(args.out, "tokenizer_json"), name)
    if "safetensors" in targets:
        safetensors_seeds(os.path.join(args.out, "safetensors"))
    if "config" in targets:
        os.makedirs(os.path.join(args.out, "config"), exist_ok=True)
        for src in sorted(os.listdir("tests/cache/fixtures")):
            shutil.copy(os.path.join("tests/cache/fixtures", src),
                        os.path.join(args.out, "config"))
        for model in ("llama", "gemma3", "qwen2"):
            shutil.copy(f"tests/model/fixtures/tiny/{model}/config.json",
                        os.path.join(args.out, "config", f"tiny_{model}.json"))
    if "cache_file" in targets:
        cache_file_seeds(os.path.join(args.out, "cache_file"))
    if "tokenizer" in targets:
        tokenizer_seeds(os.path.join(args.out, "tokenizer"))
    if "chat_template" in targets:
        chat_template_seeds(args.models, os.path.join(args.out, "chat_template"))
    if "request" in targets:
        request_seeds(os.path.join(args.out, "request"))

if __name__ == "__main__":
    main()
