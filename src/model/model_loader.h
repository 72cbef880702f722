// Opens a model from what a user points at: a GGUF file (llama.cpp's format: weights, metadata
// and tokenizer in one file) or a Hugging Face directory (config.json + model.safetensors or a
// sharded index, tokenizer.json).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace kvp {

// Reads the spec and every weight (as f32). Errors name the file and the problem: not a GGUF
// file or a model directory, an unsupported architecture, a missing or misshapen tensor.
// pool: attention threads for the runner (not owned; may be null).
Result<std::unique_ptr<ModelRunner>> load_model(const std::string& path, ThreadPool* pool,
                                                const LoadProgress& progress = {});

// The model's tokenizer: from a GGUF file's tokenizer.ggml.* metadata, or a directory's
// tokenizer.json. NotFound when a directory has none.
Result<Tokenizer> load_tokenizer(const std::string& path);

// Whether `path` is a GGUF file (by its magic bytes).
bool is_gguf_file(const std::string& path);

}  // namespace kvp
