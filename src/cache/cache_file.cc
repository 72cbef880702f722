// Cache files: writer (temp file + rename) and validating reader; format in docs/cache-files.md.
#include "cache/cache_file.h"

#define XXH_INLINE_ALL
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "cache/kv_quant.h"
#include "common/checked_math.h"
#include "common/limits.h"

namespace kvp {
namespace {

static_assert(std::endian::native == std::endian::little,
              "cache files are little-endian and written with memcpy");

constexpr char kMagic[8] = {'K', 'V', 'P', 'C', 'A', 'C', 'H', 'E'};
constexpr auto kMaxArchitectureBytes = static_cast<uint32_t>(limits::kArchitectureNameBytes.max);
constexpr auto kMaxLayers = static_cast<uint32_t>(limits::kLayers.max);
constexpr auto kMaxHeads = static_cast<uint32_t>(limits::kHeads.max);
constexpr auto kMaxHeadDim = static_cast<uint32_t>(limits::kHeadDim.max);
constexpr auto kMaxWindow = static_cast<uint32_t>(limits::kSlidingWindow.max);
// magic, version, name length, name, weight hash, 4 geometry words, per-layer words, num_tokens.
constexpr size_t kMaxHeaderBytes = 8 + 4 + 4 + kMaxArchitectureBytes + 8 + 16 + 8 * kMaxLayers + 8;

template <typename T>
void append(std::vector<std::byte>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

std::vector<std::byte> encode_header(const ModelFingerprint& fingerprint, const CacheSpec& spec,
                                     uint64_t num_tokens) {
  std::vector<std::byte> out;
  const auto* magic = reinterpret_cast<const std::byte*>(kMagic);
  out.insert(out.end(), magic, magic + sizeof(kMagic));
  append<uint32_t>(out, kCacheFileVersion);
  append<uint32_t>(out, static_cast<uint32_t>(fingerprint.architecture.size()));
  const auto* name = reinterpret_cast<const std::byte*>(fingerprint.architecture.data());
  out.insert(out.end(), name, name + fingerprint.architecture.size());
  append<uint64_t>(out, fingerprint.weight_hash);
  append<uint32_t>(out, static_cast<uint32_t>(spec.num_layers()));
  append<uint32_t>(out, static_cast<uint32_t>(spec.num_kv_heads()));
  append<uint32_t>(out, static_cast<uint32_t>(spec.head_dim()));
  append<uint32_t>(out, static_cast<uint32_t>(spec.dtype()));
  for (const LayerAttention& a : spec.layer_attention()) {
    append<uint32_t>(out, static_cast<uint32_t>(a.kind));
    append<uint32_t>(out, static_cast<uint32_t>(a.window_tokens));
  }
  append<uint64_t>(out, num_tokens);
  return out;
}

// Checks that block_tables cover, for every group, the tokens [begin_g, num_tokens) it keeps,
// with ids of that group's pool.
Status check_coverage(const HostKvStorage& storage, int64_t num_tokens,
                      std::span<const std::vector<BlockId>> block_tables) {
  const CacheSpec& spec = storage.spec();
  if (static_cast<int64_t>(block_tables.size()) != spec.num_groups()) {
    return Status::invalid_argument("{} block tables for {} cache groups", block_tables.size(),
                                    spec.num_groups());
  }
  for (int32_t g = 0; g < spec.num_groups(); ++g) {
    if (num_tokens == 0) continue;
    const int32_t layer = spec.group(g).layers.front();
    const int64_t begin = num_tokens - spec.kept_tokens(layer, num_tokens);
    const int32_t block_size = storage.layout(g).block_size;
    const int64_t needed = (num_tokens + block_size - 1) / block_size;
    const std::vector<BlockId>& table = block_tables[g];
    if (static_cast<int64_t>(table.size()) < needed) {
      return Status::invalid_argument(
          "block table of group {} has {} entries; {} tokens need {} at block size {}", g,
          table.size(), num_tokens, needed, block_size);
    }
    for (int64_t i = begin / block_size; i < needed; ++i) {
      if (table[i].value < 0 || table[i].value >= storage.layout(g).num_blocks) {
        return Status::invalid_argument("block table of group {}: entry {} is block {} of {}", g, i,
                                        table[i].value, storage.layout(g).num_blocks);
      }
    }
  }
  return Status::ok();
}

// Writes bytes to a FILE and feeds them to the running checksum.
class ChecksummedWriter {
 public:
  explicit ChecksummedWriter(std::FILE* file) : file_(file) { XXH3_64bits_reset(&state_); }
  bool write(std::span<const std::byte> bytes) {
    XXH3_64bits_update(&state_, bytes.data(), bytes.size());
    return bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size();
  }
  uint64_t digest() const { return XXH3_64bits_digest(&state_); }

 private:
  std::FILE* file_;
  XXH3_state_t state_;
};

std::string temp_path_for(const std::filesystem::path& path) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.tmp-{}-{}", path.string(), ::getpid(), counter.fetch_add(1));
}

// Makes the rename durable: fsync of the directory that holds the file (best effort).
void sync_directory(const std::filesystem::path& path) {
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Reads little-endian fields from the bytes of a file; running past the end is "truncated".
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <typename T>
  bool read(T* out) {
    if (pos_ + sizeof(T) > bytes_.size()) return false;
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool read_bytes(size_t count, std::string* out) {
    if (pos_ + count > bytes_.size()) return false;
    out->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), count);
    pos_ += count;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

// Fields of a header, before they are checked against the running model.
struct Header {
  uint32_t version = 0;
  ModelFingerprint fingerprint;
  uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0, dtype_code = 0;
  std::vector<LayerAttention> layer_attention;
  uint64_t num_tokens = 0;
  size_t header_bytes = 0;  // offset of the first token id
};

Status read_file_prefix(const std::filesystem::path& path, std::ifstream& in, size_t count,
                        std::vector<std::byte>* out) {
  const size_t at = out->size();
  out->resize(at + count);
  in.read(reinterpret_cast<char*>(out->data() + at), static_cast<std::streamsize>(count));
  if (static_cast<size_t>(in.gcount()) != count) {
    return Status::io_error("cache file '{}': read {} of {} bytes", path.string(), in.gcount(),
                            count);
  }
  return Status::ok();
}

}  // namespace

Status write_cache_file(const std::filesystem::path& path, const ModelFingerprint& fingerprint,
                        const HostKvStorage& storage, std::span<const int32_t> token_ids,
                        std::span<const std::vector<BlockId>> block_tables) {
  const std::string name = path.string();
  if (fingerprint.architecture.empty() || fingerprint.architecture.size() > kMaxArchitectureBytes) {
    return Status::invalid_argument("cache file '{}': architecture name of {} bytes (1..{})", name,
                                    fingerprint.architecture.size(), kMaxArchitectureBytes);
  }
  const int64_t num_tokens = static_cast<int64_t>(token_ids.size());
  if (Status s = check_coverage(storage, num_tokens, block_tables); !s.is_ok()) {
    return Status::invalid_argument("cache file '{}': {}", name, s.message());
  }
  const CacheSpec& spec = storage.spec();

  const std::string temp = temp_path_for(path);
  std::FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) {
    return Status::io_error("cache file '{}': cannot create '{}': {}", name, temp,
                            std::strerror(errno));
  }
  auto fail = [&](std::string_view what) {
    const std::string reason = std::strerror(errno);
    if (file != nullptr) std::fclose(file);
    std::remove(temp.c_str());
    return Status::io_error("cache file '{}': {}: {}", name, what, reason);
  };

