// Graph transforms that change every value's metadata: moving a graph to another device, and
// making its floating-point tensors another dtype. Each node's outputs are re-derived after.
#pragma once

#include "ir/graph.h"

namespace jvpc {

/// Moves a graph to another device: every value's metadata, device arguments, and constants.
void retarget(Graph& g, c10::Device device);
/// Makes every floating-point tensor of a graph `dtype`: inputs, constants, dtype arguments
/// (float64 for a reference computed by central differences).
void retype_floating(Graph& g, c10::ScalarType dtype);

}  // namespace jvpc
