// Forward-mode differentiation (JVP) of a graph, in place.
//
// For each chosen primal input x a tangent input "dx" is added: the inputs `wrt` names, in that
// order, or where it names none every primal input marked differentiable, in graph order. The
// name is primed until no input or output has it (inputs x and dx: dx' and ddx), and the
// input's tangent_of names x. Nodes are visited in order;
// for a node with at least one non-zero operand tangent and a floating output, the op's rule
// (passes/jvp_rules/) emits the tangent computation right after the node. Zero tangents are
// absent (nullptr) and cost nothing. One tangent output per primal output is appended ("d" +
// its name), zeros of its shape where it does not depend on the chosen inputs.
//
//   graph(%0 : f32[4,8] x, %1 : f32[8,3] w):           graph(..., %3 : f32[4,8] dx, %4 : f32[8,3] dw):
//     %2 = aten::mm(%0, %1)                     =>        %2 = aten::mm(%0, %1)
//     return (%2)                                         %5 = aten::mm(%3, %1)
//                                                         %6 = aten::mm(%0, %4)
//                                                         %7 = aten::add.Tensor(%5, %6, 1)
//                                                         return (%2, %7)
//
// A random node's draw is a primal value like any other (its tangent is zero, or for dropout the
// mask times the input's tangent): the map is for that draw, as torch.func's is.
//
// Errors: an op with no rule (named), or whose rule is not marked as holding for the complex
// tensors it meets (passes/jvp_rules/complex.cpp); wrt names that are not primal inputs, or
// that it names twice; an input chosen whose dtype has no tangent (not floating or complex);
// nothing chosen.
#include "passes/passes.h"
#include "ir/op.h"

#include "passes/jvp_rules/rules.h"

#include <algorithm>
#include <unordered_map>

namespace jvpc {

namespace {

// "d" + name, primed until no input or output of the graph has it (inputs x and dx: dx' and ddx).
std::string fresh_name(const Graph& g, const std::string& name) {
  std::string out = "d" + name;
  auto taken = [&](const std::string& s) {
    return g.find_input(s) || std::find(g.output_names().begin(), g.output_names().end(), s) != g.output_names().end();
  };
  while (taken(out)) out += "'";
  return out;
}

}  // namespace

bool jvp(Graph& g, const std::vector<std::string>& wrt) {
  // The inputs to differentiate, in wrt's order (the tangents' order), or the differentiable ones.
  std::vector<Input> chosen;  // copies: add_input grows the vector
  for (const Input& in : g.inputs())
    if (wrt.empty() && in.role == Role::Primal && in.differentiable) chosen.push_back(in);
  for (const std::string& name : wrt) {
    const Input* in = g.find_input(name);
    if (!in || in->role != Role::Primal) throw Error("wrt: no primal input named '" + name + "'");
    if (std::count(wrt.begin(), wrt.end(), name) > 1) throw Error("wrt: names '" + name + "' twice");
    chosen.push_back(*in);
  }
  std::unordered_map<const Value*, Value*> tangent;
  for (const Input& in : chosen) {
    const TensorMeta& m = in.value->meta();
    if (!differentiable_dtype(m.dtype))
      throw Error("input '" + in.name + "' has dtype " + c10::toString(m.dtype) + " and cannot be differentiated");
    tangent[in.value] =
        g.add_input(fresh_name(g, in.name), TensorMeta::contiguous(m.sizes, m.dtype, m.device), Role::Tangent);
    g.inputs().back().tangent_of = in.name;
  }
  if (tangent.empty()) throw Error("nothing to differentiate: no primal input is chosen");

  Builder b(g);
  jvp_rules::differentiate_in_order(b, g.nodes(), tangent);
  size_t n_out = g.outputs().size();
  for (size_t i = 0; i < n_out; ++i) {
    Value* o = g.outputs()[i];
    auto it = tangent.find(o);
    Value* t = it != tangent.end()
                   ? it->second
                   : b.call(ops::zeros, {o->meta().sizes, o->meta().dtype, std::nullopt, o->meta().device});
    g.add_output(t, fresh_name(g, g.output_names()[i]));
  }
  return true;
}

}  // namespace jvpc
