// TempDir: a fresh directory under the system's temporary directory (mkdtemp, so parallel test
// processes never share one), removed with everything in it when the TempDir goes.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>

#include "common/check.h"

namespace kvp::test {

class TempDir {
 public:
  // name: a word in the directory's name, to tell the tests' directories apart
  explicit TempDir(std::string_view name = "test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("kvp-" + std::string(name) + "-XXXXXX"))
            .string();
    KVP_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp {} failed", pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Entries directly in the directory.
  int num_files() const {
    return static_cast<int>(std::distance(std::filesystem::directory_iterator(path_),
                                          std::filesystem::directory_iterator()));
  }

 private:
  std::filesystem::path path_;
};

}  // namespace kvp::test
