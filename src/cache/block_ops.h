// Byte-moving operations that bookkeeping asks a backend to carry out. The cache module never
// touches KV bytes: it returns these, and a backend (CPU or CUDA) executes them.
#pragma once

#include "common/ids.h"

namespace kvp {

// Copy every layer's K and V of block `src` into block `dst` of the same pool
// (copy-on-write of a shared, partially filled block).
struct BlockCopy {
  BlockId src;
  BlockId dst;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

}  // namespace kvp
