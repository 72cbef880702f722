// Fuzz target: the tokenizers of the real models on arbitrary input. The first byte picks the
// tokenizer (SmolLM2's byte-level BPE or Gemma 3's SentencePiece BPE, read from the GGUF files
// in $KVP_FUZZ_MODELS, default models/) and the operation:
//   encode the rest as text (invalid UTF-8 must be a Status), with special tokens parsed or not;
//   decode the rest as little-endian int32 ids (ids outside the vocabulary must be a Status),
//   whole and through the incremental detokenizer.
// Anything but a Status is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_loader.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace {

std::vector<kvp::Tokenizer>& tokenizers() {
  static std::vector<kvp::Tokenizer> loaded = [] {
    const char* dir = std::getenv("KVP_FUZZ_MODELS");
    const std::string models = dir != nullptr ? dir : "models";
    std::vector<kvp::Tokenizer> out;
    for (const char* file : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
      auto tokenizer = kvp::load_tokenizer(models + "/" + file);
      if (!tokenizer.is_ok()) {
        std::fprintf(stderr, "tokenizer_fuzz: %s (run scripts/setup.sh)\n",
                     tokenizer.status().to_string().c_str());
        std::exit(1);
      }
      out.push_back(std::move(tokenizer).value());
    }
    return out;
  }();
  return loaded;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;  // NOLINT(google-build-using-namespace)
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const Tokenizer& tokenizer = tokenizers()[mode & 1];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((mode & 2) == 0) {
    const bool parse_special = (mode & 4) != 0;
    auto ids = tokenizer.encode(rest, {.add_special_tokens = true, .parse_special = parse_special});
    if (ids.is_ok()) {
      auto text = tokenizer.decode(*ids);
      // byte-level BPE gives back exactly the valid UTF-8 it was given, but for the bytes
      // SmolLM2's vocabulary lacks (a few C0 controls, 4-byte lead bytes from 0xF1), which it
      // drops as HF does
      const bool all_bytes_in_vocab = std::all_of(rest.begin(), rest.end(), [](char c) {
        const auto b = static_cast<unsigned char>(c);
        return (b >= 0x20 || b == '\t' || b == '\n' || b == '\r') && b < 0xF1;
      });
      if ((mode & 1) == 0 && !parse_special && all_bytes_in_vocab && text.is_ok() &&
          text->find(rest) == std::string::npos) {
        std::fprintf(stderr, "tokenizer_fuzz: decode(encode(text)) lost the text\n");
        std::abort();
      }
    }
    return 0;
  }
  std::vector<TokenId> ids(rest.size() / sizeof(TokenId));
  if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * sizeof(TokenId));
  (void)tokenizer.decode(ids, /*skip_special=*/(mode & 4) != 0);
  IncrementalDetokenizer detokenizer(tokenizer, (mode & 4) != 0);
  for (TokenId id : ids) (void)detokenizer.push(id);
  (void)detokenizer.finish();
  return 0;
}
