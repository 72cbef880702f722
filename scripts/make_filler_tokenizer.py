#!/usr/bin/env python3
"""A byte-level BPE tokenizer.json of exactly N tokens, for serving a random-weight model shape.

`kvpool serve --random-model llama3-8b` needs a tokenizer whose vocabulary covers the shape's
(128256 ids) so that every sampled id decodes to text; the real Llama 3 tokenizer cannot travel
to the GPU machine (no registry there). This writes one with the standard library only: the 256
byte symbols of GPT-2's byte-level alphabet (ids 0-255), then filler tokens " w256", " w257", ...
up to N, and no merges: text encodes byte by byte, every id decodes ("w{id}" words). Benchmarks
send token-id prompts (/v1/completions), so the tokenizer only has to decode.

    python3 scripts/make_filler_tokenizer.py --vocab 128256 --out DIR   # writes DIR/tokenizer.json
"""

import argparse
import json
import os


def bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenizers use)
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def filler_tokenizer(vocab_size: int) -> dict:
    if vocab_size < 257:
        raise SystemExit(f"--vocab {vocab_size}: needs at least 257 (256 bytes and a filler)")
    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    space = byte_chars[ord(" ")]
    for i in range(256, vocab_size - 1):
        vocab[f"{space}w{i}"] = i
    eos = "<|end|>"
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": vocab_size - 1, "content": eos, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, required=True, help="tokens in all (the model's vocab)")
    ap.add_argument("--out", required=True, help="folder to write tokenizer.json into")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(filler_tokenizer(a.vocab), f, ensure_ascii=False)


if __name__ == "__main__":
    main()
