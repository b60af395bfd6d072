// Constant folding of the primal part of a graph: linearize's "do the primal work once", and the
// split of a linearized graph into a primal graph and a tangent graph that jvpc::compile keeps.
//
// A value is primal-only when it does not depend on a tangent input (a random node's draw
// included: the linear map is for that one draw). Every primal-only value that a
// tangent-dependent node (or a node without outputs, or a tangent output) reads is a residual.
// split_primal() takes the primal-only nodes that compute the residuals (and the primal outputs,
// where the graph still returns them, and every draw) into a graph of their own, the primal
// graph, and leaves in their place a constant input "r<k>" per residual: what stays is the
// tangent graph, from residuals and tangents to output tangents. fold() is that split followed
// by one run of the primal graph, evaluate_primal() (where nothing keeps the primal graph, as in
// linearize, the same run on the graph itself, without the copy): tensors come from `known` (the tracing run
// already computed every traced value) or are computed through the runtime, each node at most
// once, only if a residual needs it, and in graph order, releasing each computed tensor after
// its last read; each residual is bound to its tensor. What nothing
// reads any more is left for dce.
//
// Never a residual: the zeros a rule materializes for a zero tangent (aten::zeros of a shape,
// such as the cached half of a cat's tangent): made per call they cost a fill, held they would
// cost their bytes for as long as the tangent graph lives. A residual that shares storage with a
// primal input is marked as aliasing it (Input::aliases: the caller owns those bytes), and one
// whose layout is not dense (an expanded view) is stored compactly.
//
//   %5 = aten::bmm(%1, %2)              // q·kᵀ: primal-only, known from the trace
//   %6 = aten::_safe_softmax(%5, -1)    // primal-only, known
//   %9 = aten::_softmax_backward_data(%8, %6, -1, Float)
//  =>
//   %9 = aten::_softmax_backward_data(%8, %r2, -1, Float)   with r2 bound to softmax's value
//
// A compiled program (compiler/api/program.h) keeps the primal graph and runs it through the
// runtime at each new point; its residual inputs keep the metadata fold gave them at the
// example point.
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/cost/kernel_watch.h"
#include "ir/ops.h"
#include "runtime/executable.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

