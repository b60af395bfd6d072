// The batching transform: from a tangent graph for one tangent, the graph for K tangents stacked
// on a new leading axis.
//
// Every tangent input [...] becomes [K, ...]; constants (residuals) stay as they are, bound to
// the same tensors (never copied). Nodes are visited in order. A node none of whose operands is
// batched (it reads residuals only: work that does not depend on the tangent) is copied once;
// any other is rewritten by its op's batching rule (passes/batch_rules/), whose outputs are
// batched: a product of a residual by a batched tangent becomes one product with K folded into
// its rows or columns (below), not K products. An op without a rule falls back to K unrolled copies of itself, one per tangent
// (select the k-th slice of each batched operand, apply the op, stack the K results), and is
// named in the result. Outputs that do not depend on the tangent are broadcast to [K, ...] and
// copied. The batched pipeline (batched_passes(), passes/linearize_pipeline.h) then runs, and the graph is verified:
// it is an ordinary jvpc graph that saves, loads and runs.
//
//   graph(%0 : f32[5,64,128] r, %1 : f32[5,128,64] dv):      graph(%0 : f32[5,64,128] r, %1 : f32[K,5,128,64] dv):
//     %2 = aten::bmm(%0, %1)                        =>           (dv as [5,128,K·64], one bmm by r, viewed back)
//     return (%2)                                                return (%.. : f32[K,5,64,64])
#include "passes/linearize_pipeline.h"
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/verifier.h"
#include "passes/batch_rules/rules.h"

#include <set>
#include <unordered_map>

namespace jvpc {

namespace {

std::vector<int64_t> with_k(int64_t K, std::vector<int64_t> sizes) {
  sizes.insert(sizes.begin(), K);
  return sizes;
}

// K copies of node `n`, the k-th reading the k-th slice of each batched operand, and each
// output's K results stacked.
std::vector<Value*> unroll(Builder& b, const Node& n, int64_t K, const std::vector<Value*>& operands,
                           const std::vector<bool>& batched) {
  std::vector<std::vector<Value*>> per_output(n.outputs().size());
  for (int64_t k = 0; k < K; ++k) {
    std::vector<Value*> slice;
    for (size_t i = 0; i < operands.size(); ++i)
      slice.push_back(batched[i] ? b.call(ops::select_int, {operands[i], int64_t(0), k}) : operands[i]);
    batch_rules::Ctx c(b, n, K, slice, std::vector<bool>(slice.size(), false));
    std::vector<Value*> outs = b.emit(n.op(), c.args(), &n);
    for (size_t i = 0; i < outs.size() && i < per_output.size(); ++i) per_output[i].push_back(outs[i]);
  }
  std::vector<Value*> out;
  for (auto& vs : per_output) out.push_back(b.call(ops::stack, {vs, int64_t(0)}));
  return out;
}

}  // namespace

BatchResult batch_tangents(const Graph& g, int64_t K) {
  if (K < 1) throw Error("batch: the number of tangents must be at least 1, got " + std::to_string(K));
  BatchResult result;
  result.graph = std::make_unique<Graph>();
  Graph& out = *result.graph;
  std::unordered_map<const Value*, Value*> map;
  std::unordered_map<const Value*, bool> batched;  // by batched-graph value

  for (const Input& in : g.inputs()) {
    TensorMeta m = in.value->meta();
    bool b = in.role == Role::Tangent;
    if (b) m = TensorMeta::contiguous(with_k(K, m.sizes), m.dtype, m.device);
    Value* v = out.add_input(in.name, m, in.role, in.differentiable);
    Input& copy = out.inputs().back();
    copy.data = in.data;  // the same tensor: a residual is never copied
    copy.aliases = in.aliases;
    copy.tangent_of = in.tangent_of;
    copy.data_version = in.data_version;
    map[in.value] = v;
    batched[v] = b;
  }

  Builder b(out);
  std::set<std::string> unrolled;
  for (const Node* n : g.nodes()) {
    std::vector<Value*> operands;
    std::vector<bool> flags;
    bool any = false;
    for (const Value* v : n->inputs()) {
      operands.push_back(map.at(v));
      flags.push_back(batched.at(operands.back()));
      any |= flags.back();
    }
    std::vector<Value*> outs;
    if (!any) {
      std::vector<TensorMeta> metas;
      for (const Value* o : n->outputs()) metas.push_back(o->meta());
      Node* copy = out.create(n->op(), n->args(), operands, metas, n->return_counts(), n->impure());
      outs = copy->outputs();
    } else {
      const batch_rules::Rule* rule = batch_rules::registry().find(n->op());
      if (rule) {
        batch_rules::Ctx c(b, *n, K, operands, flags);
        try {
          outs = (*rule)(c);
        } catch (const Error& e) {
          throw Error("batching rule of " + n->op() + ": " + e.what());
        }
      }
      if (outs.empty() && !n->outputs().empty()) {  // no rule, or one that does not apply here
        outs = unroll(b, *n, K, operands, flags);
        unrolled.insert(n->op());
      }
      if (outs.size() != n->outputs().size())
        throw Error("batching rule of " + n->op() + " gave " + std::to_string(outs.size()) + " outputs, not " +
                    std::to_string(n->outputs().size()));
      for (size_t i = 0; i < outs.size(); ++i) {
        const TensorMeta &want = n->output(i)->meta(), &got = outs[i]->meta();
        if (got.sizes != with_k(K, want.sizes) || got.dtype != want.dtype)
          throw Error("batching rule of " + n->op() + " gave output " + std::to_string(i) + " as " + got.str() +
                      ", not [K=" + std::to_string(K) + "] + " + want.str());
      }
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      map[n->output(i)] = outs[i];
      batched[outs[i]] = any;
    }
  }

  for (size_t i = 0; i < g.outputs().size(); ++i) {
    Value* v = map.at(g.outputs()[i]);
    if (!batched.at(v)) {  // independent of the tangent: the same result K times
      v = b.call(ops::clone, {b.call(ops::expand, {v, with_k(K, v->meta().sizes)}), c10::MemoryFormat::Contiguous});
    }
    out.add_output(v, g.output_names().at(i));
  }

  Pipeline cleanup;
  for (const BatchedPass& p : batched_passes()) cleanup.add(make_pass(p.name, p.run));
  cleanup.run(out);
  result.unrolled.assign(unrolled.begin(), unrolled.end());
  return result;
}

}  // namespace jvpc
