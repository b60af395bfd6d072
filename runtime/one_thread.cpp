// OneThread (one_thread.h): the calling thread's OpenMP team size, through the OpenMP runtime
// that LibTorch loads (libtorch_cpu depends on it where ATen parallelizes with OpenMP). The two
// functions are weak references: jvpc links no OpenMP runtime of its own (two in one process
// would each keep a pool of threads), and where none is loaded they are null and OneThread does
// nothing.
#include "runtime/one_thread.h"

extern "C" {
int omp_get_max_threads(void) __attribute__((weak));
void omp_set_num_threads(int) __attribute__((weak));
}

namespace jvpc {

OneThread::OneThread(bool on) {
  if (!on || !omp_get_max_threads || !omp_set_num_threads) return;
  int n = omp_get_max_threads();  // this thread's setting (OpenMP keeps one per thread)
  if (n <= 1) return;
  saved_ = n;
  omp_set_num_threads(1);
}

OneThread::~OneThread() {
  if (saved_) omp_set_num_threads(saved_);
}

}  // namespace jvpc
