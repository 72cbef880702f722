// pipeline_for_gguf(): the steps llama.cpp runs around a GGUF vocabulary (see vocab.h).
#include "tokenizer/vocab.h"

#include <string_view>

namespace kvp {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // "▁"

// llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), by tokenizer.ggml.pre.
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = text.find(from, pos)) != std::string::npos) {
    text.replace(pos, from.size(), to);
    pos += to.size();
  }
  return text;
}

DecoderStep decoder_step(DecoderStep::Kind kind) {
  DecoderStep step;
  step.kind = kind;
  return step;
}

PreTokenizerStep byte_level_step(bool use_regex) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  step.use_regex = use_regex;
  return step;
}

PreTokenizerStep split_step(std::string_view regex) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kSplit;
  step.pattern = std::string(regex);
  step.behavior = SplitBehavior::kIsolated;
  return step;
}

}  // namespace

Result<TokenizerPipeline> pipeline_for_gguf(const TokenizerVocab& vocab) {
  TokenizerPipeline pipeline;
  const bool spm = vocab.model == TokenizerModel::kSentencePieceBpe;
  if (spm) {
    if (vocab.add_space_prefix) {
      NormalizerStep prepend;
      prepend.kind = NormalizerStep::Kind::kPrepend;
      prepend.content = std::string(kSpaceMarker);
      pipeline.normalizer.push_back(prepend);
    }
    NormalizerStep replace_space;
    replace_space.kind = NormalizerStep::Kind::kReplace;
    replace_space.pattern = " ";
    replace_space.content = std::string(kSpaceMarker);
    pipeline.normalizer.push_back(replace_space);
    pipeline.byte_fallback = true;
    pipeline.fuse_unk = true;
    DecoderStep replace;
    replace.kind = DecoderStep::Kind::kReplace;
    replace.pattern = std::string(kSpaceMarker);
    replace.content = " ";
    pipeline.decoder.push_back(replace);
    pipeline.decoder.push_back(decoder_step(DecoderStep::Kind::kByteFallback));
    pipeline.decoder.push_back(decoder_step(DecoderStep::Kind::kFuse));
    if (vocab.add_space_prefix) {
      DecoderStep strip;
      strip.kind = DecoderStep::Kind::kStrip;
      strip.content = " ";
      strip.strip_start = 1;
      pipeline.decoder.push_back(strip);
    }
  } else {
    const std::string& pre = vocab.pre;
    if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell") {
      PreTokenizerStep digits;
      digits.kind = PreTokenizerStep::Kind::kDigits;
      digits.individual_digits = true;
      pipeline.pre_tokenizer.push_back(digits);
      pipeline.pre_tokenizer.push_back(byte_level_step(/*use_regex=*/true));
    } else if (pre == "gpt2" || pre == "default" || pre.empty()) {
      pipeline.pre_tokenizer.push_back(byte_level_step(/*use_regex=*/true));
    } else if (pre == "llama3" || pre == "llama-bpe") {
      pipeline.pre_tokenizer.push_back(split_step(kLlama3Regex));
      pipeline.pre_tokenizer.push_back(byte_level_step(/*use_regex=*/false));
      pipeline.ignore_merges = true;
    } else if (pre == "qwen2") {
      pipeline.pre_tokenizer.push_back(split_step(kQwen2Regex));
      pipeline.pre_tokenizer.push_back(byte_level_step(/*use_regex=*/false));
    } else {
      return Status::unsupported("tokenizer.ggml.pre '{}': no pre-tokenizer known for it", pre);
    }
    pipeline.decoder.push_back(decoder_step(DecoderStep::Kind::kByteLevel));
  }

  for (size_t i = 0; i < vocab.token_types.size() && i < vocab.tokens.size(); ++i) {
    const TokenType type = vocab.token_types[i];
    if (type != TokenType::kControl && type != TokenType::kUserDefined) continue;
    AddedToken added;
    added.id = static_cast<TokenId>(i);
    added.special = type == TokenType::kControl;
    added.content = vocab.tokens[i];
    if (spm && type == TokenType::kUserDefined) {
      // Matched in the normalized text, where every space is already "▁".
      added.content = replace_all(added.content, " ", kSpaceMarker);
      added.normalized = true;
    }
    if (added.content.empty()) continue;
    pipeline.added_tokens.push_back(std::move(added));
  }
  return pipeline;
}

}  // namespace kvp
