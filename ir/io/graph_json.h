// The JSON form of a graph.
//
//   {"format": "jvpc-graph", "schema_version": 1,
//    "inputs":  [{"name": "q", "id": 0, "role": "primal", "differentiable": true,
//                 "meta": {"sizes": [1,5,128,64], "strides": [...], "dtype": "Float", "device": "cpu"}}],
//    "nodes":   [{"op": "aten::bmm", "args": [{"tensor": 3}, {"tensor": 6}],
//                 "outputs": [{"id": 7, "meta": {...}}]}],
//    "outputs": [{"name": "out0", "id": 12}]}
//
// Arguments are one-key objects, as in torch.export's schema: none, bool, int, float, str,
// ints, floats, bools, scalar_type, layout, memory_format, device, tensor, tensors,
// opt_tensors. Non-finite floats are written as the strings "inf", "-inf" and "nan".
// Nodes may add "returns" (see Node::return_counts) and "impure": true.
// Constants with data have "stored": true; their data, and the keys a graph file adds for it
// ("constants_file", "view_of", ...), are graph_files.h's.
// Tangent inputs may carry "tangent_of": the primal input they are the tangent of.
//
// Reading checks everything it reads and reports the first problem with its JSON path
// ("nodes[4].args[1]: ..."); the graph it returns has passed verify().
#pragma once

#include "ir/graph.h"

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>

namespace jvpc {

constexpr int kSchemaVersion = 1;

nlohmann::json to_json(const Graph& g, const std::string& constants_file = "");
/// Builds and verifies a graph. Constant inputs are left unbound. Unless `trusted`, the graph
/// may use only loadable ops (ir/loadable_ops.h) and every shape is re-derived. A node
/// that writes what its schema does not mark, or a read of uninitialized memory, is an error.
std::unique_ptr<Graph> from_json(const nlohmann::json& j, bool trusted = false);
/// from_json(), with any other exception a check missed turned into a one-line jvpc::Error.
std::unique_ptr<Graph> checked_from_json(const nlohmann::json& j, bool trusted = false);
/// Parses text (parse_json in json_text.h) and calls checked_from_json.
std::unique_ptr<Graph> parse_graph(const std::string& text, bool trusted = false);

}  // namespace jvpc
