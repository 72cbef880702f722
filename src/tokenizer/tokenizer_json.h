// Loading Hugging Face tokenizer.json files into a TokenizerVocab + TokenizerPipeline.
//
// Supported: model BPE (byte-level GPT-2/Llama 3/SmolLM2/Qwen2 style, and SentencePiece style
// with byte_fallback/fuse_unk/unk_token), merges as "a b" strings or [a, b] pairs; normalizers
// Replace (string pattern), Prepend, Sequence; pre-tokenizers Split (regex or string), ByteLevel,
// Digits, Metaspace, Sequence; decoders ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace, Sequence; post-processors TemplateProcessing (one special token before and/or
// after $A), ByteLevel, Sequence; added tokens (special or not, normalized, lstrip/rstrip).
// Anything else is refused with a Status naming the component and the file.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "tokenizer/vocab.h"

namespace kvp {

struct TokenizerJson {
  TokenizerVocab vocab;
  TokenizerPipeline pipeline;
};

// Reads and parses `path`. Errors: kNotFound / kIoError for the file, kCorruption for JSON that
// is not a tokenizer, kUnsupported for a component kvpool does not implement.
Result<TokenizerJson> load_tokenizer_json(const std::string& path);

// Parses tokenizer.json text; `source` names it in error messages.
Result<TokenizerJson> parse_tokenizer_json(std::string_view json_text, std::string_view source);

}  // namespace kvp
