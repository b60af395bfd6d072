// Shape rules for the kernels that have no Meta kernel in C++ (PyTorch registers theirs from
// Python, or has CUDA kernels only), or whose C++ fallback fails on some layouts. Internal to
// infer_outputs() (ops.cpp) looks an op up here before it runs the Meta kernel.
#pragma once

#include "ir/graph.h"

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace jvpc::detail {

/// Output metadata from the arguments and the operands' metadata: one entry per schema return.
/// A return that gives no tensor (an int, an undefined tensor) is absent_return().
using ShapeRule = std::function<std::vector<TensorMeta>(const std::vector<Arg>&, const std::vector<TensorMeta>&)>;

/// The entry of a return that gives no tensor (its dtype is Undefined).
TensorMeta absent_return();
inline bool is_absent(const TensorMeta& m) { return m.dtype == c10::ScalarType::Undefined; }

/// The shape rules by qualified op name ("aten::where.self"), one named function per op or family.
const std::unordered_map<std::string, ShapeRule>& shape_rules();

}  // namespace jvpc::detail