namespace {

// Whether a layout covers its elements once each, without gaps (is_non_overlapping_and_dense):
// what fold stores as it is, where an expanded or strided view is stored compactly.
bool dense(const TensorMeta& m) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that matter
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    if (m.sizes[i] == 0) return true;
    if (m.sizes[i] != 1) dims.emplace_back(m.strides[i], m.sizes[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// Residual names, "r<k>" not yet taken in the graph.
std::vector<std::string> residual_names(const Graph& g, size_t n) {
  std::vector<std::string> names;
  std::unordered_set<std::string_view> taken;
  int next = 0;
  for (const Input& in : g.inputs()) {
    taken.insert(in.name);
    if (in.name.rfind("r", 0) == 0) next++;
  }
  for (size_t k = 0; k < n; ++k) {
    std::string name;
    do name = "r" + std::to_string(next++);
    while (taken.count(name));
    names.push_back(name);
  }
  return names;
}

// Each residual becomes a constant input, unbound (fold binds it), that its readers read. An
// expanded view is declared (and stored) compactly.
void read_from_inputs(Graph& g, const std::vector<Value*>& residuals, const std::vector<std::string>& names) {
  for (size_t k = 0; k < residuals.size(); ++k) {
    Value* v = residuals[k];
    TensorMeta meta = v->meta();
    if (!dense(meta)) meta = TensorMeta::contiguous(meta.sizes, meta.dtype, meta.device);
    v->replace_all_uses_with(g.add_input(names[k], meta, Role::Constant));
  }
}

}  // namespace

std::vector<Value*> residual_values(Graph& g, const ValueSet& varying, size_t first_output,
                                    const std::function<bool(const Input&)>& input_held) {
  auto made_per_call = [](const Value* v) {
    const Node* p = v->producer();
    return p && p->inputs().empty() && p->is(ops::zeros);
  };
  std::vector<Value*> residuals;
  std::unordered_set<const Value*> chosen;
  auto want = [&](Value* v) {
    if (v && !varying.count(v) && !made_per_call(v) && (!g.is_input(v) || input_held(g.input_of(v))) &&
        chosen.insert(v).second)
      residuals.push_back(v);
  };
  for (Node* n : g.nodes())
    if (n->outputs().empty() || varying.count(n->output(0)))
      for (Value* v : n->inputs()) want(v);
  for (size_t i = first_output; i < g.outputs().size(); ++i) want(g.outputs()[i]);
  return residuals;
}

PrimalSplit split_primal(Graph& g, const SplitOptions& options) {
  const ValueSet varying = tangent_dependent(g);
  auto primal_only = [&](const Value* v) { return v && !varying.count(v); };
  if (options.primal_outputs > g.outputs().size()) throw Error("split: the graph has fewer outputs than primal ones");

  // The residuals; constants stay constants of the tangent graph, unless a program reads them
  // afresh at each point.
  std::vector<Value*> residuals = residual_values(g, varying, options.primal_outputs, [&](const Input& in) {
    return in.role != Role::Constant || options.constants_as_residuals;
  });

  PrimalSplit split;
  if (residuals.empty() && options.primal_outputs == 0) return split;

  // The primal graph: every primal input (a program takes them all), the constants its nodes
  // read, and the primal-only nodes the results need, in graph order. Values keep their ids, so
  // that `known` (by id) and errors name them as in the graph they came from.
  std::vector<const Value*> results(g.outputs().begin(), g.outputs().begin() + options.primal_outputs);
  results.insert(results.end(), residuals.begin(), residuals.end());
  std::unordered_set<const Value*> needed;
  std::vector<const Value*> todo = results;
  // Every draw, read or not: a program draws from the generator in eager's order and number.
  for (const Node* n : g.nodes())
    if (n->impure() && !n->outputs().empty() && primal_only(n->output(0))) todo.push_back(n->output(0));
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    if (!needed.insert(v).second) continue;
    if (const Node* n = v->producer()) {
      if (!primal_only(n->output(0)))
        throw Error("split: primal output %" + std::to_string(v->id()) + " reads tangents");
      for (const Value* in : n->inputs()) todo.push_back(in);
      for (const Value* out : n->outputs()) needed.insert(out);
    }
  }
  auto primal = std::make_unique<Graph>();
  std::unordered_map<const Value*, Value*> map;
  std::unordered_map<const Value*, int> id;
  for (const Input& in : g.inputs()) {
    if (in.role == Role::Tangent || (in.role == Role::Constant && !needed.count(in.value))) continue;
    Value* v = primal->add_input(in.name, in.value->meta(), in.role, in.differentiable);
    Input& copy = primal->inputs().back();
    copy.data = in.data;
    copy.data_version = in.data_version;
    map[in.value] = v;
  }
  for (const Node* n : g.nodes()) {
    if (n->outputs().empty() || !needed.count(n->output(0))) continue;
    std::vector<Value*> ins;
    for (Value* v : n->inputs()) ins.push_back(map.at(v));
    std::vector<TensorMeta> outs;
    for (const Value* v : n->outputs()) outs.push_back(v->meta());
    Node* c = primal->create(n->op(), n->args(), ins, outs, n->return_counts(), n->impure());
    for (size_t i = 0; i < outs.size(); ++i) map[n->output(i)] = c->output(i);
  }
  // The primal graph returns the residuals under the names of the tangent graph's inputs they become.
  split.residuals = residual_names(g, residuals.size());
  for (size_t i = 0; i < results.size(); ++i)
    primal->add_output(map.at(results[i]),
                       i < options.primal_outputs ? g.output_names()[i] : split.residuals[i - options.primal_outputs]);
  for (const auto& [from, to] : map) id[to] = from->id();
  primal->renumber([&](const Value* v) { return id.at(v); });

  // The tangent graph: the residuals read from inputs, and the primal outputs leave it.
  read_from_inputs(g, residuals, split.residuals);
  for (size_t i = 0; i < options.primal_outputs; ++i) g.erase_output(0);
  split.primal = std::move(primal);
  return split;
}

namespace {

// Runs node n, adding its matmul FLOPs to `by_op` where given: a jvpc:: operator's are those of
// the kernels it calls, as KernelWatch counts them; another's by its arguments and result.
std::vector<at::Tensor> run_counted(const Node& n, const std::vector<at::Tensor>& operands,
                                    std::map<std::string, int64_t>* by_op) {
  if (!by_op) return execute_node(n, operands);
  std::vector<at::Tensor> outs;
  c10::IValue first;
  auto call = [&]() -> const c10::IValue* {
    outs = execute_node(n, operands);
    if (!outs.empty()) first = outs[0];
    return &first;
  };
  auto args = [&] {
    std::vector<c10::IValue> stack;
    for (const Arg& a : n.args())
      stack.push_back(arg_to_ivalue(a, [&](int o) { return operands.at(static_cast<size_t>(o)); }));
    return stack;
  };
  count_kernel_call(op_info(n.op()), call, args, *by_op);
  return outs;
}

// The tensors of `targets`, values of `primal` (see evaluate_primal).
std::vector<at::Tensor> evaluate_values(const Graph& primal, const std::vector<const Value*>& targets,
                                        const TensorsById& known, std::map<std::string, int64_t>* matmul_flops_by_op) {
  at::NoGradGuard no_grad;  // the values are data: residuals keep no autograd history
  std::unordered_map<const Value*, at::Tensor> value;
  for (const Input& in : primal.inputs())
    if (in.role == Role::Constant && in.data.defined()) value[in.value] = in.data;
  auto available = [&](const Value* v) { return value.count(v) || known.count(v->id()); };

  // The nodes that run: those the outputs need, through values neither bound nor known. Each
  // value they compute is released after its last read, so the run holds what is live, not
  // every temporary (the B·H·L² steps on the way to a held P).
  std::unordered_set<const Node*> runs;
  std::unordered_map<const Value*, int> reads;  // reads still to come by nodes that run
  std::vector<const Value*> todo = targets;
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    if (available(v)) continue;
    const Node* n = v->producer();
    if (!n)
      throw Error("fold: no value for " + std::string(role_name(primal.input_of(v).role)) + " input '" +
                  primal.input_of(v).name + "'");
    if (!runs.insert(n).second) continue;
    for (const Value* in : n->inputs()) {
      reads[in]++;
      todo.push_back(in);
    }
  }
  std::unordered_set<const Value*> results(targets.begin(), targets.end());
  auto get = [&](const Value* v) {
    auto it = value.find(v);
    return it != value.end() ? it->second : known.at(v->id());
  };
  for (const Node* n : primal.nodes()) {
    if (!runs.count(n)) continue;
    std::vector<at::Tensor> operands;
    for (const Value* in : n->inputs()) operands.push_back(get(in));
    std::vector<at::Tensor> outs = run_counted(*n, operands, matmul_flops_by_op);
    operands.clear();
    for (size_t i = 0; i < outs.size(); ++i)
      if (reads.count(n->output(i)) || results.count(n->output(i))) value[n->output(i)] = std::move(outs[i]);
    outs.clear();
    for (const Value* in : n->inputs())
      if (--reads.at(in) == 0 && !results.count(in)) value.erase(in);
  }
  std::vector<at::Tensor> out;
  for (const Value* v : targets) out.push_back(get(v));
  return out;
}

}  // namespace

