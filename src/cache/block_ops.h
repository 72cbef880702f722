// Byte-moving operations that bookkeeping asks a backend to carry out. The cache module never
// touches KV bytes: it returns these, and a backend (CPU or CUDA) or the host storage executes
// them. A list of operations must be executed in order: a later operation may reuse a block
// that an earlier one read from. `group` names the cache group (its pools and its layers) an
// operation applies to; models with one group use 0.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/ids.h"

namespace kvp {

// Copy every layer's K and V of block `src` into block `dst` of the same pool
// (copy-on-write of a shared, partially filled block).
struct BlockCopy {
  BlockId src;
  BlockId dst;
  int32_t group = 0;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

// Where a block lives: the device KV pool, or the host (CPU memory) pool of offloaded blocks.
enum class Pool : uint8_t { Device, Host };

// Copy every layer's K and V of one block between pools (offload: Device -> Host; restore:
// Host -> Device).
struct BlockTransfer {
  Pool src_pool = Pool::Device;
  BlockId src;
  Pool dst_pool = Pool::Host;
  BlockId dst;
  int32_t group = 0;
  friend bool operator==(const BlockTransfer&, const BlockTransfer&) = default;
};

// Write one cache group's KV of a session to its cache file: blocks[i] holds positions
// [first_position + i*B, first_position + (i+1)*B) (B the group's block size) of the session's
// num_tokens tokens; token_ids go into the file too. A session of several groups gets one
// SaveToDisk per group, same path. first_position > 0 only for sliding-window groups (earlier
// positions were dropped); it is a multiple of B.
struct SaveToDisk {
  SessionId session;
  std::string path;
  Pool src_pool = Pool::Device;
  std::vector<BlockId> blocks;     // [ceil(num_tokens / B) - first_position / B]
  std::vector<int32_t> token_ids;  // [num_tokens]
  int32_t num_tokens = 0;
  int32_t first_position = 0;
  int32_t group = 0;
  friend bool operator==(const SaveToDisk&, const SaveToDisk&) = default;
};

// Read one group's positions [first_position, num_tokens) of a session's cache file into
// blocks: blocks[i] receives positions [first_position + i*B, first_position + (i+1)*B).
// first_position is a multiple of B (earlier positions came from the prefix cache, or are
// behind a sliding window).
struct LoadFromDisk {
  SessionId session;
  std::string path;
  Pool dst_pool = Pool::Device;
  std::vector<BlockId> blocks;  // [ceil(num_tokens / B) - first_position / B]
  int32_t first_position = 0;
  int32_t num_tokens = 0;
  int32_t group = 0;
  friend bool operator==(const LoadFromDisk&, const LoadFromDisk&) = default;
};

// Delete a cache file that no session needs any more.
struct RemoveFile {
  std::string path;
  friend bool operator==(const RemoveFile&, const RemoveFile&) = default;
};

using CacheOp = std::variant<BlockCopy, BlockTransfer, SaveToDisk, LoadFromDisk, RemoveFile>;

}  // namespace kvp
