#include "ir/cost/peak_bytes.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#ifdef JVPC_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <memory>

namespace jvpc {

int64_t measured_peak_bytes(const std::function<void()>& fn, c10::Device device) {
  if (device.is_cuda()) {
#ifdef JVPC_WITH_CUDA
    c10::DeviceIndex dev = device.has_index() ? device.index() : c10::cuda::current_device();
    c10::cuda::getCurrentCUDAStream(dev).synchronize();
    auto* alloc = c10::cuda::CUDACachingAllocator::get();
    int64_t before = alloc->getDeviceStats(dev).allocated_bytes[0].current;
    alloc->resetPeakStats(dev);
    fn();
    c10::cuda::getCurrentCUDAStream(dev).synchronize();
    return alloc->getDeviceStats(dev).allocated_bytes[0].peak - before;
#endif
  }
  // The CPU allocator reports each allocation and free to the thread's memory reporter (the
  // profiler's hook, ThreadLocalDebugInfo PROFILER_STATE, which intra-op threads inherit): a
  // reporter of our own keeps the running total and its peak, without starting the profiler
  // (whose start probes for GPUs and logs an error on a machine without one).
  struct Peak : c10::MemoryReportingInfoBase {
    std::atomic<int64_t> current{0}, peak{0};
    bool memoryProfilingEnabled() const override { return true; }
    void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device d) override {
      if (!d.is_cpu()) return;
      int64_t now = current += bytes, seen = peak.load();
      while (now > seen && !peak.compare_exchange_weak(seen, now)) {}
    }
  };
  auto reporter = std::make_shared<Peak>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, reporter);
    fn();
  }
  return reporter->peak.load();
}

}  // namespace jvpc
