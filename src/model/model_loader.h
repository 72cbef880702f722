// Opens a model from what a user points at: a GGUF file (llama.cpp's format: weights, metadata
// and tokenizer in one file) or a Hugging Face directory (config.json + model.safetensors or a
// sharded index, tokenizer.json), as a ModelRunner (CPU) or as a ForwardBackend on a device.
//
//   load_backend(path, "cpu")   → CpuForwardBackend over load_model's runner
//   load_backend(path, "cuda")  → kvp::cuda::make_cuda_backend (builds with KVP_HAVE_CUDA only;
//                                 the weights are read once and uploaded, nothing is kept)
//   make_random_backend(shape, device, seed)  → a named shape (random_model.h), random weights
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/forward_backend.h"
#include "model/model_runner.h"
#include "model/weight_source.h"
#include "tokenizer/tokenizer.h"

namespace kvp {

// Reads the spec and every weight (as f32). Errors name the file and the problem: not a GGUF
// file or a model directory, an unsupported architecture, a missing or misshapen tensor.
// pool: attention threads for the runner (not owned; may be null).
Result<std::unique_ptr<ModelRunner>> load_model(const std::string& path, ThreadPool* pool,
                                                const LoadProgress& progress = {});

// A model's spec and where its weights are read from (the file stays open while `weights` lives).
struct OpenedModel {
  ModelSpec spec;
  std::unique_ptr<WeightSource> weights;
};
// Opens a GGUF file or a Hugging Face directory; errors as load_model's.
Result<OpenedModel> open_model(const std::string& path);

// Where a model runs: "cpu", "cuda" (GPU 0) or "cuda:N".
struct Device {
  enum class Kind { kCpu, kCuda } kind = Kind::kCpu;
  int32_t index = 0;  // CUDA device ordinal
};
// invalid_argument naming the string and the accepted forms for anything else.
Result<Device> parse_device(const std::string& text);

// The model at `path` on `device` (parse_device). pool: the CPU backend's attention threads
// (not owned; may be null; unused on CUDA). Errors: parse_device's and load_model's; on CUDA
// the CUDA backend's; "cuda" in a build without CUDA → unsupported "kvpool was built without
// CUDA (make cuda)". tensor_parallel > 1 splits the model (model/tensor_parallel.h) over that
// many GPUs from the device's index on, or on cpu over as many threads (an emulation, for tests).
Result<std::unique_ptr<ForwardBackend>> load_backend(const std::string& path,
                                                     const std::string& device, ThreadPool* pool,
                                                     const LoadProgress& progress = {},
                                                     int32_t tensor_parallel = 1);

// f32 weights the CPU backend accepts for a random model (more would take minutes to make up
// and most of a machine's memory: llama3-8b needs 32 GB).
constexpr uint64_t kMaxRandomCpuWeightBytes = uint64_t{4} << 30;

// A model of a named shape (random_model.h) with random weights, deterministic in seed.
// Errors: an unknown shape (not_found, naming the known ones), a bad device; on cpu a shape
// whose f32 weights exceed kMaxRandomCpuWeightBytes (invalid_argument naming its size);
// on cuda as load_backend; tensor_parallel as load_backend's (every rank's weights equal the
// unsplit model's of the same seed).
Result<std::unique_ptr<ForwardBackend>> make_random_backend(const std::string& shape,
                                                            const std::string& device,
                                                            uint64_t seed, ThreadPool* pool,
                                                            int32_t tensor_parallel = 1);

// The model's tokenizer: from a GGUF file's tokenizer.ggml.* metadata, a directory's
// tokenizer.json (a whole model's or not), or a tokenizer.json file named itself. NotFound when
// a model directory has none.
Result<Tokenizer> load_tokenizer(const std::string& path);

// Whether `path` is a GGUF file (by its magic bytes).
bool is_gguf_file(const std::string& path);

}  // namespace kvp
