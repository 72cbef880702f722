// Fuzz target: safetensors files. Parses arbitrary bytes as a safetensors file held in memory
// (8-byte header size, JSON header, data) and, when that succeeds, describes it and converts
// every small F32/F16/BF16 tensor to f32. Anything but a Status is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;  // NOLINT(google-build-using-namespace)
  auto file = SafetensorsFile::open(
      MappedFile::from_bytes("fuzz.safetensors", std::vector<uint8_t>(data, data + size)));
  if (!file.is_ok()) return 0;
  (void)file->describe(64);
  std::vector<float> out;
  for (const SafetensorsTensor& t : file->tensors()) {
    if (!t.dtype.has_value() || t.num_elements > (1u << 20)) continue;
    out.resize(t.num_elements);
    (void)file->to_f32(t, out);
  }
  return 0;
}
