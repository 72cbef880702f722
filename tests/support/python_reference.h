// Runs a reference script with the repo's Python (.venv/bin/python, from the repo root) once per
// script and inputs, and caches its output file under the temp directory keyed by the script's
// and the inputs' content, so every test process (ctest runs each test on its own) shares one
// run. Used by the tests that compare with jinja2 and transformers at test time.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kvp::test {

struct PythonReference {
  std::filesystem::path output;  // the script's output file; empty when it did not run
  bool missing = false;          // .venv/bin/python is absent: skip, do not fail
  std::string error;             // why it did not run
};

// Runs `.venv/bin/python <script> <inputs...> <large_inputs...> <output>` unless a cached
// output exists. `name` names the cache entry ("jinja2_cases"); the cache key covers the script
// and the content of `inputs`, and only the paths of `large_inputs` (model files).
PythonReference run_python_reference(const std::string& name, const std::string& script,
                                     const std::vector<std::string>& inputs,
                                     const std::vector<std::string>& large_inputs = {});

// The whole file, "" when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace kvp::test
