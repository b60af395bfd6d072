// The inputs file beside a traced graph: `jvpc trace -o x.json` and TracedGraph.save("x.json")
// write the values the graph was traced at, by input name, in x.inputs.safetensors; `jvpc
// linearize x.json` and `jvpc compile x.json` take their primals from it unless --inputs names
// another file.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace jvpc {

/// "x.json" -> "x.inputs.safetensors".
std::string traced_inputs_path_for(const std::string& graph_path);

/// Writes `inputs` (name, tensor; copied to the CPU) as the inputs file beside `graph_path`,
/// whole or not at all.
void save_traced_inputs(const std::string& graph_path, const std::vector<std::pair<std::string, at::Tensor>>& inputs);

}  // namespace jvpc
