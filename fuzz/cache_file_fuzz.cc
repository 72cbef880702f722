// Fuzz target: cache files (docs/cache-files.md). Arbitrary bytes are written to an in-memory
// file (memfd) and read as a cache file of a small running model: 3 layers, the middle one with
// a window of 8 tokens, 2 KV heads x head_dim 4, f32, block size 4. When the first input byte
// is odd, the last 8 bytes are first replaced by the right checksum of the rest, so mutations
// get past the checksum to the geometry, token and re-blocking code. A file that is accepted
// is scattered into a host pool of the blocks it needs. Anything but a Status is a bug.
#define XXH_INLINE_ALL
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cache/cache_file.h"

namespace {

const kvp::CacheSpec& running_spec() {
  static const kvp::CacheSpec spec =
      kvp::CacheSpec::create("testarch", 3, 2, 4, kvp::DType::F32, 4,
                             {kvp::LayerAttention::global(), kvp::LayerAttention::sliding(8),
                              kvp::LayerAttention::global()})
          .value();
  return spec;
}

const kvp::ModelFingerprint kModel{"testarch", 0x0123456789abcdefull};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;  // NOLINT(google-build-using-namespace)
  if (size == 0) return 0;
  std::vector<uint8_t> bytes(data + 1, data + size);
  if ((data[0] & 1) != 0 && bytes.size() >= 8) {
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
  }
  static const int fd = memfd_create("kvp_cache_file_fuzz", 0);
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    std::abort();
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto file = CacheFile::read(path, kModel, running_spec());
  if (!file.is_ok()) return 0;
  // the blocks each group needs, as the engine sizes them (engine_tiers.cc read_file)
  const int32_t block_size = running_spec().block_size();
  const auto num_entries = static_cast<int32_t>((file->num_tokens() + block_size - 1) / block_size);
  std::vector<int32_t> num_blocks;
  std::vector<std::vector<BlockId>> tables;
  for (int32_t g = 0; g < running_spec().num_groups(); ++g) {
    const auto first = static_cast<int32_t>(file->group_token_begin(g) / block_size);
    num_blocks.push_back(num_entries - first);
    std::vector<BlockId> table(num_entries, BlockId{-1});
    for (int32_t i = first; i < num_entries; ++i) table[i] = BlockId{i - first};
    tables.push_back(std::move(table));
  }
  auto storage = HostKvStorage::create(running_spec(), num_blocks);
  if (!storage.is_ok()) return 0;
  if (file->check_tables(*storage, tables).is_ok()) file->scatter_into(*storage, tables);
  return 0;
}
