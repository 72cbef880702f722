// Running a GGUF model file: its ModelSpec from the metadata, its weights under the Hugging Face
// names the model code asks for, and its tokenizer from `tokenizer.ggml.*`.
//
// llama.cpp's converter changes three things that matter here (convert_hf_to_gguf.py):
//   - Llama q/k projection rows are permuted within each head so that rope rotates adjacent
//     pairs: kvpool runs such models with RopeStyle::kInterleaved (same attention scores).
//   - Gemma norm weights are stored as 1 + w: kvpool applies them as plain RMS norm weights.
//   - Llama 3 rope scaling is stored as per-frequency divisors (`rope_freqs.weight`).
// Gemma 3 facts GGUF does not store are taken as llama.cpp takes them: sliding layers are all
// but every 6th, the sliding layers' rope base is 10000, attention scale 1/sqrt(head_dim).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/gguf_file.h"
#include "model/model_spec.h"
#include "model/weight_source.h"
#include "tokenizer/vocab.h"

namespace kvp {

// Unsupported naming the file for architectures other than llama, qwen2, qwen3, qwen3moe,
// gemma3 (and for
// partial rotary dimensions); the reader's errors for missing or inconsistent keys.
Result<ModelSpec> model_spec_from_gguf(const GgufFile& file);

// tokenizer.ggml.* as a TokenizerVocab (missing add_bos / add_space_prefix default as
// llama.cpp defaults them). Errors name the file and key.
Result<TokenizerVocab> tokenizer_vocab_from_gguf(const GgufFile& file);

class GgufWeights : public WeightSource {
 public:
  // `file` is shared with whoever else reads it (tokenizer, inspect).
  GgufWeights(std::shared_ptr<const GgufFile> file, Architecture architecture);

  bool contains(const std::string& name) const override;
  Result<std::vector<float>> read_f32(const std::string& name,
                                      std::span<const int64_t> shape) const override;
  // In place in the file's mapping for every block format quant::matmul reads.
  Result<StoredMatrix> read_matrix(const std::string& name, int64_t rows,
                                   int64_t cols) const override;
  // Slices of blk.{layer}.ffn_{gate,up,down}_exps.weight [num_experts][rows][cols] (ggml's
  // dims innermost first: cols, rows, experts), in place where matmul reads the type.
  Result<std::vector<StoredMatrix>> read_experts(int32_t layer, const std::string& projection,
                                                 int32_t num_experts, int64_t rows,
                                                 int64_t cols) const override;
  std::string describe() const override { return file_->path(); }

  // The GGUF name of a Hugging Face tensor name ("model.layers.3.mlp.up_proj.weight" →
  // "blk.3.ffn_up.weight"), or "" when there is none.
  std::string gguf_name(const std::string& hf_name) const;

 private:
  // The tensor named `name` (Hugging Face name), checked to have `shape` (outermost first).
  Result<const GgufTensor*> find(const std::string& name, std::span<const int64_t> shape) const;

  std::shared_ptr<const GgufFile> file_;
  Architecture architecture_;
};

}  // namespace kvp
