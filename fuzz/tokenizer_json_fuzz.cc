// Fuzz target: Hugging Face tokenizer.json. Arbitrary bytes as tokenizer.json text; when it
// parses and the tokenizer builds, a fixed text is encoded (with and without special-token
// parsing) and decoded, and a run of ids decoded incrementally. Anything but a Status is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;  // NOLINT(google-build-using-namespace)
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = parse_tokenizer_json(text, "fuzz/tokenizer.json");
  if (!parsed.is_ok()) return 0;
  auto tokenizer = Tokenizer::create(std::move(parsed->vocab), std::move(parsed->pipeline));
  if (!tokenizer.is_ok()) return 0;
  for (bool parse_special : {true, false}) {
    auto ids = tokenizer->encode("Hello world! <s> 12345 naïve ▁x\t\n  ü😀",
                                 {.add_special_tokens = true, .parse_special = parse_special});
    if (ids.is_ok()) (void)tokenizer->decode(*ids, /*skip_special=*/parse_special);
  }
  IncrementalDetokenizer detokenizer(*tokenizer);
  for (TokenId id = 0; id < 64 && static_cast<size_t>(id) < tokenizer->num_tokens(); ++id) {
    (void)detokenizer.push(id);
  }
  (void)detokenizer.finish();
  return 0;
}
