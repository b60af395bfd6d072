// A cache of linearize's optimized graphs: linearizing the same computation again at inputs of
// the same shapes and dtypes reuses them, so that only the trace and fold run.
//
//   jvpc::LinearizeCache cache;
//   for (...) {                                   // a training loop: new point, new weights
//     Linearized lin = cache.linearize(fn, {{"x", x}});   // the first call compiles
//     ...                                         // later ones: trace + fold, about two forwards
//   }
//
// Each call traces fn (the one forward, which also gives the primal outputs). A traced graph
// equal to a cached one (the same ops, arguments, shapes, strides and dtypes, node for node, and
// the same options) over the same constants is a hit. A constant is the same where it is the same
// tensor object (a module's weight, whatever its values now: an optimizer step writes it in
// place), or, up to 4096 elements, equal in value to what it was when compiled (the Python
// numbers LibTorch wraps in tensors, tables a function makes afresh at every call). On a hit the
// cached primal graph (the split compile makes at fold, program.h) is evaluated on this trace's
// values and constants, computing only what the trace did not (fold: the derivative factors),
// and its residuals are bound to a copy of the cached tangent graph's Executable. Anything else
// is a miss, which linearizes as linearize() does and keeps the result (the least recently used
// of `capacity` entries goes). Passes read no captured tensor's values but for one-element
// scales (attention-match), which the by-value rule covers unless the tensor is the same object
// written in place; a compiled program (program.h) assumes the same.
//
// An entry holds the constants it was compiled with, so that their identity stays meaningful
// while it lives. Graphs with value-dependent shapes (nonzero) are not kept.
//
// Threads: linearize() may be called from several threads at once.
#pragma once

#include "compiler/api/linearize.h"

#include <list>
#include <memory>
#include <mutex>

namespace jvpc {

class LinearizeCache {
 public:
  explicit LinearizeCache(size_t capacity = 4) : capacity_(capacity) {}

  /// linearize(fn, primals, options), from the cache where it can be (see above). Its report
  /// is the compile's; its phases on a hit: "trace", "cache", "fold", "total".
  Linearized linearize(const TensorFn& fn, const std::vector<TraceInput>& primals,
                       const LinearizeOptions& options = {});

  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  size_t size() const;

  struct Entry;
  /// A constant the compile saw: the tensor, and a copy of its values where it is small.
  struct Kept {
    at::Tensor tensor, value;
  };

 private:
  std::shared_ptr<const Entry> find(const std::string& key, const std::vector<at::Tensor>& constants);
  void keep(std::shared_ptr<const Entry> e);

  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<const Entry>> entries_;  // most recently used first
  std::atomic<int64_t> hits_{0}, misses_{0};
};

}  // namespace jvpc
