#include "compiler/cost/peak_bytes.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#ifdef JVPC_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <utility>
#include <vector>

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
  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  impl::ProfilerConfig cfg(impl::ProfilerState::KINETO, false, /*profile_memory=*/true);
  prof::prepareProfiler(cfg, {impl::ActivityType::CPU});
  prof::enableProfiler(cfg, {impl::ActivityType::CPU});
  fn();
  auto result = prof::disableProfiler();
  std::vector<std::pair<uint64_t, int64_t>> events;
  for (const auto& e : result->events())
    if (e.name() == "[memory]" && e.deviceType() == c10::DeviceType::CPU) events.emplace_back(e.startNs(), e.nBytes());
  std::stable_sort(events.begin(), events.end());
  int64_t current = 0, peak = 0;
  for (const auto& [t, bytes] : events) peak = std::max(peak, current += bytes);
  return peak;
}

}  // namespace jvpc