  ChecksummedWriter out(file);
  const std::vector<std::byte> header = encode_header(fingerprint, spec, token_ids.size());
  if (!out.write(header) || !out.write(std::as_bytes(token_ids))) return fail("write failed");
  std::vector<std::byte> k, v;
  for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
    const int64_t kept = spec.kept_tokens(layer, num_tokens);
    k.resize(storage.dense_bytes(kept));
    v.resize(k.size());
    storage.gather_layer(layer, block_tables[spec.group_of_layer(layer)], num_tokens - kept,
                         num_tokens, k, v);
    if (!out.write(k) || !out.write(v)) return fail("write failed");
  }
  const uint64_t checksum = out.digest();
  if (std::fwrite(&checksum, sizeof(checksum), 1, file) != 1) return fail("write failed");
  if (std::fflush(file) != 0 || ::fsync(::fileno(file)) != 0) return fail("flush failed");
  if (std::fclose(file) != 0) {
    file = nullptr;
    return fail("close failed");
  }
  file = nullptr;
  if (std::rename(temp.c_str(), name.c_str()) != 0) return fail("rename failed");
  sync_directory(path);
  return Status::ok();
}

CacheFile::CacheFile(ModelFingerprint fingerprint, CacheSpec spec, std::vector<int32_t> token_ids,
                     std::vector<std::byte> data, std::vector<size_t> layer_offsets)
    : fingerprint_(std::move(fingerprint)),
      spec_(std::move(spec)),
      token_ids_(std::move(token_ids)),
      data_(std::move(data)),
      layer_offsets_(std::move(layer_offsets)) {}

