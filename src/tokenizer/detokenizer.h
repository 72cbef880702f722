// IncrementalDetokenizer: feed generated token ids one at a time, get text pieces to stream.
//
// Promise: every piece returned is valid UTF-8. Bytes that may still become a character when
// the next token arrives (an incomplete sequence at the end) are held back; bytes that can no
// longer become one are emitted as U+FFFD. For output that decodes to valid UTF-8, the pieces
// concatenated equal Tokenizer::decode() of all ids; finish() flushes what is held back.
// Mutates itself on every call; one detokenizer per sequence; the Tokenizer must outlive it.
#pragma once

#include <string>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace kvp {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false);

  // The text that became complete with `id` (possibly empty). Errors: kInvalidArgument for an
  // id outside the vocabulary (the stream is unchanged).
  Result<std::string> push(TokenId id);

  // Ends the stream: whatever is held back, with U+FFFD for an incomplete final sequence.
  std::string finish();

  // Bytes held back waiting for the rest of a character (0..3).
  size_t num_pending_bytes() const { return pending_.size(); }

 private:
  std::string take_complete(bool at_end);

  const Tokenizer* tokenizer_;
  bool skip_special_;
  size_t num_tokens_seen_ = 0;   // tokens given to the decoder (after skipping)
  bool emitted_any_ = false;     // leading strips apply until something is emitted
  std::vector<int> strip_left_;  // [num leading strips] how many characters each may still drop
  std::string pending_;          // bytes not yet emitted
};

}  // namespace kvp
