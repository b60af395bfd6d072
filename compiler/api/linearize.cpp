#include "compiler/api/linearize.h"

#include "ir/cost/kernel_watch.h"
#include "ir/io/limits.h"
#include "ir/shape_memo.h"
#include "ir/verifier.h"
#include "passes/linearize_pipeline.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>

namespace jvpc {

std::vector<std::string> Linearized::tangent_names() const {
  std::vector<std::string> names;
  for (const Input* in : jvp_fn->arguments()) names.push_back(in->name);
  return names;
}

void Linearized::check_captured() const {
  for (const Captured& c : captured)
    if (c.version.current_version() != c.at)
      throw Error("constant '" + c.name + "' (" + c.meta.str() +
                  ") was written in place after the graph was compiled (it is a tensor the traced function "
                  "captured, and the tangent graph holds values computed from the old one): compile (linearize) "
                  "again");
}

namespace detail {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Linearized linearize_trace(Trace&& t, const LinearizeOptions& options, KernelWatch& watch,
                           std::shared_ptr<PrimalSplit> split) {
  Linearized lin;
  lin.primal_outputs = t.outputs;
  auto state = std::make_shared<LinearizeState>();
  state->known = std::move(t.values);
  Pipeline p;
  p.verify_each(options.verify_each);
  // A traced graph was verified by trace(), its shapes those its kernels produced; a given graph
  // by evaluate_graph().
  p.input_verified(true);
  add_linearize_passes(
      p, LinearizeConfig::of(options.wrt, t.graph->outputs().size(), options.residual_budget, split != nullptr), state,
      options.disabled_passes);
  CostTable table("trace");
  if (options.pass_costs) p.observe(&table);
  for (PassObserver* o : options.observers) p.observe(o);
  std::shared_ptr<Graph> g(std::move(t.graph));
  for (const Node* n : g->nodes())
    if (n->impure()) lin.report.random_ops.push_back(n->op());
  const ShapeInferenceStats shapes0 = shape_inference_stats();
  if (!options.pass_costs) table.start(*g);
  {
    // Fold counts the kernels it runs, and the watch pauses: watching every dispatcher call
    // (shape inference's Meta kernels too) would cost more than those kernels.
    KernelWatch::Paused by_fold(watch);
    p.run(*g);
  }
  watch.add(state->fold_matmul_flops);
  if (split) *split = std::move(state->split);
  if (!options.pass_costs) table.after_pass("tangent graph", *g, true);
  const double shape_ms = shape_inference_stats().computed_ms - shapes0.computed_ms;
  state->known.clear();  // only the residuals stay alive
  // Residuals and captured constants keep no autograd graph alive (a detached tensor shares the
  // data and the version counter, so writes into it are still noticed).
  for (Input& in : g->inputs())
    if (in.role == Role::Constant && in.data.defined() && in.data.requires_grad()) in.data = in.data.detach();
  lin.report.passes = table.rows();
  lin.report.timings = p.timings();
  // The table's first row counted the traced graph, its last the tangent graph.
  lin.report.forward = table.rows().front().cost;
  lin.report.tangent = table.rows().back().cost;
  lin.report.attention = state->attention;
  lin.report.linearize_matmul_flops = watch.matmul_flops();
  lin.report.linearize_matmul_by_op = watch.matmul_flops_by_op();
  lin.tangent_graph = g;
  auto t0 = std::chrono::steady_clock::now();
  lin.jvp_fn = std::make_shared<Executable>(std::shared_ptr<const Graph>(g), options.runtime, Executable::Verified{});
  double run = 0, check = 0;
  for (const PassTime& pt : lin.report.timings) {
    run += pt.run_ms;
    check += pt.verify_ms;
  }
  lin.report.phases = {{"passes", run},
                       {"verification", check},
                       {"cost table", table.ms()},
                       {"executable", ms_since(t0)},
                       {"shape inference", shape_ms}};
  // A primal output that is (in) a residual's storage goes to the caller as a copy: writing into
  // one's result is ordinary, and would change later jvp calls (exp's output is its derivative).
  std::unordered_set<const void*> residual_storages;
  for (const Input& in : g->inputs())
    if (in.role == Role::Constant && in.data.defined() && in.data.has_storage())
      residual_storages.insert(in.data.storage().unsafeGetStorageImpl());
  for (at::Tensor& out : lin.primal_outputs)
    if (out.defined() && out.has_storage() && residual_storages.count(out.storage().unsafeGetStorageImpl()))
      out = out.clone();
  return lin;
}

void add_trace_and_total(CompileReport& r, double trace_ms, std::chrono::steady_clock::time_point t0,
                         const char* first) {
  r.phases.insert(r.phases.begin(), {first, trace_ms});
  r.phases.push_back({"total", ms_since(t0)});
}

std::vector<Linearized::Captured> captured_of(const Graph& g) {
  std::vector<Linearized::Captured> captured;
  for (const Input& in : g.inputs())
    if (in.role == Role::Constant && in.data.defined() && !in.data.is_inference())
      captured.push_back({in.name, in.value->meta(), in.data.unsafeGetTensorImpl()->version_counter(),
                          static_cast<uint32_t>(in.data._version())});
  return captured;
}

void refuse_state(const std::vector<TraceInput>& inputs, const char* who) {
  for (const TraceInput& in : inputs)
    if (in.state)
      throw Error(std::string(who) + ": input '" + in.name +
                  "' is state, which a compiled program writes back; here it would be an input of the linear map "
                  "(capture the module's buffers instead)");
}

Trace counted_trace(const TensorFn& fn, const std::vector<TraceInput>& inputs, const TraceOptions& options,
                    KernelWatch& watch) {
  Trace t;
  {
    KernelWatch::Paused by_the_tracer(watch);
    t = trace(fn, inputs, options);
  }
  watch.add(t.matmul_flops_by_op);
  return t;
}

Trace evaluate_graph(std::unique_ptr<Graph> graph, const std::vector<at::Tensor>& primal_values) {
  verify(*graph);
  Trace t;
  std::vector<const Input*> primals;
  for (const Input& in : graph->inputs()) {
    if (in.role == Role::Tangent) throw Error("graph already has tangent input '" + in.name + "'");
    if (in.role == Role::Primal) primals.push_back(&in);
    if (in.role == Role::Constant && !in.data.defined()) throw Error("constant '" + in.name + "' is not bound");
  }
  if (primal_values.size() != primals.size())
    throw Error("expected " + std::to_string(primals.size()) + " primal values, got " +
                std::to_string(primal_values.size()));
  for (size_t i = 0; i < primals.size(); ++i) {
    const TensorMeta& m = primals[i]->value->meta();
    const at::Tensor& v = primal_values[i];
    if (!v.defined() || !TensorMeta::of(v).same_signature(m))
      throw Error("primal '" + primals[i]->name + "': expected " + m.str() + " but got " +
                  (v.defined() ? TensorMeta::of(v).str() : std::string("an undefined tensor")));
    t.values[primals[i]->value->id()] = v;
  }
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
  return t;
}

}  // namespace detail

Linearized linearize(const TensorFn& fn, const std::vector<TraceInput>& primals, const LinearizeOptions& options) {
  detail::refuse_state(primals, "linearize");
  KernelWatch watch;  // everything linearize runs, tracing included
  auto t0 = std::chrono::steady_clock::now();
  TraceOptions at_these_primals;
  at_these_primals.specialize_on_scalars = true;  // the linear map is for these primals
  Trace t = detail::counted_trace(fn, primals, at_these_primals, watch);
  const double trace_ms = detail::ms_since(t0);
  // The outputs carry the tracing run's autograd history (its kernels ran through Autograd, as
  // eager's do); the values kept for folding do not need it, and residuals must not hold it.
  for (auto& [id, v] : t.values)
    if (v.defined() && v.requires_grad()) v = v.detach();
  std::vector<Linearized::Captured> captured = detail::captured_of(*t.graph);
  Linearized lin = detail::linearize_trace(std::move(t), options, watch);
  lin.captured = std::move(captured);
  detail::add_trace_and_total(lin.report, trace_ms, t0);
  return lin;
}

Linearized linearize(std::unique_ptr<Graph> graph, const std::vector<at::Tensor>& primal_values,
                     const LinearizeOptions& options) {
  KernelWatch watch;
  auto t0 = std::chrono::steady_clock::now();
  Trace t = detail::evaluate_graph(std::move(graph), primal_values);
  const double eval_ms = detail::ms_since(t0);
  Linearized lin = detail::linearize_trace(std::move(t), options, watch);
  detail::add_trace_and_total(lin.report, eval_ms, t0, "evaluate");
  return lin;
}

JvpResult jvp(const TensorFn& fn, const std::vector<TraceInput>& primals, const std::vector<at::Tensor>& tangents,
              const LinearizeOptions& options) {
  Linearized lin = linearize(fn, primals, options);
  return {lin.primal_outputs, lin.jvp(tangents)};
}

}  // namespace jvpc
