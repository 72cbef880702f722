// What a tokenizer is made of, as plain data.
//
// TokenizerVocab holds exactly what GGUF's `tokenizer.ggml.*` metadata holds (model, pre, tokens,
// scores, token_type, merges, special token ids, add_bos/add_eos, add_space_prefix), so the GGUF
// reader can fill it field by field. TokenizerPipeline holds the steps around the model
// (normalizer, pre-tokenizer, decoder, added tokens) as Hugging Face's tokenizer.json spells
// them; pipeline_for_gguf() derives them from a vocab, load_tokenizer_json() reads them.
// Tokenizer::create() (tokenizer.h) validates both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvp {

using TokenId = int32_t;  // index into TokenizerVocab::tokens

// tokenizer.ggml.model: which algorithm turns a pre-tokenized piece into ids.
enum class TokenizerModel {
  kByteLevelBpe,      // "gpt2": BPE over byte-level characters, ranked merges
  kSentencePieceBpe,  // "llama": BPE over "▁"-for-space text, byte fallback; merges or scores
};

// tokenizer.ggml.token_type values (llama.cpp's numbering, stored in GGUF files).
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special tokens: <bos>, <|im_start|>, ...
  kUserDefined = 4,  // matched in the text as a whole before the model runs
  kUnused = 5,
  kByte = 6,  // <0xXX> byte-fallback tokens
};

struct TokenizerVocab {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  std::string pre;                     // tokenizer.ggml.pre ("smollm", "llama3", "default", ...)
  std::vector<std::string> tokens;     // [num_tokens] token text in the model's alphabet
  std::vector<float> scores;           // [num_tokens] or empty; SentencePiece merge priority
  std::vector<TokenType> token_types;  // [num_tokens] or empty (all kNormal)
  // [num_merges] (left, right), best (rank 0) first. GGUF stores "left right": split it at the
  // first space after the first byte (llama.cpp does the same).
  std::vector<std::pair<std::string, std::string>> merges;
  std::optional<TokenId> bos_id;
  std::optional<TokenId> eos_id;
  std::optional<TokenId> pad_id;
  std::optional<TokenId> unk_id;
  // For a GGUF file without the key, llama.cpp assumes add_bos and add_space_prefix true for a
  // "llama" vocab and false for "gpt2": the reader should fill them that way.
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SentencePiece: prepend "▁" to each stretch of text
};

// One normalizer step, applied to each piece of text between added tokens.
struct NormalizerStep {
  enum class Kind { kReplace, kPrepend };
  Kind kind = Kind::kReplace;
  std::string pattern;  // kReplace: the literal string to replace
  std::string content;  // kReplace: the replacement; kPrepend: what to prepend
};

// How a split keeps the matched part (HF SplitDelimiterBehavior).
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer step; each splits every current piece further.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kDigits, kMetaspace };
  Kind kind = Kind::kSplit;
  std::string pattern;  // kSplit: a PCRE2 regex (or literal, see pattern_is_regex)
  bool pattern_is_regex = true;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool use_regex = true;           // kByteLevel: split with the GPT-2 regex first
  bool add_prefix_space = false;   // kByteLevel: prepend a space to a piece not starting with one
  bool individual_digits = false;  // kDigits
  std::string replacement = "\xE2\x96\x81";  // kMetaspace: "▁"
  enum class Prepend { kAlways, kFirst, kNever };
  Prepend prepend = Prepend::kAlways;  // kMetaspace
  bool split = true;                   // kMetaspace: split before each replacement char
};

// One decoder step (HF decoders), applied to the list of token strings in turn.
struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kByteLevel;
  std::string pattern;  // kReplace
  std::string content;  // kReplace: replacement; kStrip: the character stripped
  int strip_start = 0;  // kStrip: at most this many leading `content` characters
  int strip_stop = 0;   // kStrip: at most this many trailing `content` characters
  std::string replacement = "\xE2\x96\x81";  // kMetaspace
  bool metaspace_strip_first = true;         // kMetaspace: drop the first token's leading space
};

// A token matched in the raw (or normalized) text before pre-tokenization.
struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;     // skipped by decode(skip_special=true)
  bool normalized = false;  // matched in the normalized text rather than the raw text
  bool lstrip = false;      // the match swallows whitespace on its left
  bool rstrip = false;      // ... and on its right
};

struct TokenizerPipeline {
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<DecoderStep> decoder;  // empty: tokens joined with " " (HF without a decoder)
  std::vector<AddedToken> added_tokens;
  bool byte_fallback = false;  // unknown characters become <0xXX> tokens
  bool fuse_unk = false;       // consecutive unknown characters become one unk token
  bool ignore_merges = false;  // a piece that is a whole token skips merging (Llama 3)
};

// The pipeline llama.cpp uses for a GGUF vocab: the regexes for its `pre` (byte-level BPE),
// or "▁" normalization, byte fallback and the SentencePiece decoder. Control and user-defined
// tokens become added tokens. Unknown `pre` values are refused by name.
Result<TokenizerPipeline> pipeline_for_gguf(const TokenizerVocab& vocab);

}  // namespace kvp
