#include "support/python_reference.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iterator>

namespace kvp::test {

namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

PythonReference run_python_reference(const std::string& name, const std::string& script,
                                     const std::vector<std::string>& inputs,
                                     const std::vector<std::string>& large_inputs) {
  PythonReference ref;
  const std::string python = ".venv/bin/python";
  if (!fs::exists(python)) {
    ref.missing = true;
    ref.error = python + " not found (run from the repo root after setup)";
    return ref;
  }
  std::string key_text = read_text_file(script);
  for (const std::string& input : inputs) {
    if (!fs::exists(input)) {
      ref.missing = true;
      ref.error = input + " not found";
      return ref;
    }
    key_text += read_text_file(input);
  }
  for (const std::string& input : large_inputs) {
    if (!fs::exists(input)) {
      ref.missing = true;
      ref.error = input + " not found";
      return ref;
    }
    key_text += input;
  }
  // and the day: references may render the date (strftime_now in chat templates), so a cached
  // output is yesterday's rendering after midnight (this failed CI at 00:15 UTC)
  const std::time_t now = std::time(nullptr);
  std::tm day{};
  localtime_r(&now, &day);
  key_text += fmt::format("{}-{}-{}", day.tm_year + 1900, day.tm_mon + 1, day.tm_mday);
  const size_t key = std::hash<std::string>{}(key_text);
  const fs::path cached = fs::temp_directory_path() / fmt::format("kvp_{}_{:x}.json", name, key);
  if (fs::exists(cached)) {
    ref.output = cached;
    return ref;
  }
  // Written under a private name and renamed, so a concurrent run never reads half a file.
  const fs::path partial = cached.string() + fmt::format(".{}.partial", ::getpid());
  std::string command = fmt::format("{} {}", python, script);
  for (const std::string& input : inputs) command += fmt::format(" {}", input);
  for (const std::string& input : large_inputs) command += fmt::format(" {}", input);
  command += fmt::format(" {}", partial.string());
  if (std::system(command.c_str()) != 0 || !fs::exists(partial)) {
    ref.error = fmt::format("reference script failed: {}", command);
    return ref;
  }
  std::error_code ec;
  fs::rename(partial, cached, ec);
  if (ec) {
    ref.error = "cannot publish " + cached.string() + ": " + ec.message();
    return ref;
  }
  ref.output = cached;
  return ref;
}

}  // namespace kvp::test
