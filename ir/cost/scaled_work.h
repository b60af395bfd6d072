// FLOPs of the ops whose work per output element grows with their arguments (pool windows,
// factorizations, sorts, transforms, distances, embedding bags): upper bounds by the convention
// in docs/cost-model.md, so that a FLOP limit holds for graph files that use them.
#pragma once

#include "ir/graph.h"

#include <optional>

namespace jvpc {

/// A count from ir/checked_math.h, or Error("cost exceeds 2^63 ...") where it overflowed: counts
/// are int64, and a graph whose counts pass 2^63 is an error, never a wrapped number.
int64_t count_or_throw(std::optional<int64_t> count);

/// The other FLOPs of `n` where its op is one of those; none for other ops.
std::optional<int64_t> scaled_work_flops(const Node& n);

}  // namespace jvpc
