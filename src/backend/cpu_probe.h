// Throughput probes for benchmarks: ceilings measured on the machine that runs them, so kernel
// speeds can be quoted as a fraction of what the hardware does (STYLE.md "Tests and benchmarks").
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvp::cpu {

// Runs iterations x 8 independent f32 vector multiply-adds in registers on the calling thread,
// at the widest Highway target of the machine. Returns a value that depends on all of them.
float fma_probe(int64_t iterations);
// f32 lanes of one vector at that target: FLOPs of fma_probe = 2 * 8 * lanes * iterations.
size_t fma_probe_lanes();

}  // namespace kvp::cpu
