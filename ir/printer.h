// Human-readable forms of a graph: one line per node (for people, pass tests and
// --dump-after), and Graphviz dot (for pictures). The JSON form is in graph_json.h; the text
// form reads back with parse_text (text.h), for tests and tools.
//
//   graph(%0 : f32[2,3] x,                                 // a differentiable primal input
//         %1 : f32[3,2]{1,3} dx [tangent, tangent_of x],  // strides when not contiguous
//         %2 : f32[3] c [constant, stored]):              // [primal]: not differentiable
//     %3 : f32[2,3] = aten::mul.Tensor(%0, %1)
//     %4 : f32[2,3], %5 : i64[2,3] = aten::sort(%3, -1, false)
//     %6 : f32[1,3], %7 : f32[1,3] = aten::split.Tensor(%3, 1, 0)  # returns [2]
//     %8 : f32[4] = aten::rand([4], None, None, None, None)  # impure
//     return (%3 out0, %4 "an output")                   // outputs with their names
//
// Input flags are those of the JSON form: the role, "stored" (a constant with data),
// "aliases NAME" and "tangent_of NAME". "view_of" is not graph state (save() derives it from
// which constants share storage) and has no text. Names other than [A-Za-z0-9_.'-]+ are
// quoted, with \ before " and \.
#pragma once

#include "ir/graph.h"

#include <string>

namespace jvpc {

/// graph(%0 : f32[1,5,128,64] q, ...):
///   %7 : f32[5,128,128] = aten::bmm(%3, %6)
///   return (%12 out0)
std::string to_text(const Graph& g);
/// "%7 : f32[5,128,128] = aten::bmm(%3, %6)"
std::string to_text(const Node& n);
/// Graphviz: inputs as boxes coloured by role, nodes as ellipses, edges labelled with metadata.
std::string to_dot(const Graph& g, const std::string& title = "jvpc");
/// "f32[2,3]", with strides when they are not the contiguous ones: "f32[3,2]{1,3}@cuda:0".
std::string meta_text(const TensorMeta& m);
/// A name as the text form writes it: bare if it is [A-Za-z0-9_.'-]+ (and not None), else quoted.
std::string name_text(const std::string& name);
/// Shortest decimal text that reads back to the same double; "inf", "-inf", "nan" otherwise.
std::string format_double(double d);

}  // namespace jvpc
