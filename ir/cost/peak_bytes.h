// measured_peak_bytes: the most bytes a callable allocates at once, above what was allocated
// before it, measured as it runs: on the CPU, the running sum of what the allocator reports to
// the profiler's memory hook (+ on allocation, − on release, as they happen: the profiler's
// "[memory]" events); on CUDA, the caching allocator's
// peak statistic of the current device. What the cost model predicts as peak_bytes, measured
// (jvpc compile's report, jvpc_bench, the tests).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>

namespace jvpc {

/// Runs fn once and returns its peak allocation on `device` (CPU or CUDA) above the bytes
/// allocated before it. The CPU figure takes the profiler's thread-local memory hook for the
/// call: do not call it inside a profiling session.
int64_t measured_peak_bytes(const std::function<void()>& fn, c10::Device device = c10::kCPU);

}  // namespace jvpc
