// Fuzz target: Hugging Face config.json. Arbitrary bytes as JSON text, read by the three
// readers of config.json: the model runner's ModelSpec, inspect's ModelConfig and the pool
// planner's CacheSpec. Anything but a Status is a bug.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "cache/cache_spec.h"
#include "model/model_config.h"
#include "model/model_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;  // NOLINT(google-build-using-namespace)
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)CacheSpec::from_hf_config_text(text, "fuzz/config.json");
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  (void)model_spec_from_hf_config(config, "fuzz/config.json");
  (void)model_config_from_hf(config, "fuzz/config.json");
  return 0;
}
