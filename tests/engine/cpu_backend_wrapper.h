// A ForwardBackend over a CpuForwardBackend that forwards every call to it: the engine tests'
// backends derive from it and override only what they change (block placement, when copies
// complete, sampling "on the device"). Tier transfers take the base class's path through block
// images (read_blocks / write_blocks), so a derived class's block calls see them too.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "model/cpu_forward_backend.h"

namespace kvp::engine_test {

class CpuBackendWrapper : public ForwardBackend {
 public:
  explicit CpuBackendWrapper(std::shared_ptr<ModelRunner> runner) : inner_(std::move(runner)) {}

  const ModelSpec& spec() const override { return inner_.spec(); }
  std::string device_name() const override { return "cpu test wrapper"; }
  int32_t num_cache_groups() const override { return inner_.num_cache_groups(); }
  int32_t num_group_layers(int32_t group) const override { return inner_.num_group_layers(group); }
  bool group_is_sliding(int32_t group) const override { return inner_.group_is_sliding(group); }
  KvLayout group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                        DType dtype) const override {
    return inner_.group_layout(group, num_blocks, block_size, dtype);
  }
  Status check_kv_dtype(DType dtype) const override { return inner_.check_kv_dtype(dtype); }
  Status allocate_kv(std::span<const KvLayout> layouts) override {
    return inner_.allocate_kv(layouts);
  }
  const KvLayout& kv_layout(int32_t group) const override { return inner_.kv_layout(group); }
  Status forward(const ForwardBatch& batch, std::span<float> logits) override {
    return inner_.forward(batch, logits);
  }
  Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) override {
    return inner_.copy_blocks(group, ops);
  }
  Status read_blocks(int32_t group, std::span<const BlockId> blocks,
                     std::span<std::byte> image) const override {
    return inner_.read_blocks(group, blocks, image);
  }
  Status write_blocks(int32_t group, std::span<const BlockId> blocks,
                      std::span<const std::byte> image) override {
    return inner_.write_blocks(group, blocks, image);
  }

 protected:
  CpuForwardBackend inner_;
};

}  // namespace kvp::engine_test
