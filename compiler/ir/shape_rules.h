// Shape rules for the kernels a graph file may use that have no Meta kernel in C++ (PyTorch
// registers theirs from Python, or has CUDA kernels only). Internal to compiler/ir: ops.cpp adds
// them to its table of shape rules, which infer_outputs() consults before the Meta kernel.
#pragma once

#include "compiler/ir/graph.h"

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

/// Adds the rules of shape_rules.cpp to `rules`.
void add_shape_rules(std::unordered_map<std::string, ShapeRule>& rules);

}  // namespace jvpc::detail
