// Shape inference, memoized: infer_outputs (ops.h) runs each op's shape rule or Meta kernel
// once per signature (op, constant arguments, operands' sizes, strides, dtypes and devices,
// the default dtype), and answers every later call with the same signature from a table.
//
// After `import torch`, many common ops' Meta kernels are Python functions (torch/_refs,
// torch/_meta_registrations.py) that cost 100 to 300 µs a call; a whole model's linearize asks
// for the same few hundred signatures thousands of times (the builder, every verification).
// Inference is a pure function of the signature (Meta tensors hold no values), and errors are
// not memoized. The table is process-wide, thread-safe, and cleared when it reaches
// kShapeMemoCapacity entries.
#pragma once

#include "ir/graph.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace jvpc {

constexpr size_t kShapeMemoCapacity = 1 << 16;

/// Calls of infer_outputs on the calling thread, and the time the uncached ones took: what a
/// compile report shows as "shape inference".
struct ShapeInferenceStats {
  int64_t calls = 0;
  int64_t computed = 0;  ///< calls not answered from the table
  double computed_ms = 0;
};
/// The calling thread's counts since it started (take differences around a phase).
const ShapeInferenceStats& shape_inference_stats();

namespace detail {
/// `compute` (the uncached inference) memoized by the signature of (op, args, inputs).
std::vector<TensorMeta> memoized_shapes(const std::string& op, const std::vector<Arg>& args,
                                        c10::ArrayRef<const TensorMeta*> inputs, std::vector<int>* return_counts,
                                        c10::function_ref<std::vector<TensorMeta>(std::vector<int>*)> compute);
}  // namespace detail

}  // namespace jvpc
