// memcpy of large host buffers on several threads. One thread's memcpy runs at ~10 GB/s on the
// machines kvpool targets, well under their memory bandwidth; tens or hundreds of MB (a decode
// step's logits, a session's KV moving between the device and host memory) are copied in
// chunks of at least kMinChunkBytes on up to max_threads threads (the caller included).
#pragma once

#include <cstddef>

namespace kvp {

inline constexpr size_t kParallelMemcpyMinChunkBytes = size_t{4} << 20;

// requires: the ranges do not overlap; max_threads >= 1.
void parallel_memcpy(void* dst, const void* src, size_t bytes, int max_threads = 8);

// `rows` rows of row_bytes each, from src (a row every src_pitch bytes) to dst (every dst_pitch
// bytes), whole rows split among the threads as parallel_memcpy splits bytes (a split model's
// vocabulary shares joined into whole logit rows). requires: no overlap; pitches >= row_bytes.
void parallel_memcpy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t row_bytes, size_t rows, int max_threads = 8);

}  // namespace kvp
