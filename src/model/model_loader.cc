#include "model/model_loader.h"

#include <filesystem>

#include "model/safetensors_weights.h"

namespace kvp {

Result<std::unique_ptr<ModelRunner>> load_model(const std::string& path, ThreadPool* pool) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::not_found("model '{}': no such file or directory", path);
  if (!fs::is_directory(path, ec)) {
    return Status::unsupported(
        "model '{}': expected a Hugging Face model directory (config.json + *.safetensors)", path);
  }
  KVP_ASSIGN_OR_RETURN(ModelSpec spec, load_hf_config((fs::path(path) / "config.json").string()));
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWeights> weights_file,
                       SafetensorsWeights::open(path));
  KVP_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(spec, *weights_file));
  return std::make_unique<ModelRunner>(std::move(spec), std::move(weights), pool);
}

}  // namespace kvp
