// Cache files: one sequence's tokens and KV cache on disk (DESIGN.md §3 "Cache files"; the
// byte-by-byte format is in docs/cache-files.md).
//
//   magic · version · model fingerprint (architecture, weight hash) · cache spec (layers, KV
//   heads, head_dim, dtype, per-layer attention) · token ids · per layer K then V of every kept
//   token, contiguous [tokens][kv_heads] head vectors (int8 / fp8: [head_dim] codes, then the f16
//   scale; cache/kv_quant.h) · xxh3-64 of everything before it
//
// The file's KV dtype need not be the pool's: scatter_into converts each head vector through f32
// (f32, bf16, f16, int8, fp8 in any direction); a file of the pool's dtype is copied exactly.
//
// No block size is stored: a file written from a pool of block size 16 loads into a pool of
// block size 256 (or 1) through HostKvStorage::scatter_layer. A windowed layer stores only the
// last min(num_tokens, W) tokens, all a window-W attention can still see.
//
// Writing goes to a temporary file in the same directory, fsync'd, then renamed over the target:
// a crash leaves the old file or the new one, never half of one.
//
// Reading validates everything — size, magic, version, checksum, fingerprint, geometry —
// before a single byte reaches a pool; a refused file leaves the pool exactly as it was.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cache/cache_spec.h"
#include "cache/host_kv_storage.h"
#include "common/ids.h"
#include "common/status.h"

namespace kvp {

// Which model a cache belongs to, beyond its geometry (which the cache spec carries).
struct ModelFingerprint {
  std::string architecture;  // e.g. CacheSpec::architecture(); 1..255 bytes
  uint64_t weight_hash = 0;  // supplied by the caller: a hash of the model's weights
  friend bool operator==(const ModelFingerprint&, const ModelFingerprint&) = default;
};

inline constexpr uint32_t kCacheFileVersion = 1;

// Writes the tokens and KV of one sequence held in `storage`. block_tables[g] is the sequence's
// logical block table in group g (see host_kv_storage.h); it must cover the tokens group g keeps
// (all of them, or the last min(n, W) for a window W). Does not modify the storage.
// InvalidArgument for a bad fingerprint or tables that do not cover the tokens; IoError if the
// file cannot be written (the target is then untouched).
Status write_cache_file(const std::filesystem::path& path, const ModelFingerprint& fingerprint,
                        const HostKvStorage& storage, std::span<const int32_t> token_ids,
                        std::span<const std::vector<BlockId>> block_tables);

// A cache file read into memory and validated against the model that runs.
class CacheFile {
 public:
  // Reads and checks the whole file. Errors name the file and the reason:
  //   NotFound (no such file), IoError (unreadable), Corruption (wrong magic, truncated, trailing
  //   bytes, checksum mismatch, impossible header values), Unsupported (a newer format version),
  //   Mismatch (another model: architecture, weight hash or geometry differ from `expected` /
  //   `running_spec`; neither block size nor KV dtype is compared).
  static Result<CacheFile> read(const std::filesystem::path& path, const ModelFingerprint& expected,
                                const CacheSpec& running_spec);

  const ModelFingerprint& fingerprint() const { return fingerprint_; }
  const CacheSpec& spec() const { return spec_; }
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids_.size()); }
  std::span<const int32_t> token_ids() const { return token_ids_; }
  // First token a group keeps: 0 for a global group, num_tokens - min(num_tokens, W) for a
  // window W. A table for the group needs entries [token_begin / block_size,
  // ceil(num_tokens / block_size)).
  int64_t group_token_begin(int32_t group) const;

  // Checks that block_tables (one per group of storage) cover what each group keeps with ids
  // of that group's pool, and that storage has this file's geometry (any KV dtype).
  // InvalidArgument otherwise.
  // Does not modify anything.
  Status check_tables(const HostKvStorage& storage,
                      std::span<const std::vector<BlockId>> block_tables) const;
  // Writes every layer's K and V into the blocks of the tables (re-blocking to storage's block
  // size, converting to storage's KV dtype). requires: check_tables(storage, block_tables).is_ok().
  void scatter_into(HostKvStorage& storage,
                    std::span<const std::vector<BlockId>> block_tables) const;

 private:
  CacheFile(ModelFingerprint fingerprint, CacheSpec spec, std::vector<int32_t> token_ids,
            std::vector<std::byte> data, std::vector<size_t> layer_offsets);

  ModelFingerprint fingerprint_;
  CacheSpec spec_;                     // the file's geometry, block size of the running spec
  std::vector<int32_t> token_ids_;     // [num_tokens]
  std::vector<std::byte> data_;        // the whole file
  std::vector<size_t> layer_offsets_;  // [num_layers] byte offset of each layer's K in data_
};

// read, check_tables, scatter_into: loads a file into blocks the caller allocated, or refuses
// it and leaves the storage exactly as it was. On success, *token_ids (if not null) receives the
// file's tokens.
Status load_cache_file(const std::filesystem::path& path, const ModelFingerprint& expected,
                       HostKvStorage& storage, std::span<const std::vector<BlockId>> block_tables,
                       std::vector<int32_t>* token_ids = nullptr);

}  // namespace kvp
