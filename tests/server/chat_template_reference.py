#!/usr/bin/env python3
"""Renders every fixture chat template on every fixture conversation with Hugging Face transformers.

Usage: chat_template_reference.py CONVERSATIONS_JSON TOKENS_JSON TEMPLATE.jinja... MODEL.gguf... OUT_JSON

What apply_chat_template(messages, tools=..., add_generation_prompt=..., **kwargs) does, step by step
(transformers/tokenization_utils_base.py): keys whose value is None are dropped from each message,
the special tokens (here bos_token / eos_token, from TOKENS_JSON for the .jinja fixtures and from
the GGUF vocabulary for models) are merged under the kwargs, and
transformers.utils.chat_template_utils.render_jinja_template renders with documents=None.
Each conversation is rendered with add_generation_prompt true and false. The output maps
template id -> {"bos_token", "eos_token", "results": {"<conversation>/<agp>": {"output"} or
{"error", "type"}}}; a GGUF without a chat template is recorded as {"no_template": true}.
"""
import json
import os
import sys

from transformers.utils.chat_template_utils import render_jinja_template


def render_all(template, bos_token, eos_token, conversations):
    special = {}
    if bos_token:
        special["bos_token"] = bos_token
    if eos_token:
        special["eos_token"] = eos_token
    results = {}
    for conv in conversations:
        messages = [{k: v for k, v in m.items() if v is not None} for m in conv["messages"]]
        for agp in (True, False):
            key = f"{conv['name']}/{'gen' if agp else 'nogen'}"
            try:
                rendered, _ = render_jinja_template(
                    conversations=[messages],
                    tools=conv.get("tools"),
                    documents=None,
                    chat_template=template,
                    add_generation_prompt=agp,
                    **{**special, **conv.get("extra", {})},
                )
                results[key] = {"output": rendered[0]}
            except Exception as e:  # a template's own failure is a result to compare with
                results[key] = {"error": str(e), "type": type(e).__name__}
    return results


def gguf_template(path):
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def field(name):
        f = reader.fields.get(name)
        return None if f is None else f.parts[f.data[0]]

    template = field("tokenizer.chat_template")
    tokens = reader.fields["tokenizer.ggml.tokens"]

    def token(id_field):
        ids = field(id_field)
        if ids is None:
            return ""
        return bytes(tokens.parts[tokens.data[int(ids[0])]]).decode("utf-8")

    text = None if template is None else bytes(template).decode("utf-8")
    return text, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")


def main():
    conversations_path, tokens_path, *paths, out_path = sys.argv[1:]
    with open(conversations_path, encoding="utf-8") as f:
        conversations = json.load(f)
    with open(tokens_path, encoding="utf-8") as f:
        tokens = json.load(f)
    out = {}
    for path in paths:
        name = os.path.basename(path)
        if path.endswith(".gguf"):
            template, bos, eos = gguf_template(path)
            if template is None:
                out[path] = {"no_template": True, "bos_token": bos, "eos_token": eos}
                continue
        else:
            with open(path, encoding="utf-8", newline="") as f:
                template = f.read()
            bos, eos = tokens[name]["bos_token"], tokens[name]["eos_token"]
        out[path] = {"bos_token": bos, "eos_token": eos, "results": render_all(template, bos, eos, conversations)}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
