// The Hugging Face `tokenizers` reference for the tokenizer parity tests: at test time
// tests/tokenizer/hf_reference.py (with .venv/bin/python, from the repo root) builds HF tokenizers
// from the two real GGUF models' embedded vocabularies, saves them as tokenizer.json and encodes
// every line of tests/tokenizer/corpus.txt, the whole corpus and random texts with HF. The output
// is cached per script and corpus content, shared by every test process.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kvp::test {

inline constexpr const char* kPython = ".venv/bin/python";
inline constexpr const char* kSmolLm = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr const char* kGemma = "models/gemma-3-270m-q4_k_m.gguf";
inline constexpr size_t kNumRandomCases = 400;  // NUM_RANDOM in hf_reference.py

struct TokenizerCase {
  std::string text;
  std::vector<int32_t> ids;          // HF encode(text)
  std::vector<int32_t> ids_plain;    // HF encode(text, add_special_tokens=False)
  std::string decoded;               // HF decode(ids_plain, skip_special_tokens=False)
  std::vector<int32_t> ids_literal;  // HF encode(text) with encode_special_tokens=True
};

// Runs the reference script once per process; "" if it could not run. `*missing` is true when
// the inputs are absent (skip); a script that fails is an error.
const std::filesystem::path& tokenizer_reference_dir(std::string* why_not, bool* missing);

// The cases of <dir>/<name>/expected.jsonl.
std::vector<TokenizerCase> read_tokenizer_cases(const std::filesystem::path& file);

size_t count_corpus_lines();

}  // namespace kvp::test
