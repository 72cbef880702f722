// Fuzz target: GGUF weight files. Parses arbitrary bytes as a GGUF file held in memory, and when
// that succeeds goes on as `kvpool inspect` and `kvpool generate` do: the summary, every
// metadata value, the ModelConfig and ModelSpec, the tokenizer vocabulary and a tokenizer built
// from it (encode and decode), and a row of every tensor kvpool can dequantise.
// Anything but a Status (a crash, a sanitizer report, a leak, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/gguf_file.h"
#include "model/gguf_model.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;  // NOLINT(google-build-using-namespace)
  auto file =
      GgufFile::open(MappedFile::from_bytes("fuzz.gguf", std::vector<uint8_t>(data, data + size)));
  if (!file.is_ok()) return 0;
  (void)file->describe(64);
  (void)model_config_from_gguf(*file);
  (void)model_spec_from_gguf(*file);
  auto vocab = tokenizer_vocab_from_gguf(*file);
  if (vocab.is_ok()) {
    auto tokenizer = Tokenizer::from_gguf_vocab(std::move(vocab).value());
    if (tokenizer.is_ok()) {
      auto ids = tokenizer->encode("Hello world, <|im_start|> 123 héllo\n\n  x");
      if (ids.is_ok()) (void)tokenizer->decode(*ids);
    }
  }
  std::vector<float> row;
  for (const GgufTensor& t : file->tensors()) {
    if (!can_dequantize(t.type) || t.num_rows() == 0 || t.row_elements() > (1u << 20)) continue;
    row.resize(t.row_elements());
    (void)file->dequantize_row(t, t.num_rows() - 1, row);
  }
  return 0;
}