Result<CacheFile> CacheFile::read(const std::filesystem::path& path,
                                  const ModelFingerprint& expected, const CacheSpec& running_spec) {
  const std::string name = path.string();
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec);
  if (!exists) return Status::not_found("cache file '{}': no such file", name);
  if (std::filesystem::is_directory(path, ec)) {
    return Status::io_error("cache file '{}': is a directory", name);
  }
  const uintmax_t file_size = std::filesystem::file_size(path, ec);
  if (ec) return Status::io_error("cache file '{}': cannot stat: {}", name, ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error("cache file '{}': cannot open", name);

  // 1. The header, read first so a huge file that is not ours is refused before it is loaded.
  std::vector<std::byte> data;
  const size_t prefix = static_cast<size_t>(std::min<uintmax_t>(file_size, kMaxHeaderBytes));
  KVP_RETURN_IF_ERROR(read_file_prefix(path, in, prefix, &data));
  Cursor cur(data);
  auto truncated = [&]() {
    return Status::corruption("cache file '{}': truncated: {} bytes end inside the header", name,
                              file_size);
  };
  auto corrupt = [&](std::string reason) {
    return Status::corruption("cache file '{}': {}", name, reason);
  };

  char magic[8];
  if (!cur.read(&magic)) {
    return data.empty() || std::memcmp(data.data(), kMagic, data.size()) == 0
               ? truncated()
               : corrupt("not a kvpool cache file (wrong magic)");
  }
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return corrupt("not a kvpool cache file (wrong magic)");
  }
  Header h;
  if (!cur.read(&h.version)) return truncated();
  if (h.version == 0) return corrupt("format version 0 does not exist");
  if (h.version > kCacheFileVersion) {
    return Status::unsupported(
        "cache file '{}': format version {} is newer than this kvpool reads (up to {})", name,
        h.version, kCacheFileVersion);
  }
  uint32_t name_bytes = 0;
  if (!cur.read(&name_bytes)) return truncated();
  if (name_bytes == 0 || name_bytes > kMaxArchitectureBytes) {
    return corrupt(
        fmt::format("architecture name of {} bytes (1..{})", name_bytes, kMaxArchitectureBytes));
  }
  if (!cur.read_bytes(name_bytes, &h.fingerprint.architecture)) return truncated();
  if (!cur.read(&h.fingerprint.weight_hash) || !cur.read(&h.num_layers) ||
      !cur.read(&h.num_kv_heads) || !cur.read(&h.head_dim) || !cur.read(&h.dtype_code)) {
    return truncated();
  }
  if (h.num_layers == 0 || h.num_layers > kMaxLayers) {
    return corrupt(fmt::format("{} layers (1..{})", h.num_layers, kMaxLayers));
  }
  if (h.num_kv_heads == 0 || h.num_kv_heads > kMaxHeads) {
    return corrupt(fmt::format("{} KV heads (1..{})", h.num_kv_heads, kMaxHeads));
  }
  if (h.head_dim == 0 || h.head_dim > kMaxHeadDim) {
    return corrupt(fmt::format("head_dim {} (1..{})", h.head_dim, kMaxHeadDim));
  }
  if (h.dtype_code > static_cast<uint32_t>(DType::FP8)) {
    return corrupt(fmt::format("unknown dtype code {}", h.dtype_code));
  }
  for (uint32_t l = 0; l < h.num_layers; ++l) {
    uint32_t kind = 0, window = 0;
    if (!cur.read(&kind) || !cur.read(&window)) return truncated();
    if (kind == static_cast<uint32_t>(AttentionKind::Global) && window == 0) {
      h.layer_attention.push_back(LayerAttention::global());
    } else if (kind == static_cast<uint32_t>(AttentionKind::SlidingWindow) && window > 0 &&
               window <= kMaxWindow) {
      h.layer_attention.push_back(LayerAttention::sliding(static_cast<int32_t>(window)));
    } else {
      return corrupt(fmt::format("layer {}: attention kind {} with window {}", l, kind, window));
    }
  }
  if (!cur.read(&h.num_tokens)) return truncated();
  if (h.num_tokens > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return corrupt(fmt::format("{} tokens", h.num_tokens));
  }
  h.header_bytes = cur.pos();

  // 2. The size the header promises, exactly. Each term is bounded by the limits above, but
  // their sum is not: 4096 layers of 2^31 tokens of 4096 x 8192 values pass 2^64.
  const DType dtype = static_cast<DType>(h.dtype_code);
  const uint64_t row_bytes = uint64_t{h.num_kv_heads} * kv_vector_bytes(dtype, h.head_dim);
  std::vector<size_t> layer_offsets;
  std::optional<uint64_t> size = checked_add<uint64_t>(h.header_bytes, 4 * h.num_tokens);
  for (const LayerAttention& a : h.layer_attention) {
    if (size) layer_offsets.push_back(static_cast<size_t>(*size));
    const uint64_t kept =
        a.is_windowed() ? std::min<uint64_t>(h.num_tokens, a.window_tokens) : h.num_tokens;
    const std::optional<uint64_t> layer_bytes = checked_mul<uint64_t>(2 * kept, row_bytes);
    size = size && layer_bytes ? checked_add(*size, *layer_bytes) : std::nullopt;
  }
  if (size) size = checked_add<uint64_t>(*size, sizeof(uint64_t));
  if (!size) {
    return corrupt(fmt::format(
        "the header promises more than 2^64 - 1 bytes ({} tokens, {} layers of {} x {})",
        h.num_tokens, h.num_layers, h.num_kv_heads, h.head_dim));
  }
  const uint64_t expected_size = *size;
  if (file_size < expected_size) {
    return corrupt(
        fmt::format("truncated: {} bytes, the header promises {}", file_size, expected_size));
  }
  if (file_size > expected_size) {
    return corrupt(
        fmt::format("{} bytes, the header promises {} (trailing bytes)", file_size, expected_size));
  }

  // 3. The rest of the file, and its checksum.
  KVP_RETURN_IF_ERROR(read_file_prefix(path, in, file_size - prefix, &data));
  uint64_t stored = 0;
  std::memcpy(&stored, data.data() + data.size() - sizeof(stored), sizeof(stored));
  const uint64_t computed = XXH3_64bits(data.data(), data.size() - sizeof(stored));
  if (stored != computed) {
    return corrupt(
        fmt::format("checksum mismatch (stored {:016x}, computed {:016x})", stored, computed));
  }

  // 4. The model it was made for.
  if (h.fingerprint.architecture != expected.architecture) {
    return Status::mismatch("cache file '{}': made for architecture '{}', running '{}'", name,
                            h.fingerprint.architecture, expected.architecture);
  }
  if (h.fingerprint.weight_hash != expected.weight_hash) {
    return Status::mismatch("cache file '{}': made for weights {:016x}, running {:016x}", name,
                            h.fingerprint.weight_hash, expected.weight_hash);
  }
  Result<CacheSpec> file_spec =
      CacheSpec::create(h.fingerprint.architecture, static_cast<int32_t>(h.num_layers),
                        static_cast<int32_t>(h.num_kv_heads), static_cast<int32_t>(h.head_dim),
                        dtype, running_spec.block_size(), h.layer_attention);
  if (!file_spec.is_ok()) return corrupt(file_spec.status().message());
  std::string why;  // the KV dtype may differ: scatter_into converts
  if (!file_spec->with_dtype(running_spec.dtype()).same_geometry(running_spec, &why)) {
    return Status::mismatch(
        "cache file '{}': geometry differs from the running model: {} (file "
        "vs running)",
        name, why);
  }

  std::vector<int32_t> token_ids(h.num_tokens);
  if (h.num_tokens > 0) {
    std::memcpy(token_ids.data(), data.data() + h.header_bytes, 4 * h.num_tokens);
  }
  return CacheFile(std::move(h.fingerprint), std::move(file_spec).value(), std::move(token_ids),
                   std::move(data), std::move(layer_offsets));
}

