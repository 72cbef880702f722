// Decoder steps (see decoder.h).
#include "tokenizer/decoder.h"

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvp {
namespace {

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

// HF ByteLevel decoding of one token: its byte-level characters back to bytes, or its own UTF-8
// bytes if any character is outside the alphabet (added tokens written in plain text).
std::string byte_level_bytes(std::string_view token) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const size_t n = utf8::sequence_length(token, pos);
    const int byte = n > 0 ? alphabet.decode(utf8::decode_at(token, pos)) : -1;
    if (byte < 0) return std::string(token);
    bytes.push_back(static_cast<char>(byte));
    pos += n;
  }
  return bytes;
}

// Strips at most `start` leading and `stop` trailing copies of the character `content`.
std::string strip(std::string_view text, std::string_view content, int start, int stop) {
  if (content.empty()) return std::string(text);
  for (int i = 0; i < start && text.starts_with(content); ++i) text.remove_prefix(content.size());
  for (int i = 0; i < stop && text.ends_with(content); ++i) text.remove_suffix(content.size());
  return std::string(text);
}

}  // namespace

bool is_byte_token_text(std::string_view token, uint8_t* byte) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return false;
  const int hi = hex(token[3]);
  const int lo = hex(token[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<uint8_t>(hi * 16 + lo);
  return true;
}

Decoder::Decoder(std::vector<DecoderStep> steps) : steps_(std::move(steps)) {
  for (const DecoderStep& step : steps_) {
    if (step.kind == DecoderStep::Kind::kStrip && step.strip_start > 0) {
      leading_strips_.push_back({step.content, step.strip_start});
    }
  }
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (steps_.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) bytes += byte_level_bytes(t);
        tokens.clear();
        tokens.push_back(utf8::lossy(bytes));
        break;
      }
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) t = replace_all(t, step.pattern, step.content);
        break;
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string group;  // bytes of consecutive byte tokens
        size_t group_size = 0;
        auto flush = [&] {
          if (group_size == 0) return;
          if (utf8::is_valid(group)) {
            out.push_back(group);
          } else {
            for (size_t i = 0; i < group_size; ++i) out.emplace_back(utf8::kReplacementChar);
          }
          group.clear();
          group_size = 0;
        };
        for (std::string& t : tokens) {
          uint8_t byte = 0;
          if (is_byte_token_text(t, &byte)) {
            group.push_back(static_cast<char>(byte));
            ++group_size;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecoderStep::Kind::kFuse: {
        std::string joined;
        for (const std::string& t : tokens) joined += t;
        tokens.clear();
        tokens.push_back(std::move(joined));
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& t : tokens) {
          t = strip(t, step.content, step.strip_start, step.strip_stop);
        }
        break;
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string t = replace_all(tokens[i], step.replacement, " ");
          if (i == 0 && step.metaspace_strip_first && t.starts_with(' ')) t.erase(0, 1);
          tokens[i] = std::move(t);
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Decoder::token_bytes(std::string_view token, size_t index) const {
  if (steps_.empty()) {
    std::string joined(index == 0 ? "" : " ");
    joined.append(token);
    return joined;
  }
  std::string t(token);
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel:
        t = byte_level_bytes(t);
        break;
      case DecoderStep::Kind::kReplace:
        t = replace_all(t, step.pattern, step.content);
        break;
      case DecoderStep::Kind::kByteFallback: {
        uint8_t byte = 0;
        if (is_byte_token_text(t, &byte)) t.assign(1, static_cast<char>(byte));
        break;
      }
      case DecoderStep::Kind::kFuse:
      case DecoderStep::Kind::kStrip:  // leading strips are applied by the stream
        break;
      case DecoderStep::Kind::kMetaspace:
        t = replace_all(t, step.replacement, " ");
        if (index == 0 && step.metaspace_strip_first && t.starts_with(' ')) t.erase(0, 1);
        break;
    }
  }
  return t;
}

}  // namespace kvp
