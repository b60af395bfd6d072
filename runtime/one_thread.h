// Small kernels on the calling thread alone. Many ATen CPU kernels open an OpenMP parallel region
// whatever their size (_softmax_backward_data on a few rows, bmm's small-matrix path): on an idle
// machine that costs a few microseconds, but where other processes hold the cores, the region's
// end waits until the OS schedules every worker thread of the team, a time slice or more each
// (milliseconds, and hundreds of them under `nice`). A plan runs the nodes whose tensors are all
// smaller than ATen's grain (at::internal::GRAIN_SIZE elements, below which ATen's own loops do
// not split) with the calling thread's OpenMP team size set to one, and restores it after.
#pragma once

namespace jvpc {

/// While alive, parallel regions opened on this thread run on it alone (when `on`, and where
/// LibTorch runs on OpenMP; otherwise it does nothing).
class OneThread {
 public:
  explicit OneThread(bool on);
  ~OneThread();
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_ = 0;  ///< the team size to restore; 0: nothing changed
};

}  // namespace jvpc
