// Compiled programs: compile runs linearize's pipeline with fold splitting the graph
// (passes/fold.cpp); the runtime half, ProgramExecutable (runtime/program.h), runs it at new
// points. See program.h.
#include "compiler/api/program.h"
#include "ir/op.h"

#include "ir/cost/kernel_watch.h"
#include "ir/ops.h"
#include "passes/passes.h"

#include <ATen/ATen.h>

#include <unordered_set>

namespace jvpc {

namespace {

// Ops whose output shapes follow the values of their inputs: a graph records the shapes of one
// run, which other inputs would not give.
void reject_data_dependent_shapes(const Graph& g) {
  static const std::unordered_set<std::string> ops = {
      ops::nonzero,
      ops::masked_select,
      ops::_unique,
      ops::_unique2,
      ops::unique_dim,
      ops::unique_consecutive,
      ops::bincount,
      ops::repeat_interleave_Tensor,
      ops::unique_dim_consecutive,
  };
  for (const Node* n : g.nodes())
    if (ops.count(n->op()) || (n->is(ops::index_Tensor) && value_dependent_shape(*n, 0)))
      throw Error(n->op() + (n->is(ops::index_Tensor) ? " with a boolean mask (x[x > 0])" : "") +
                  " gives an output whose shape depends on the input values; a program's shapes are fixed when it "
                  "is compiled: linearize at each point instead");
}

Program from_trace(Trace&& t, const ProgramOptions& options, KernelWatch& watch) {
  const size_t all_outputs = t.graph->outputs().size();  // the function's, then its state's
  const size_t num_outputs = all_outputs - t.state_of.size();
  if (num_outputs == 0) throw Error("compile: the function returns no tensor");
  std::vector<std::string> state_inputs;
  for (size_t i : t.state_of) state_inputs.push_back(t.graph->inputs()[i].name);
  auto split = std::make_shared<PrimalSplit>();
  Linearized lin = detail::linearize_trace(std::move(t), options.linearize, watch, split);
  if (!split->primal) throw Error("compile: fold did not split the graph");
  ProgramGraphs graphs{std::move(split->primal), lin.tangent_graph->clone(), num_outputs, options.exact_strides,
                       std::move(state_inputs)};
  // The state's tangents are nobody's: the tangent graph returns the function's outputs' only.
  for (size_t i = all_outputs; i-- > num_outputs;) graphs.tangent->erase_output(i);
  dce(*graphs.tangent);
  // Residuals that a pass after fold left unread are not computed.
  std::unordered_set<std::string> read;
  for (const Input& in : graphs.tangent->inputs())
    if (in.role == Role::Constant) read.insert(in.name);
  Graph& primal = *graphs.primal;
  for (size_t i = primal.outputs().size(); i-- > all_outputs;)
    if (!read.count(primal.output_names()[i])) primal.erase_output(i);
  dce(primal);
  // Captured tensors keep no autograd history in the primal graph (a detached tensor shares the
  // data and the version counter: an optimizer step's writes are seen). A leaf (a parameter)
  // holds none and stays itself, so that a run under autograd reaches its .grad.
  for (Input& in : primal.inputs())
    if (in.role == Role::Constant && in.data.defined() && in.data.requires_grad() && !in.data.is_leaf())
      in.data = in.data.detach();
  return Program(std::move(graphs), options.linearize.runtime, std::move(lin.report));
}

}  // namespace

Program::Program(ProgramGraphs graphs, const ExecutableOptions& runtime, CompileReport report)
    : primal_cost_(std::make_shared<GraphCost>(graph_cost(*graphs.primal))) {
  report.tangent = graph_cost(*graphs.tangent);
  report_ = std::make_shared<const CompileReport>(std::move(report));
  exec_ = std::make_shared<const ProgramExecutable>(std::move(graphs), runtime);
}

namespace {

Linearized linearized_at(ProgramExecutable::Point p, const ProgramExecutable& exec, const CompileReport& report) {
  Linearized lin;
  lin.primal_outputs = std::move(p.primal_outputs);
  lin.tangent_graph = exec.tangent_graph();
  lin.jvp_fn = std::move(p.jvp_fn);
  lin.report.tangent = report.tangent;
  return lin;
}

}  // namespace

Linearized Program::linearize(const std::vector<at::Tensor>& primals) const {
  return linearized_at(exec_->linearize(primals), *exec_, *report_);
}

Linearized Program::linearize_from(const std::vector<at::Tensor>& primals,
                                   std::vector<at::Tensor> primal_graph_outputs) const {
  return linearized_at(exec_->point_from(primals, std::move(primal_graph_outputs)), *exec_, *report_);
}

void Program::save(const std::string& path, const SaveOptions& options) const {
  save_program(*exec_->primal_graph(), *exec_->tangent_graph(), exec_->num_primal_outputs(), exec_->exact_strides(),
               exec_->state_inputs(), path, options);
}

Program compile(const TensorFn& fn, const std::vector<TraceInput>& example_primals, const ProgramOptions& options) {
  KernelWatch watch;
  Trace t = detail::counted_trace(fn, example_primals, {}, watch);  // without specialize_on_scalars: replayed
  reject_data_dependent_shapes(*t.graph);
  for (auto& [id, v] : t.values)
    if (v.defined() && v.requires_grad()) v = v.detach();
  return from_trace(std::move(t), options, watch);
}

Program compile(std::unique_ptr<Graph> graph, const std::vector<at::Tensor>& example_values,
                const ProgramOptions& options) {
  KernelWatch watch;
  reject_data_dependent_shapes(*graph);
  return from_trace(detail::evaluate_graph(std::move(graph), example_values), options, watch);
}

Program Program::load(const std::string& path, const LoadOptions& options, const ExecutableOptions& runtime) {
  return Program(load_program(path, options), runtime);
}

}  // namespace jvpc
