// Human-readable forms of a graph: one line per node (for people, golden tests and
// --dump-after), and Graphviz dot (for pictures). The JSON form is in serialize.h.
#pragma once

#include "compiler/ir/graph.h"

#include <string>

namespace jvpc {

/// graph(%0 : f32[1,5,128,64] q, ...):
///   %7 : f32[5,128,128] = aten::bmm(%3, %6)
///   return (%12)
std::string to_text(const Graph& g);
/// "%7 : f32[5,128,128] = aten::bmm(%3, %6)"
std::string to_text(const Node& n);
/// Graphviz: inputs as boxes coloured by role, nodes as ellipses, edges labelled with metadata.
std::string to_dot(const Graph& g, const std::string& title = "jvpc");
/// Shortest decimal text that reads back to the same double; "inf", "-inf", "nan" otherwise.
std::string format_double(double d);

}  // namespace jvpc
