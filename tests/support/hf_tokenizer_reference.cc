#include "support/hf_tokenizer_reference.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

namespace kvp::test {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

// Runs the reference script once for the whole test program; "" if it could not run.
// `*missing` is true when the inputs are absent (skip); a script that fails is an error.
const fs::path& tokenizer_reference_dir(std::string* why_not, bool* missing) {
  static std::string error;
  static bool inputs_missing = false;
  static const fs::path dir = [] {
    if (!fs::exists(kPython)) {
      error = std::string(kPython) + " not found (run from the repo root after setup)";
      inputs_missing = true;
      return fs::path();
    }
    if (!fs::exists(kSmolLm) || !fs::exists(kGemma)) {
      error = "models/ does not hold the two GGUF models (scripts/fetch_models.sh)";
      inputs_missing = true;
      return fs::path();
    }
    // One reference run serves every test process (ctest runs each test on its own): the
    // output is cached under a name keyed by the script and the corpus, and published with an
    // atomic rename so a concurrent run never sees a half-written directory.
    const size_t key = std::hash<std::string>{}(read_file("tests/tokenizer/hf_reference.py") +
                                                read_file("tests/tokenizer/corpus.txt"));
    const fs::path cached = fs::temp_directory_path() / fmt::format("kvp_tokenizer_ref_{:x}", key);
    if (fs::exists(cached / "done")) return cached;
    std::string templ = (fs::temp_directory_path() / "kvp_tokenizer_ref_XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) {
      error = "mkdtemp failed";
      return fs::path();
    }
    const std::string command =
        std::string(kPython) + " tests/tokenizer/hf_reference.py --out " + templ;
    if (std::system(command.c_str()) != 0) {
      error = "reference script failed: " + command;
      return fs::path();
    }
    std::ofstream(fs::path(templ) / "done") << "ok\n";
    std::error_code ec;
    fs::rename(templ, cached, ec);
    if (ec) fs::remove_all(templ, ec);  // another process published first
    return cached;
  }();
  *why_not = error;
  *missing = inputs_missing;
  return dir;
}

std::vector<TokenizerCase> read_tokenizer_cases(const fs::path& file) {
  std::vector<TokenizerCase> cases;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    cases.push_back({j.at("text").get<std::string>(), j.at("ids").get<std::vector<int32_t>>(),
                     j.at("ids_plain").get<std::vector<int32_t>>(),
                     j.at("decoded").get<std::string>(),
                     j.at("ids_literal").get<std::vector<int32_t>>()});
  }
  return cases;
}

size_t count_corpus_lines() {
  std::ifstream in("tests/tokenizer/corpus.txt", std::ios::binary);
  std::string line;
  size_t num_lines = 0;
  while (std::getline(in, line)) ++num_lines;
  return num_lines;
}

}  // namespace kvp::test
