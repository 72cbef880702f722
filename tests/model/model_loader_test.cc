// model_loader.h's devices: a model on "cpu" is a CpuForwardBackend, "cuda" in a build without
// CUDA and unknown devices get errors that name them, random shapes too large for the CPU are
// refused before anything is allocated.
#include "model/model_loader.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace kvp {
namespace {

const char* kLlama = "tests/model/fixtures/tiny/llama";

TEST(ModelLoader, ParsesCpuCudaAndCudaOrdinals) {
  EXPECT_EQ(parse_device("cpu")->kind, Device::Kind::kCpu);
  EXPECT_EQ(parse_device("cuda")->kind, Device::Kind::kCuda);
  EXPECT_EQ(parse_device("cuda")->index, 0);
  EXPECT_EQ(parse_device("cuda:3")->index, 3);
  for (const char* bad : {"", "CPU", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "tpu"}) {
    auto device = parse_device(bad);
    ASSERT_FALSE(device.is_ok()) << bad;
    EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(device.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << device.status().to_string();
  }
}

TEST(ModelLoader, LoadsACpuBackendWithTheModelsSpec) {
  auto backend = load_backend(kLlama, "cpu", nullptr);
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  auto config = load_hf_config(std::string(kLlama) + "/config.json");
  ASSERT_TRUE(config.is_ok());
  EXPECT_EQ((*backend)->device_name(), "cpu");
  EXPECT_EQ((*backend)->spec().num_layers, config->num_layers);
  EXPECT_EQ((*backend)->spec().vocab_size, config->vocab_size);
  EXPECT_EQ((*backend)->num_cache_groups(), 1);
}

TEST(ModelLoader, UnknownDevicesAndMissingModelsAreRefused) {
  auto backend = load_backend(kLlama, "tpu", nullptr);
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("device 'tpu'"), std::string::npos);
  backend = load_backend("/nonexistent/model", "cpu", nullptr);
  EXPECT_EQ(backend.status().code(), StatusCode::kNotFound);
  EXPECT_NE(backend.status().message().find("/nonexistent/model"), std::string::npos);
}

// A missing path, an empty file, a 3-byte file and a directory without config.json each say
// what they are, for the weights and for the tokenizer alike (they all said "no tokenizer").
TEST(ModelLoader, PathsThatAreNoModelSayWhatTheyAre) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvp_loader_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "empty_dir");
  std::ofstream(dir / "empty.gguf").close();
  std::ofstream(dir / "three.bin") << "GGU";
  struct Case {
    std::string path;
    StatusCode code;
    std::string says;
  };
  const Case cases[] = {
      {(dir / "missing.gguf").string(), StatusCode::kNotFound, "missing.gguf' does not exist"},
      {(dir / "empty.gguf").string(), StatusCode::kUnsupported,
       "empty.gguf' is not a GGUF file (0 bytes, too short for the 4-byte magic 'GGUF')"},
      {(dir / "three.bin").string(), StatusCode::kUnsupported,
       "three.bin' is not a GGUF file (3 bytes, too short"},
      {(dir / "empty_dir").string(), StatusCode::kNotFound,
       "empty_dir' is a directory without config.json"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    auto tokenizer = load_tokenizer(c.path);
    ASSERT_FALSE(tokenizer.is_ok());
    EXPECT_EQ(tokenizer.status().code(), c.code);
    EXPECT_NE(tokenizer.status().message().find(c.says), std::string::npos)
        << tokenizer.status().to_string();
    auto backend = load_backend(c.path, "cpu", nullptr);
    ASSERT_FALSE(backend.is_ok());
    EXPECT_EQ(backend.status().code(), c.code);
    EXPECT_NE(backend.status().message().find(c.says), std::string::npos)
        << backend.status().to_string();
  }
  // a model directory without tokenizer.json says that
  auto tokenizer = load_tokenizer(kLlama);
  EXPECT_NE(tokenizer.status().message().find("the directory has no tokenizer.json"),
            std::string::npos)
      << tokenizer.status().to_string();
  fs::remove_all(dir);
}

#if !defined(KVP_HAVE_CUDA)
TEST(ModelLoader, CudaInABuildWithoutCudaIsAClearError) {
  for (const char* device : {"cuda", "cuda:1"}) {
    auto backend = load_backend(kLlama, device, nullptr);
    EXPECT_EQ(backend.status().code(), StatusCode::kUnsupported) << device;
    EXPECT_NE(backend.status().message().find("kvpool was built without CUDA (make cuda)"),
              std::string::npos)
        << backend.status().to_string();
    auto random = make_random_backend("llama3-8b", device, 1, nullptr);
    EXPECT_EQ(random.status().code(), StatusCode::kUnsupported) << device;
  }
}
#endif

TEST(ModelLoader, RandomShapesTooLargeForTheCpuAreRefused) {
  auto backend = make_random_backend("llama3-8b", "cpu", 1, nullptr);
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("llama3-8b"), std::string::npos);
  EXPECT_NE(backend.status().message().find("GiB"), std::string::npos)
      << backend.status().to_string();
  EXPECT_EQ(make_random_backend("nope", "cpu", 1, nullptr).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvp
