#include "model/model_loader.h"

#include <filesystem>
#include <fstream>

#include "model/gguf_model.h"
#include "model/safetensors_weights.h"

namespace kvp {

namespace fs = std::filesystem;

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

Result<std::unique_ptr<ModelRunner>> load_model(const std::string& path, ThreadPool* pool,
                                                const LoadProgress& progress) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return Status::not_found("model '{}': no such file or directory", path);
  }
  if (fs::is_regular_file(path, ec) && is_gguf_file(path)) {
    KVP_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(path));
    auto file = std::make_shared<const GgufFile>(std::move(gguf));
    KVP_ASSIGN_OR_RETURN(ModelSpec spec, model_spec_from_gguf(*file));
    const GgufWeights weights_file(file, spec.architecture);
    KVP_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(spec, weights_file, progress));
    return std::make_unique<ModelRunner>(std::move(spec), std::move(weights), pool);
  }
  if (!fs::is_directory(path, ec)) {
    return Status::unsupported(
        "model '{}': expected a GGUF file or a Hugging Face model directory (config.json + "
        "*.safetensors)",
        path);
  }
  KVP_ASSIGN_OR_RETURN(ModelSpec spec, load_hf_config((fs::path(path) / "config.json").string()));
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWeights> weights_file,
                       SafetensorsWeights::open(path));
  KVP_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(spec, *weights_file, progress));
  return std::make_unique<ModelRunner>(std::move(spec), std::move(weights), pool);
}

Result<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && is_gguf_file(path)) {
    KVP_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
    KVP_ASSIGN_OR_RETURN(TokenizerVocab vocab, tokenizer_vocab_from_gguf(file));
    return Tokenizer::from_gguf_vocab(std::move(vocab));
  }
  const fs::path json = fs::path(path) / "tokenizer.json";
  if (!fs::is_directory(path, ec) || !fs::exists(json, ec)) {
    return Status::not_found(
        "model '{}': no tokenizer (a GGUF file, or a directory with "
        "tokenizer.json)",
        path);
  }
  return Tokenizer::from_tokenizer_json(json.string());
}

}  // namespace kvp
