// Constant folding of the primal part of a graph: linearize's "do the primal work once".
//
// A value is primal-only when it does not depend on a tangent input and its node is pure.
// Every primal-only value that a tangent-dependent node (or a graph output) reads becomes a
// constant input "r<k>" bound to its tensor: a residual of the tangent graph. Tensors come
// from `known` (the tracing run already computed every traced value) or are computed here,
// through the runtime, each node at most once and only if a residual needs it. What nothing
// reads any more is left for dce.
//
//   %5 = aten::bmm(%1, %2)              // q·kᵀ: primal-only, known from the trace
//   %6 = aten::_safe_softmax(%5, -1)    // primal-only, known
//   %9 = aten::_softmax_backward_data(%8, %6, -1, Float)
//  =>
//   %9 = aten::_softmax_backward_data(%8, %r2, -1, Float)   with r2 bound to softmax's value
#include "passes/passes.h"

#include "runtime/executable.h"

#include <ATen/ATen.h>

#include <unordered_map>
#include <unordered_set>

namespace jvpc {

bool fold(Graph& g, const std::unordered_map<int, at::Tensor>& known) {
  const std::unordered_set<const Value*> varying = tangent_dependent(g, /*impure_too=*/true);
  auto primal_only = [&](const Value* v) { return v && !varying.count(v); };

  // The residuals: primal-only values read by tangent-dependent nodes or returned. Not the
  // zeros a rule materializes (aten::zeros of a shape): made per call, they cost a fill, and held
  // they would cost their bytes for as long as the tangent graph lives.
  auto made_per_call = [](const Value* v) {
    const Node* p = v->producer();
    return p && p->inputs().empty() && p->op() == "aten::zeros";
  };
  std::vector<Value*> residuals;
  std::unordered_set<const Value*> chosen;
  auto want = [&](Value* v) {
    if (primal_only(v) && !made_per_call(v) && !(g.is_input(v) && g.input_of(v).role == Role::Constant) &&
        chosen.insert(v).second)
      residuals.push_back(v);
  };
  for (Node* n : g.nodes())
    if (!primal_only(n->outputs().empty() ? nullptr : n->output(0)))
      for (Value* v : n->inputs()) want(v);
  for (Value* v : g.outputs()) want(v);
  if (residuals.empty()) return false;

  // Values: known ones, constants, and whatever must be computed (each node once).
  std::unordered_map<const Value*, at::Tensor> value;
  for (const Input& in : g.inputs())
    if (in.role == Role::Constant && in.data.defined()) value[in.value] = in.data;
  std::function<at::Tensor(Value*)> eval = [&](Value* v) -> at::Tensor {
    auto it = value.find(v);
    if (it != value.end()) return it->second;
    auto k = known.find(v->id());
    if (k != known.end()) return value[v] = k->second;
    Node* n = v->producer();
    if (!n) throw Error("fold: no value for primal input '" + g.input_of(v).name + "'");
    std::vector<at::Tensor> operands;
    for (Value* in : n->inputs()) operands.push_back(eval(in));
    auto outs = execute_node(*n, operands);
    for (size_t i = 0; i < outs.size(); ++i) value[n->output(i)] = outs[i];
    return value.at(v);
  };

  // Which primal inputs' storage does a residual alias? (The caller owns those bytes.)
  std::unordered_map<const void*, std::string> input_storage;
  for (const Input& in : g.inputs()) {
    if (in.role != Role::Primal) continue;
    auto k = known.find(in.value->id());
    if (k != known.end() && k->second.has_storage())
      input_storage[k->second.storage().unsafeGetStorageImpl()] = in.name;
  }

  int next = 0;
  for (const Input& in : g.inputs())
    if (in.name.rfind("r", 0) == 0) next++;
  for (Value* v : residuals) {
    at::Tensor t = eval(v);
    if (!t.is_non_overlapping_and_dense()) t = t.contiguous();  // expanded views are stored compactly
    std::string aliases;
    if (t.has_storage()) {
      auto it = input_storage.find(t.storage().unsafeGetStorageImpl());
      if (it != input_storage.end()) aliases = it->second;
    }
    std::string name;
    do name = "r" + std::to_string(next++);
    while (g.find_input(name));
    Value* c = g.add_constant(name, t, aliases);
    value[c] = t;  // later residuals may be computed from this one
    if (!c->meta().same_signature(v->meta()))
      throw Error("fold: value %" + std::to_string(v->id()) + " is declared " + v->meta().str() + " but computes to " +
                  c->meta().str());
    v->replace_all_uses_with(c);
  }
  return true;
}

}  // namespace jvpc
