// Opens a model for the runner from what a user points at: a Hugging Face directory
// (config.json + model.safetensors or a sharded index). GGUF files join here with the GGUF
// reader.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model_runner.h"

namespace kvp {

// Reads the spec and every weight (as f32). Errors name the file and the problem: a missing
// config.json, an unsupported architecture, a missing or misshapen tensor.
// pool: attention threads for the runner (not owned; may be null).
Result<std::unique_ptr<ModelRunner>> load_model(const std::string& path, ThreadPool* pool);

}  // namespace kvp
