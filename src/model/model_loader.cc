#include "model/model_loader.h"

#include <charconv>
#include <filesystem>
#include <fstream>

#include "model/cpu_forward_backend.h"
#include "model/gguf_model.h"
#include "model/random_model.h"
#include "model/safetensors_weights.h"
#include "model/tensor_parallel.h"
#if defined(KVP_HAVE_CUDA)
#include "model/cuda/cuda_forward_backend.h"
#endif

namespace kvp {

namespace fs = std::filesystem;

namespace {

// What a model path points at, or why it is no model.
enum class ModelPathKind { kGguf, kHfDirectory };

Result<ModelPathKind> classify_model_path(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) return Status::not_found("model '{}' does not exist", path);
  if (fs::is_directory(status)) {
    if (!fs::exists(fs::path(path) / "config.json", ec)) {
      return Status::not_found(
          "model '{}' is a directory without config.json (a Hugging Face model directory holds "
          "config.json, *.safetensors and tokenizer.json)",
          path);
    }
    return ModelPathKind::kHfDirectory;
  }
  if (!fs::is_regular_file(status)) {
    return Status::unsupported("model '{}' is not a regular file or a directory", path);
  }
  if (is_gguf_file(path)) return ModelPathKind::kGguf;
  const uintmax_t size_bytes = fs::file_size(path, ec);
  if (ec) return Status::io_error("model '{}': cannot read its size: {}", path, ec.message());
  return Status::unsupported(
      "model '{}' is not a GGUF file ({} bytes{}); expected a GGUF file or a Hugging Face model "
      "directory (config.json + *.safetensors)",
      path, size_bytes, size_bytes < 4 ? ", too short for the 4-byte magic 'GGUF'" : "");
}

}  // namespace

Result<OpenedModel> open_model(const std::string& path) {
  KVP_ASSIGN_OR_RETURN(ModelPathKind kind, classify_model_path(path));
  OpenedModel model;
  if (kind == ModelPathKind::kGguf) {
    KVP_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(path));
    auto file = std::make_shared<const GgufFile>(std::move(gguf));
    KVP_ASSIGN_OR_RETURN(model.spec, model_spec_from_gguf(*file));
    model.weights = std::make_unique<GgufWeights>(file, model.spec.architecture);
    return model;
  }
  KVP_ASSIGN_OR_RETURN(model.spec, load_hf_config((fs::path(path) / "config.json").string()));
  KVP_ASSIGN_OR_RETURN(model.weights, SafetensorsWeights::open(path));
  return model;
}

namespace {

#if !defined(KVP_HAVE_CUDA)
Status no_cuda_build(const std::string& device) {
  return Status::unsupported("device '{}': kvpool was built without CUDA (make cuda)", device);
}
#endif

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

Result<std::unique_ptr<ModelRunner>> load_model(const std::string& path, ThreadPool* pool,
                                                const LoadProgress& progress) {
  KVP_ASSIGN_OR_RETURN(OpenedModel model, open_model(path));
  KVP_ASSIGN_OR_RETURN(ModelWeights weights,
                       load_model_weights(model.spec, *model.weights, progress));
  return std::make_unique<ModelRunner>(std::move(model.spec), std::move(weights), pool);
}

Result<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device{Device::Kind::kCpu, 0};
  if (text == "cuda") return Device{Device::Kind::kCuda, 0};
  constexpr std::string_view kCudaPrefix = "cuda:";
  if (text.starts_with(kCudaPrefix) && text.size() > kCudaPrefix.size()) {
    int32_t index = -1;
    const char* begin = text.data() + kCudaPrefix.size();
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(begin, end, index);
    if (ec == std::errc() && ptr == end && index >= 0) return Device{Device::Kind::kCuda, index};
  }
  return Status::invalid_argument("device '{}': unknown (cpu, cuda or cuda:N)", text);
}

