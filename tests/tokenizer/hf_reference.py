#!/usr/bin/env python3
"""Reference token ids for kvpool's tokenizer tests, from Hugging Face `tokenizers`.

Reads the tokenizer embedded in each GGUF model (with the `gguf` package), builds the
equivalent `tokenizers.Tokenizer` (our own conversion, written for kvpool), saves it as
<out>/<name>/tokenizer.json and encodes every test case with it:

  <out>/<name>/tokenizer.json   the HF tokenizer kvpool's C++ loader reads
  <out>/<name>/expected.jsonl   one JSON object per case:
      text          the input
      ids           encode(text) with the tokenizer's own special tokens (BOS if it adds one)
      ids_plain     encode(text, add_special_tokens=False)
      decoded       decode(ids_plain, skip_special_tokens=False)
      ids_literal   encode(text) with encode_special_tokens=True (special tokens' text is
                    tokenized as ordinary text)
  <out>/<name>/scores.json      (SentencePiece vocabularies only) the GGUF per-token scores, so
                                the C++ test can also check score-based merging without merges

Cases: every line of the corpus (without its newline), then the whole corpus as one text (which
holds the runs of newlines, tabs and indentation a single line cannot), then NUM_RANDOM texts
drawn with a fixed seed from the corpus's characters, whitespace, digits, apostrophes and random
code points (the same texts on every run).

Tokenizers: smollm2 and gemma3 from the models; smollm2_llama3 and smollm2_qwen2 are SmolLM2's
vocabulary with Llama 3's and Qwen2's pre-tokenizer regexes (to check those regexes with PCRE2
against HF's Oniguruma; a byte-level vocabulary encodes any piece); gemma3_metaspace_first and
gemma3_metaspace_always are Gemma 3's vocabulary behind a Metaspace pre-tokenizer;
gemma3_space_prefix is Gemma 3's vocabulary with add_space_prefix set (Llama 2 style).

Usage (from the repo root): .venv/bin/python tests/tokenizer/hf_reference.py --out DIR
  [--corpus tests/tokenizer/corpus.txt] [--models models]
"""

import argparse
import json
import os
import random
import sys

import gguf
from tokenizers import Regex, Tokenizer, AddedToken, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

NUM_RANDOM = 400


def random_cases(corpus):
    rng = random.Random(20261122)
    chars = sorted(set(corpus))
    specials = ["<|im_start|>", "<|endoftext|>", "<start_of_turn>", "<eos>", "<bos>", "\n\n",
                "  ", "\t", "'s", "'LL", "123456", "\r\n", "\u2581", "<0x41>", "<unk>"]
    out = []
    for _ in range(NUM_RANDOM):
        parts = []
        for _ in range(rng.randint(1, 24)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(chars))
            elif r < 0.6:
                parts.append(rng.choice([" ", "  ", "\n", "\t", " \n", "\u3000", "\u00a0"]))
            elif r < 0.7:
                parts.append(rng.choice(specials))
            elif r < 0.8:
                parts.append(str(rng.randint(0, 10**rng.randint(1, 12))))
            else:
                cp = rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                                 rng.randint(0x3000, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])
                if 0xFDD0 <= cp <= 0xFDEF or (cp & 0xFFFE) == 0xFFFE:
                    cp = 0x41
                parts.append(chr(cp))
        out.append("".join(parts))
    return out


def read_gguf_vocab(path):
    reader = gguf.GGUFReader(path)
    fields = reader.fields

    def get(key, default=None):
        return fields[key].contents() if key in fields else default

    return {
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"),
        "types": get("tokenizer.ggml.token_type"),
        "scores": get("tokenizer.ggml.scores"),
        "merges": get("tokenizer.ggml.merges"),
        "bos": get("tokenizer.ggml.bos_token_id"),
        "eos": get("tokenizer.ggml.eos_token_id"),
        "unk": get("tokenizer.ggml.unknown_token_id"),
        "add_bos": bool(get("tokenizer.ggml.add_bos_token", False)),
        "add_eos": bool(get("tokenizer.ggml.add_eos_token", False)),
        "add_space_prefix": bool(get("tokenizer.ggml.add_space_prefix", False)),
    }


