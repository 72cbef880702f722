// Normalizer and pre-tokenizer steps (see pre_tokenizer.h).
#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/utf8.h"

namespace kvp {
namespace {

// GPT-2's pre-tokenizer regex, as HF's ByteLevel(use_regex=true) uses it.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

// Splits `piece` at `matches` by `behavior` (HF SplitDelimiterBehavior), appending the
// non-empty parts to `out`.
void split_by_matches(const TextPiece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                      SplitBehavior behavior, std::vector<TextPiece>* out) {
  // (begin, end, is_match) covering the piece, in order.
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t pos = 0;
  for (const auto& [b, e] : matches) {
    if (b > pos) spans.push_back({pos, b, false});
    spans.push_back({b, e, true});
    pos = e;
  }
  if (pos < piece.text.size()) spans.push_back({pos, piece.text.size(), false});

  std::vector<std::pair<size_t, size_t>> parts;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) parts.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) parts.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_was_gap = false;
      for (const Span& s : spans) {
        if (s.is_match && previous_was_gap) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_was_gap = !s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_was_match = false;
      for (const Span& s : spans) {
        if (!s.is_match && previous_was_match) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_was_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_was_match = false;
      for (const Span& s : spans) {
        if (s.is_match && previous_was_match) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_was_match = s.is_match;
      }
      break;
    }
  }
  for (const auto& [b, e] : parts) {
    if (e > b) out->push_back({piece.text.substr(b, e - b), piece.original_offset + b});
  }
}

// `prefix` + `text` (std::string::insert(0, ...) trips a GCC 12 -Wrestrict false positive).
void prepend_to(std::string& text, std::string_view prefix) {
  std::string joined;
  joined.reserve(prefix.size() + text.size());
  joined.append(prefix);
  joined.append(text);
  text = std::move(joined);
}

}  // namespace

ByteLevelAlphabet::ByteLevelAlphabet() {
  char_to_byte_.fill(-1);
  int next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int cp = printable ? b : next_extra++;
    utf8::append(byte_to_utf8_[b], static_cast<char32_t>(cp));
    char_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

Result<PreTokenizer> PreTokenizer::create(const TokenizerPipeline& pipeline) {
  PreTokenizer pre;
  pre.normalizer_ = pipeline.normalizer;
  for (const PreTokenizerStep& spec : pipeline.pre_tokenizer) {
    Step step{spec, {}};
    if (spec.kind == PreTokenizerStep::Kind::kSplit) {
      KVP_ASSIGN_OR_RETURN(Regex regex, Regex::compile(spec.pattern, !spec.pattern_is_regex));
      step.regexes.push_back(std::move(regex));
    } else if (spec.kind == PreTokenizerStep::Kind::kByteLevel && spec.use_regex) {
      KVP_ASSIGN_OR_RETURN(Regex regex, Regex::compile(kGpt2Regex));
      step.regexes.push_back(std::move(regex));
    } else if (spec.kind == PreTokenizerStep::Kind::kDigits) {
      KVP_ASSIGN_OR_RETURN(Regex regex, Regex::compile(R"(\p{N})"));
      step.regexes.push_back(std::move(regex));
    } else if (spec.kind == PreTokenizerStep::Kind::kMetaspace) {
      if (spec.replacement.empty()) {
        return Status::invalid_argument("pre-tokenizer Metaspace: empty replacement");
      }
      KVP_ASSIGN_OR_RETURN(Regex regex, Regex::compile(spec.replacement, /*literal=*/true));
      step.regexes.push_back(std::move(regex));
    }
    pre.steps_.push_back(std::move(step));
  }
  return pre;
}

std::string PreTokenizer::normalize(std::string_view text) const {
  std::string out(text);
  for (const NormalizerStep& step : normalizer_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kReplace:
        out = replace_all(out, step.pattern, step.content);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!out.empty()) prepend_to(out, step.content);
        break;
    }
  }
  return out;
}

Status PreTokenizer::split(std::string_view text, size_t original_offset,
                           std::vector<TextPiece>* out) const {
  if (text.empty()) return Status::ok();  // HF never pre-tokenizes an empty stretch
  std::vector<TextPiece> pieces{{std::string(text), original_offset}};
  std::vector<TextPiece> next;
  for (const Step& step : steps_) {
    next.clear();
    const PreTokenizerStep& spec = step.spec;
    for (TextPiece& piece : pieces) {
      switch (spec.kind) {
        case PreTokenizerStep::Kind::kSplit: {
          KVP_ASSIGN_OR_RETURN(auto matches, step.regexes[0].find_all(piece.text));
          split_by_matches(piece, matches, spec.behavior, &next);
          break;
        }
        case PreTokenizerStep::Kind::kDigits: {
          KVP_ASSIGN_OR_RETURN(auto matches, step.regexes[0].find_all(piece.text));
          split_by_matches(
              piece, matches,
              spec.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
              &next);
          break;
        }
        case PreTokenizerStep::Kind::kByteLevel: {
          if (spec.add_prefix_space && !piece.text.starts_with(' ')) prepend_to(piece.text, " ");
          std::vector<TextPiece> parts;
          if (spec.use_regex) {
            KVP_ASSIGN_OR_RETURN(auto matches, step.regexes[0].find_all(piece.text));
            split_by_matches(piece, matches, SplitBehavior::kIsolated, &parts);
          } else {
            parts.push_back(std::move(piece));
          }
          const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
          for (TextPiece& part : parts) {
            std::string mapped;
            mapped.reserve(part.text.size() * 2);
            for (const char c : part.text) mapped += alphabet.encode(static_cast<uint8_t>(c));
            next.push_back({std::move(mapped), part.original_offset});
          }
          break;
        }
        case PreTokenizerStep::Kind::kMetaspace: {
          std::string replaced = replace_all(piece.text, " ", spec.replacement);
          const bool add_prefix =
              spec.prepend == PreTokenizerStep::Prepend::kAlways ||
              (spec.prepend == PreTokenizerStep::Prepend::kFirst && piece.original_offset == 0);
          if (add_prefix && !replaced.starts_with(spec.replacement)) {
            prepend_to(replaced, spec.replacement);
          }
          TextPiece whole{std::move(replaced), piece.original_offset};
          if (spec.split) {
            KVP_ASSIGN_OR_RETURN(auto matches, step.regexes[0].find_all(whole.text));
            split_by_matches(whole, matches, SplitBehavior::kMergedWithNext, &next);
          } else {
            next.push_back(std::move(whole));
          }
          break;
        }
      }
    }
    pieces.swap(next);
  }
  for (TextPiece& piece : pieces) {
    if (!piece.text.empty()) out->push_back(std::move(piece));
  }
  return Status::ok();
}

}  // namespace kvp
