// Reading the text form of a graph (printer.h's to_text) back into a Graph, so that tests and
// tools can state IR as text:
//
//   auto g = parse_text(R"(
//     graph(%0 : f32[4] x, %1 : f32[4] dx [tangent, tangent_of x]):
//       %2 : f32[4] = aten::mul.Tensor(%0, %1)
//       return (%2 out0))");
//
// parse_text(to_text(g)) rebuilds g structurally: the same inputs (names, ids, roles, metadata
// with strides, flags), nodes (ops, arguments, operands, outputs, return counts, impure) and
// outputs with their names. Constants' values are not in the text: a constant marked
// "stored" is bound by ParseTextOptions::bind (zeros of its declared layout by default).
//
// `//` starts a comment, to the end of the line (jvpc opt's output and the .ir tests carry them).
//
// This is not a loader of files from strangers: it trusts its text as tests do (shapes are
// checked by verify(), but no limits on size or memory apply). Graph files are JSON
// (graph_json.h, graph_files.h), which is checked as untrusted input.
#pragma once

#include "ir/graph.h"

#include <functional>
#include <memory>
#include <string>

namespace jvpc {

struct ParseTextOptions {
  /// The tensor for a constant marked "stored"; when empty, zeros of the declared layout.
  std::function<at::Tensor(const std::string& name, const TensorMeta& meta)> bind;
  /// Run verify() on the result (off to state a broken graph for a verifier test).
  bool verify = true;
};

/// Builds the graph that `text` describes. Values take the text's ids. Throws a one-line
/// jvpc::Error naming the line and column of the first problem.
std::unique_ptr<Graph> parse_text(const std::string& text, const ParseTextOptions& options = {});

}  // namespace jvpc
