// FLOPs of the ops whose work per output element grows with their arguments (pool windows,
// factorizations, sorts, transforms, distances, embedding bags): upper bounds by the convention
// in docs/cost-model.md, so that a FLOP limit holds for graph files that use them.
#pragma once

#include "ir/graph.h"

#include <optional>

namespace jvpc {

/// The other FLOPs of `n` where its op is one of those; none for other ops.
std::optional<int64_t> scaled_work_flops(const Node& n);

}  // namespace jvpc