int64_t CacheFile::group_token_begin(int32_t group) const {
  return num_tokens() - spec_.kept_tokens(spec_.group(group).layers.front(), num_tokens());
}

Status CacheFile::check_tables(const HostKvStorage& storage,
                               std::span<const std::vector<BlockId>> block_tables) const {
  std::string why;
  if (!storage.spec().same_geometry(spec_.with_dtype(storage.spec().dtype()), &why)) {
    return Status::invalid_argument("storage geometry differs from the cache file's: {}", why);
  }
  return check_coverage(storage, num_tokens(), block_tables);
}

void CacheFile::scatter_into(HostKvStorage& storage,
                             std::span<const std::vector<BlockId>> block_tables) const {
  const Status s = check_tables(storage, block_tables);
  KVP_CHECK(s.is_ok(), "scatter_into: {}", s.message());
  const CacheSpec& spec = storage.spec();
  const DType from = spec_.dtype();
  const DType to = spec.dtype();
  const int32_t head_dim = spec.head_dim();
  const size_t from_vector = kv_vector_bytes(from, head_dim);
  const size_t to_vector = kv_vector_bytes(to, head_dim);
  const int64_t n = num_tokens();
  std::vector<std::byte> converted[2];  // [K, V] dense in the storage's dtype
  std::vector<float> vector_f32(static_cast<size_t>(head_dim));
  for (int32_t layer = 0; layer < spec.num_layers(); ++layer) {
    const int64_t kept = spec.kept_tokens(layer, n);
    const int64_t num_vectors = kept * spec.num_kv_heads();
    const size_t file_bytes = static_cast<size_t>(num_vectors) * from_vector;
    std::span<const std::byte> kv[2] = {
        {data_.data() + layer_offsets_[layer], file_bytes},
        {data_.data() + layer_offsets_[layer] + file_bytes, file_bytes}};
    if (from != to) {  // converted on load through f32, one head vector at a time
      for (int which = 0; which < 2; ++which) {
        converted[which].resize(static_cast<size_t>(num_vectors) * to_vector);
        for (int64_t i = 0; i < num_vectors; ++i) {
          kv_vector_to_f32(kv[which].data() + i * from_vector, from, head_dim, vector_f32.data());
          kv_vector_from_f32(vector_f32.data(), head_dim, to,
                             converted[which].data() + i * to_vector);
        }
        kv[which] = converted[which];
      }
    }
    storage.scatter_layer(layer, block_tables[spec.group_of_layer(layer)], n - kept, n, kv[0],
                          kv[1]);
  }
}

Status load_cache_file(const std::filesystem::path& path, const ModelFingerprint& expected,
                       HostKvStorage& storage, std::span<const std::vector<BlockId>> block_tables,
                       std::vector<int32_t>* token_ids) {
  KVP_ASSIGN_OR_RETURN(const CacheFile file, CacheFile::read(path, expected, storage.spec()));
  if (Status s = file.check_tables(storage, block_tables); !s.is_ok()) {
    return Status::invalid_argument("cache file '{}': {}", path.string(), s.message());
  }
  file.scatter_into(storage, block_tables);
  if (token_ids != nullptr) token_ids->assign(file.token_ids().begin(), file.token_ids().end());
  return Status::ok();
}

}  // namespace kvp