def add_special_tokens_and_post_processor(tok, v, tokens):
    added = []
    for i, (t, ty) in enumerate(zip(tokens, v["types"])):
        if ty == CONTROL:
            added.append((i, AddedToken(t, special=True, normalized=False)))
        elif ty == USER_DEFINED:
            # Matched on the normalized text, where a space is already "▁".
            added.append((i, AddedToken(t, special=False, normalized=True)))
    # add_tokens keeps the vocabulary's ids for tokens that are already in it.
    for i, a in added:
        tok.add_tokens([a]) if not a.special else tok.add_special_tokens([a])
        assert tok.token_to_id(a.content) == i, (a.content, i, tok.token_to_id(a.content))
    single = []
    pair_specials = []
    if v["add_bos"]:
        single.append(tokens[v["bos"]])
        pair_specials.append((tokens[v["bos"]], v["bos"]))
    single.append("$A")
    if v["add_eos"]:
        single.append(tokens[v["eos"]])
        pair_specials.append((tokens[v["eos"]], v["eos"]))
    if pair_specials:
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(single), special_tokens=pair_specials)


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_byte_level(v, pre=None):
    """gpt2-style vocabulary (tokenizer.ggml.model == "gpt2"): byte-level BPE with merges."""
    tokens = v["tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    pre = pre or v["pre"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                               byte_fallback=False, ignore_merges=pre in ("llama3", "llama-bpe")))
    if pre == "smollm":
        # llama.cpp's smollm: digits one by one, then the GPT-2 regex.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    elif pre in ("gpt2", "default"):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre in ("llama3", "llama-bpe"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif pre == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        sys.exit(f"hf_reference.py: no pre-tokenizer known for tokenizer.ggml.pre '{pre}'")
    tok.decoder = decoders.ByteLevel()
    add_special_tokens_and_post_processor(tok, v, tokens)
    return tok


def spm_merges(tokens, types, scores):
    """Merges for a SentencePiece vocabulary that has only scores: every split of a mergeable
    token into two vocabulary pieces, the better-scored result first."""
    mergeable = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
    out = []
    for t, i in mergeable.items():
        local = []
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in mergeable and right in mergeable:
                local.append((left, right))
        local.sort(key=lambda p: (scores[mergeable[p[0]]], scores[mergeable[p[1]]]), reverse=True)
        out.extend((scores[i], i, k, p) for k, p in enumerate(local))
    # Higher score first; for equal scores the lower token id, then the order above.
    out.sort(key=lambda e: (-e[0], e[1], e[2]))
    return [e[3] for e in out]


_merges_cache = {}


def build_spm(v, style=None):
    """llama-style vocabulary (tokenizer.ggml.model == "llama"): SentencePiece BPE with scores,
    byte fallback and "▁" for spaces. `style` None: Replace normalizer (as GGUF/llama.cpp);
    "metaspace_first" / "metaspace_always": the same vocabulary behind a Metaspace
    pre-tokenizer instead (newer HF Llama-style files), to check that step too."""
    tokens = list(v["tokens"])
    types = v["types"]
    # SentencePiece stores runs of spaces as user-defined pieces of plain spaces; in the
    # normalized text a space is "▁", so the piece is spelled that way.
    for i, t in enumerate(tokens):
        if types[i] == USER_DEFINED and t and t.strip(" ") == "":
            tokens[i] = "▁" * len(t)
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens"
    if id(v["tokens"]) not in _merges_cache:
        _merges_cache[id(v["tokens"])] = spm_merges(tokens, types, v["scores"])
    merges = _merges_cache[id(v["tokens"])]
    if style == "space_prefix":  # as a GGUF with tokenizer.ggml.add_space_prefix = true
        v = dict(v, add_space_prefix=True)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=tokens[v["unk"]],
                               fuse_unk=True, byte_fallback=True))
    if style == "metaspace_first":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    elif style == "metaspace_always":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always",
                                                     split=True)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁",
                                                            prepend_scheme="always"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    else:
        norms = []
        if v["add_space_prefix"]:
            norms.append(normalizers.Prepend("▁"))
        norms.append(normalizers.Replace(" ", "▁"))
        tok.normalizer = normalizers.Sequence(norms) if len(norms) > 1 else norms[0]
        decs = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if v["add_space_prefix"]:
            decs.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(decs)
    add_special_tokens_and_post_processor(tok, v, tokens)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default="tests/tokenizer/corpus.txt")
    ap.add_argument("--models", default="models")
    args = ap.parse_args()

    with open(args.corpus, encoding="utf-8", newline="") as f:
        corpus = f.read()
    cases = corpus.split("\n")
    if cases and cases[-1] == "":
        cases.pop()
    cases.append(corpus)
    cases.extend(random_cases(corpus))

    smollm, gemma = "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"
    todo = [("smollm2", smollm, None), ("smollm2_llama3", smollm, "llama3"),
            ("smollm2_qwen2", smollm, "qwen2"), ("gemma3", gemma, None),
            ("gemma3_metaspace_first", gemma, "metaspace_first"),
            ("gemma3_metaspace_always", gemma, "metaspace_always"),
            ("gemma3_space_prefix", gemma, "space_prefix")]
    vocabs = {}
    for name, file, pre in todo:
        if file not in vocabs:
            vocabs[file] = read_gguf_vocab(os.path.join(args.models, file))
        v = vocabs[file]
        if v["model"] == "gpt2":
            tok = build_byte_level(v, pre)
        elif v["model"] == "llama":
            tok = build_spm(v, pre)
        else:
            sys.exit(f"hf_reference.py: {file}: tokenizer.ggml.model '{v['model']}' unsupported")
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        tok.save(os.path.join(out_dir, "tokenizer.json"))
        if v["model"] == "llama" and pre in (None, "space_prefix"):
            with open(os.path.join(out_dir, "scores.json"), "w") as f:
                json.dump({"scores": [float(s) for s in v["scores"]],
                           "token_types": [int(t) for t in v["types"]]}, f)
        with open(os.path.join(out_dir, "expected.jsonl"), "w", encoding="utf-8") as f:
            for text in cases:
                ids = tok.encode(text).ids
                ids_plain = tok.encode(text, add_special_tokens=False).ids
                decoded = tok.decode(ids_plain, skip_special_tokens=False)
                tok.encode_special_tokens = True
                ids_literal = tok.encode(text).ids
                tok.encode_special_tokens = False
                f.write(json.dumps({"text": text, "ids": ids, "ids_plain": ids_plain,
                                    "decoded": decoded, "ids_literal": ids_literal},
                                   ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
