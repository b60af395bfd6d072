// The inputs file beside a traced graph: `jvpc trace -o x.json` and TracedGraph.save("x.json")
// write the values the graph was traced at, by input name, in x.inputs.safetensors; `jvpc
// linearize x.json` and `jvpc compile x.json` take their primals from it unless --inputs names
// another file.
#pragma once

#include "ir/io/graph_files.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace jvpc {

/// "x.json" -> "x.inputs.safetensors".
std::string traced_inputs_path_for(const std::string& graph_path);

/// Saves `g` at `graph_path` (save(): the graph and its constants) and `inputs` (name, tensor;
/// copied to the CPU) as the inputs file beside it. All three are written in full before any
/// replaces its destination, the inputs file last: a failure leaves the previous files as they
/// were.
void save_traced(const Graph& g, const std::string& graph_path, const SaveOptions& options,
                 const std::vector<std::pair<std::string, at::Tensor>>& inputs);

}  // namespace jvpc
