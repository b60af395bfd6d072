#include "compiler/api/linearize.h"

#include "compiler/cost/kernel_watch.h"
#include "compiler/ir/verifier.h"
#include "passes/passes.h"

#include <algorithm>
#include <unordered_set>

namespace jvpc {

std::vector<std::string> Linearized::tangent_names() const {
  std::vector<std::string> names;
  for (const Input* in : jvp_fn->arguments()) names.push_back(in->name);
  return names;
}

void add_linearize_passes(Pipeline& p, const std::vector<std::string>& wrt, size_t primal_outputs,
                          std::shared_ptr<std::unordered_map<int, at::Tensor>> known, const std::set<std::string>& disabled) {
  static const std::vector<std::string> optional = {"simplify-views", "simplify-arith", "cse", "scale-to-residual",
                                                    "merge-factors", "select-masks", "group-bmm", "zero-blocks",
                                                    "fuse-matmul-add"};
  for (const std::string& name : disabled)
    if (std::find(optional.begin(), optional.end(), name) == optional.end()) {
      std::string list;
      for (const std::string& o : optional) list += (list.empty() ? "" : ", ") + o;
      bool required = name == "jvp" || name == "fold" || name == "dce" || name == "drop-primal-outputs";
      throw Error(required ? "pass '" + name + "' cannot be disabled (these can: " + list + ")"
                           : "no optional pass is named '" + name + "' (these can be disabled: " + list + ")");
    }
  auto add = [&](std::string name, std::function<bool(Graph&)> fn) {
    if (!disabled.count(name)) p.add(make_pass(std::move(name), std::move(fn)));
  };
  // The order matters: simplifications that move work onto primal values run before fold, so
  // that fold computes that work once; dce after fold drops the whole forward.
  add("jvp", [wrt](Graph& g) { return jvp(g, wrt); });
  add("drop-primal-outputs", [primal_outputs](Graph& g) {
    // linearize returns f(x) from the tracing run; the graph keeps only tangent outputs.
    for (size_t i = 0; i < primal_outputs; ++i) g.erase_output(0);
    return primal_outputs > 0;
  });
  add("dce", [](Graph& g) { return dce(g); });
  add("simplify-views", simplify_views);
  add("simplify-arith", simplify_arith);
  add("cse", cse);
  add("scale-to-residual", scale_to_residual);
  add("merge-factors", merge_factors);
  add("select-masks", select_masks);
  add("group-bmm", group_bmm);
  add("zero-blocks", zero_blocks);
  add("fold", [known](Graph& g) { return fold(g, *known); });
  add("dce", [](Graph& g) { return dce(g, /*prune_primal_inputs=*/true); });
  add("simplify-views", simplify_views);
  add("fuse-matmul-add", fuse_matmul_add);
  add("cse", cse);
}

namespace {

Linearized compile(Trace&& t, const LinearizeOptions& options, const KernelWatch& watch) {
  Linearized lin;
  lin.primal_outputs = t.outputs;
  lin.report.forward = graph_cost(*t.graph);
  auto known = std::make_shared<std::unordered_map<int, at::Tensor>>(std::move(t.values));
  Pipeline p;
  add_linearize_passes(p, options.wrt, t.graph->outputs().size(), known, options.disabled_passes);
  CostTable table("trace");
  p.observe(&table);
  for (PassObserver* o : options.observers) p.observe(o);
  std::shared_ptr<Graph> g(std::move(t.graph));
  p.run(*g);
  known.reset();  // only the residuals stay alive
  lin.report.passes = table.rows();
  lin.report.tangent = graph_cost(*g);
  lin.report.linearize_matmul_flops = watch.matmul_flops();
  lin.report.linearize_matmul_by_op = watch.matmul_flops_by_op();
  lin.tangent_graph = g;
  lin.jvp_fn = std::make_shared<Executable>(std::shared_ptr<const Graph>(g), options.runtime);
  // A primal output that is (in) a residual's storage goes to the caller as a copy: writing into
  // one's result is ordinary, and would change later jvp calls (exp's output is its derivative).
  std::unordered_set<const void*> residual_storages;
  for (const Input& in : g->inputs())
    if (in.role == Role::Constant && in.data.defined() && in.data.has_storage())
      residual_storages.insert(in.data.storage().unsafeGetStorageImpl());
  for (at::Tensor& out : lin.primal_outputs)
    if (out.defined() && out.has_storage() && residual_storages.count(out.storage().unsafeGetStorageImpl())) out = out.clone();
  return lin;
}

void reject_random_ops(const Graph& g) {
  for (const Node* n : g.nodes())
    if (n->impure()) throw Error(n->op() + " is random (impure); linearize needs a deterministic function");
}

}  // namespace

Linearized linearize(const TensorFn& fn, const std::vector<TraceInput>& primals, const LinearizeOptions& options) {
  KernelWatch watch;  // everything linearize runs, tracing included
  TraceOptions at_these_primals;
  at_these_primals.specialize_on_scalars = true;  // the linear map is for these primals
  Trace t = trace(fn, primals, at_these_primals);
  reject_random_ops(*t.graph);
  Linearized lin = compile(std::move(t), options, watch);
  return lin;
}

Linearized linearize(std::unique_ptr<Graph> graph, const std::vector<at::Tensor>& primal_values,
                     const LinearizeOptions& options) {
  KernelWatch watch;
  verify(*graph);
  Trace t;
  std::vector<const Input*> primals;
  for (const Input& in : graph->inputs()) {
    if (in.role == Role::Tangent) throw Error("graph already has tangent input '" + in.name + "'");
    if (in.role == Role::Primal) primals.push_back(&in);
    if (in.role == Role::Constant && !in.data.defined()) throw Error("constant '" + in.name + "' is not bound");
  }
  if (primal_values.size() != primals.size())
    throw Error("expected " + std::to_string(primals.size()) + " primal values, got " + std::to_string(primal_values.size()));
  for (size_t i = 0; i < primals.size(); ++i) {
    const TensorMeta& m = primals[i]->value->meta();
    const at::Tensor& v = primal_values[i];
    if (!v.defined() || !TensorMeta::of(v).same_signature(m))
      throw Error("primal '" + primals[i]->name + "': expected " + m.str() + " but got " +
                  (v.defined() ? TensorMeta::of(v).str() : std::string("an undefined tensor")));
    t.values[primals[i]->value->id()] = v;
  }
  reject_random_ops(*graph);
  // The forward, evaluated once; fold reuses every value, as it does a tracing run's.
  for (const Input& in : graph->inputs())
    if (in.role == Role::Constant) t.values[in.value->id()] = in.data;
  for (const Node* n : graph->nodes()) {
    std::vector<at::Tensor> operands;
    for (const Value* v : n->inputs()) operands.push_back(t.values.at(v->id()));
    auto outs = execute_node(*n, operands);
    for (size_t i = 0; i < outs.size(); ++i) t.values[n->output(i)->id()] = outs[i];
  }
  for (const Value* o : graph->outputs()) t.outputs.push_back(t.values.at(o->id()));
  t.graph = std::move(graph);
  return compile(std::move(t), options, watch);
}

JvpResult jvp(const TensorFn& fn, const std::vector<TraceInput>& primals, const std::vector<at::Tensor>& tangents,
              const LinearizeOptions& options) {
  Linearized lin = linearize(fn, primals, options);
  return {lin.primal_outputs, lin.jvp(tangents)};
}

}  // namespace jvpc