std::vector<at::Tensor> evaluate_primal(const Graph& primal, const TensorsById& known,
                                        std::map<std::string, int64_t>* matmul_flops_by_op) {
  return evaluate_values(primal, {primal.outputs().begin(), primal.outputs().end()}, known, matmul_flops_by_op);
}

bool fold(Graph& g, const TensorsById& known, const SplitOptions& options, PrimalSplit* split_out,
          std::map<std::string, int64_t>* matmul_flops_by_op) {
  // Per residual: its name, its value, and its metadata and id as declared.
  std::vector<std::string> names;
  std::vector<at::Tensor> values;
  std::vector<std::pair<TensorMeta, int>> declared;
  PrimalSplit split;
  if (split_out || options.primal_outputs > 0) {
    split = split_primal(g, options);
    if (!split.primal) return false;
    values = evaluate_primal(*split.primal, known, matmul_flops_by_op);
    values.erase(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(options.primal_outputs));
    for (size_t k = 0; k < split.residuals.size(); ++k) {
      const Value* v = split.primal->outputs()[options.primal_outputs + k];
      declared.emplace_back(v->meta(), v->id());
    }
    names = split.residuals;
  } else {
    // Nothing keeps the primal graph: the residuals are evaluated in g itself, as split_primal's
    // copy would evaluate them, and read from inputs after.
    const ValueSet varying = tangent_dependent(g);
    std::vector<Value*> residuals =
        residual_values(g, varying, 0, [](const Input& in) { return in.role != Role::Constant; });
    if (residuals.empty()) return false;
    values = evaluate_values(g, {residuals.begin(), residuals.end()}, known, matmul_flops_by_op);
    for (const Value* v : residuals) declared.emplace_back(v->meta(), v->id());
    names = residual_names(g, residuals.size());
    read_from_inputs(g, residuals, names);
  }

  // Which primal inputs' storage does a residual alias? (The caller owns those bytes.)
  std::unordered_map<const void*, std::string> input_storage;
  for (const Input& in : g.inputs()) {
    if (in.role != Role::Primal) continue;
    auto k = known.find(in.value->id());
    if (k != known.end() && k->second.has_storage())
      input_storage[k->second.storage().unsafeGetStorageImpl()] = in.name;
  }
  std::unordered_map<std::string, Input*> by_name;
  for (Input& in : g.inputs()) by_name[in.name] = &in;
  for (size_t k = 0; k < names.size(); ++k) {
    const auto& [declared_meta, id] = declared[k];
    at::Tensor t = values[k];
    if (!t.is_non_overlapping_and_dense()) t = t.contiguous();  // expanded views are stored compactly
    Input& in = *by_name.at(names[k]);
    if (t.has_storage()) {
      auto it = input_storage.find(t.storage().unsafeGetStorageImpl());
      if (it != input_storage.end()) in.aliases = it->second;
    }
    TensorMeta meta = TensorMeta::of(t);
    if (!meta.same_signature(declared_meta))
      throw Error("fold: value %" + std::to_string(id) + " is declared " + declared_meta.str() + " but computes to " +
                  meta.str());
    in.value->set_meta(meta);  // the layout the kernel gave it
    in.bind(t);
  }
  if (split_out) *split_out = std::move(split);
  return true;
}

}  // namespace jvpc
