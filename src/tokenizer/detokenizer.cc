// IncrementalDetokenizer (see detokenizer.h).
#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace kvp {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {
  for (const auto& strip : tokenizer.decoder().leading_strips()) strip_left_.push_back(strip.count);
}

Result<std::string> IncrementalDetokenizer::push(TokenId id) {
  if (!tokenizer_->is_valid_id(id)) {
    return Status::invalid_argument("detokenizer: token id {} is not in the vocab", id);
  }
  if (skip_special_ && tokenizer_->is_special(id)) return std::string();
  pending_ += tokenizer_->decoder().token_bytes(tokenizer_->decode_text(id), num_tokens_seen_);
  ++num_tokens_seen_;
  return take_complete(/*at_end=*/false);
}

std::string IncrementalDetokenizer::finish() { return take_complete(/*at_end=*/true); }

std::string IncrementalDetokenizer::take_complete(bool at_end) {
  if (!emitted_any_) {
    // Strip steps act on the start of the whole text: drop their characters before emitting.
    const auto& strips = tokenizer_->decoder().leading_strips();
    for (size_t i = 0; i < strips.size(); ++i) {
      while (strip_left_[i] > 0 && !strips[i].content.empty() &&
             pending_.starts_with(strips[i].content)) {
        pending_.erase(0, strips[i].content.size());
        --strip_left_[i];
      }
    }
  }
  const size_t hold = at_end ? 0 : utf8::incomplete_tail_length(pending_);
  const std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - hold);
  std::string out = utf8::lossy(ready);
  pending_.erase(0, ready.size());
  if (!out.empty()) emitted_any_ = true;
  return out;
}

}  // namespace kvp
