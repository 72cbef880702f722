// The kernel of PeerAllReduce (peer_all_reduce.h) and its arguments: plain C++17 for nvcc
// (peer_all_reduce.cu includes only this).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvp::cuda::detail {

constexpr int32_t kPeerMaxRanks = 8;
// Floats of one chunk: the unit one thread block sends, and the unit an epoch counter counts.
// A float lives at a fixed chunk whatever the call's size, so a chunk's region of an inbox is
// only ever written for the same chunk (and the same counter) of a later call.
constexpr int64_t kPeerChunkFloats = 2048;
constexpr int32_t kPeerThreads = 256;  // 4 lines (8 floats) a thread per chunk
// At most this many chunks a call (the whole grid must be resident: blocks of one GPU spin on
// the same blocks of the others).
constexpr int64_t kPeerMaxChunks = 1024;

// One 16-byte line of an inbox: two floats, each beside the epoch of the call that wrote it.
// A 16-byte store need not arrive at once, but each 8-byte half does (NVLink and PCIe write
// 8 aligned bytes atomically), so a half whose flag is the reader's epoch holds its float.
struct PeerLine {
  uint32_t value0, flag0, value1, flag1;
};

struct PeerAllReduceArgs {
  float* data = nullptr;
  int64_t count = 0;
  int32_t rank = 0, num_ranks = 0;
  int64_t lines = 0;                    // lines of one (parity, sender) region of an inbox
  PeerLine* inbox[kPeerMaxRanks] = {};  // every rank's [2 parities][num_ranks][lines]
  uint32_t* counters = nullptr;         // mine [kPeerMaxChunks]: calls that had each chunk
};
cudaError_t launch_peer_all_reduce(const PeerAllReduceArgs& args, cudaStream_t stream);

}  // namespace kvp::cuda::detail