Result<std::unique_ptr<ForwardBackend>> load_backend(const std::string& path,
                                                     const std::string& device, ThreadPool* pool,
                                                     const LoadProgress& progress,
                                                     int32_t tensor_parallel) {
  KVP_ASSIGN_OR_RETURN(Device where, parse_device(device));
  if (where.kind == Device::Kind::kCpu && tensor_parallel > 1) {
    KVP_ASSIGN_OR_RETURN(OpenedModel model, open_model(path));
    return make_cpu_tensor_parallel_backend(model.spec, *model.weights, tensor_parallel);
  }
  if (where.kind == Device::Kind::kCpu) {
    KVP_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, load_model(path, pool, progress));
    return std::unique_ptr<ForwardBackend>(
        std::make_unique<CpuForwardBackend>(std::shared_ptr<ModelRunner>(std::move(runner))));
  }
#if defined(KVP_HAVE_CUDA)
  // the weight source is needed only while the factory uploads the weights
  KVP_ASSIGN_OR_RETURN(OpenedModel model, open_model(path));
  return cuda::make_cuda_backend(model.spec, *model.weights, progress, where.index,
                                 tensor_parallel);
#else
  return no_cuda_build(device);
#endif
}

Result<std::unique_ptr<ForwardBackend>> make_random_backend(const std::string& shape,
                                                            const std::string& device,
                                                            uint64_t seed, ThreadPool* pool,
                                                            int32_t tensor_parallel) {
  KVP_ASSIGN_OR_RETURN(Device where, parse_device(device));
  KVP_ASSIGN_OR_RETURN(ModelSpec spec, random_model_spec(shape));
  KVP_RETURN_IF_ERROR(check_tensor_parallel(spec, tensor_parallel));
  if (where.kind == Device::Kind::kCpu) {
    const uint64_t weight_bytes = model_f32_weight_bytes(spec);
    if (weight_bytes > kMaxRandomCpuWeightBytes) {
      return Status::invalid_argument(
          "random model '{}' on cpu: {:.1f} GiB of f32 weights, more than the {} GiB a random "
          "CPU model may take (use --device cuda, or a smaller shape)",
          shape, static_cast<double>(weight_bytes) / (1 << 30), kMaxRandomCpuWeightBytes >> 30);
    }
    const RandomWeightSource source(spec, seed);
    if (tensor_parallel > 1) return make_cpu_tensor_parallel_backend(spec, source, tensor_parallel);
    KVP_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(spec, source));
    return std::unique_ptr<ForwardBackend>(std::make_unique<CpuForwardBackend>(
        std::make_shared<ModelRunner>(std::move(spec), std::move(weights), pool)));
  }
#if defined(KVP_HAVE_CUDA)
  return cuda::make_random_cuda_backend(spec, seed, where.index, tensor_parallel);
#else
  return no_cuda_build(device);
#endif
}

Result<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  // A folder holding tokenizer.json, or such a file itself, need not be a whole model (serve
  // --random-model --tokenizer)
  if (fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "tokenizer.json", ec)) {
    return Tokenizer::from_tokenizer_json((fs::path(path) / "tokenizer.json").string());
  }
  if (fs::path(path).extension() == ".json" && fs::is_regular_file(path, ec)) {
    return Tokenizer::from_tokenizer_json(path);
  }
  KVP_ASSIGN_OR_RETURN(ModelPathKind kind, classify_model_path(path));
  if (kind == ModelPathKind::kGguf) {
    KVP_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
    KVP_ASSIGN_OR_RETURN(TokenizerVocab vocab, tokenizer_vocab_from_gguf(file));
    return Tokenizer::from_gguf_vocab(std::move(vocab));
  }
  const fs::path json = fs::path(path) / "tokenizer.json";
  if (!fs::exists(json, ec)) {
    return Status::not_found("model '{}': the directory has no tokenizer.json", path);
  }
  return Tokenizer::from_tokenizer_json(json.string());
}

}  // namespace kvp
