// LinearizeCache: see linearize_cache.h.
#include "compiler/api/linearize_cache.h"

#include "ir/cost/kernel_watch.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "passes/passes.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <sstream>
#include <unordered_set>

namespace jvpc {

struct LinearizeCache::Entry {
  std::string key;
  std::vector<LinearizeCache::Kept> constants;  // per constant of the traced graph, in input order
  std::shared_ptr<const Graph> primal;          // primal inputs and constants -> outputs, then residuals
  std::shared_ptr<const Graph> tangent_graph;   // residuals unbound
  std::shared_ptr<const Executable> tangent;
  std::vector<size_t> residual_output;  // per tangent-graph constant: its primal-graph output
  CompileReport report;
};

namespace {

using clock = std::chrono::steady_clock;

template <class Names>
void put_names(std::ostream& os, const Names& names) {
  for (const std::string& n : names) os << n << '\0';
}

void put_number(std::ostream& os, const std::optional<int64_t>& v) { os << '|' << (v ? std::to_string(*v) : "-"); }

// The part of the key the options make. The structured bindings name every field of both
// option structs, so that a field added to either is a compile error here until it is keyed
// (or said here not to change the compiled graph).
std::string options_key(const LinearizeOptions& o) {
  const auto& [wrt, disabled_passes, observers, verify_each, residual_budget, pass_costs, runtime] = o;
  (void)observers;    // a linearize with observers is not cached
  (void)verify_each;  // checks the graph, changes nothing in it
  const auto& [cuda_graph, static_outputs, reuse_buffers, functional_under_dispatch_mode, max_memory] = runtime;
  std::ostringstream os;
  put_names(os, wrt);
  os << '|';
  put_names(os, disabled_passes);
  os << '|';
  for (bool b : {pass_costs, cuda_graph, static_outputs, reuse_buffers, functional_under_dispatch_mode}) os << b;
  put_number(os, residual_budget);
  put_number(os, max_memory);
  return os.str();
}

std::vector<at::Tensor> bound_constants(const Graph& g) {
  std::vector<at::Tensor> out;
  for (const Input& in : g.inputs())
    if (in.role == Role::Constant) out.push_back(in.data);
  return out;
}

// A constant is the same as a kept one where it is the same tensor (whatever its values now:
// an optimizer step writes weights in place), or, up to this many elements, equal in value to
// what it was when compiled (Python numbers LibTorch wraps in tensors, and tensors a function
// makes afresh at every call outside the dispatcher, such as a positional-embedding table).
constexpr int64_t kByValue = 4096;

bool same_constant(const LinearizeCache::Kept& kept, const at::Tensor& now) {
  if (!kept.tensor.defined() || !now.defined()) return kept.tensor.defined() == now.defined();
  if (kept.tensor.unsafeGetTensorImpl() == now.unsafeGetTensorImpl()) return true;
  if (!kept.value.defined()) return false;
  c10::impl::ExcludeDispatchKeyGuard no_python_modes(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return kept.value.scalar_type() == now.scalar_type() && kept.value.sizes() == now.sizes() &&
         at::equal(kept.value, now);
}

LinearizeCache::Kept kept(const at::Tensor& c) {
  if (!c.defined() || c.numel() > kByValue) return {c, at::Tensor()};
  c10::impl::ExcludeDispatchKeyGuard no_python_modes(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return {c, c.clone()};
}

bool cacheable(const Graph& g) {
  if (g.outputs().empty()) return false;
  for (const Node* n : g.nodes())
    for (size_t i = 0; i < n->outputs().size(); ++i)
      if (value_dependent_shape(*n, i)) return false;
  return true;
}

// `t` in the layout `m` declares: as it is, or copied into it.
at::Tensor laid_out(const at::Tensor& t, const TensorMeta& m) {
  if (t.strides() == at::IntArrayRef(m.strides)) return t;
  return at::empty_strided(m.sizes, m.strides, t.options()).copy_(t);
}

// The residuals of the cached primal graph at this trace: its values by id where the trace has
// them (the graphs are equal, so ids name the same values), its other nodes evaluated (fold).
std::vector<at::Tensor> fold(const LinearizeCache::Entry& e, const Graph& traced, TensorsById& values) {
  at::NoGradGuard no_grad;
  for (const Input& in : traced.inputs())  // this call's captured tensors, at their ids
    if (in.role == Role::Constant) values[in.value->id()] = in.data;
  const Graph& g = *e.primal;
  for (const Input& in : g.inputs())
    if (!values.count(in.value->id())) {
      if (in.role != Role::Constant || !in.data.defined())
        throw Error("internal error: the cached primal graph's input '" + in.name + "' is not in the trace");
      values[in.value->id()] = in.data;
    }
  for (const Node* n : g.nodes()) {
    bool known = true;
    for (const Value* o : n->outputs()) known &= values.count(o->id()) > 0;
    if (known) continue;
    std::vector<at::Tensor> operands;
    for (const Value* v : n->inputs()) operands.push_back(values.at(v->id()));
    std::vector<at::Tensor> outs = execute_node(*n, operands);
    for (size_t i = 0; i < outs.size(); ++i) values[n->output(i)->id()] = outs[i];
  }
  std::vector<at::Tensor> residuals;
  size_t k = 0;
  for (const Input& r : e.tangent->graph().inputs())
    if (r.role == Role::Constant)
      residuals.push_back(laid_out(values.at(g.outputs()[e.residual_output[k++]]->id()), r.value->meta()));
  return residuals;
}

// Primal outputs that are (in) a residual's storage go to the caller as copies, as linearize's do.
void copy_outputs_sharing_residuals(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& residuals) {
  std::unordered_set<const void*> storages;
  for (const at::Tensor& r : residuals)
    if (r.defined() && r.has_storage()) storages.insert(r.storage().unsafeGetStorageImpl());
  for (at::Tensor& out : outputs)
    if (out.defined() && out.has_storage() && storages.count(out.storage().unsafeGetStorageImpl())) out = out.clone();
}

// The entry for a compile that split at fold: the tangent graph with its residuals unbound.
std::shared_ptr<const LinearizeCache::Entry> entry_of(std::string key, std::vector<at::Tensor> constants,
                                                      std::unique_ptr<Graph> primal, const Linearized& lin,
                                                      const ExecutableOptions& runtime) {
  auto e = std::make_shared<LinearizeCache::Entry>();
  e->key = std::move(key);
  for (const at::Tensor& c : constants) e->constants.push_back(kept(c));
  std::unordered_map<std::string, size_t> residual_at;
  for (size_t i = 0; i < primal->outputs().size(); ++i) residual_at[primal->output_names()[i]] = i;
  std::unique_ptr<Graph> tangent = lin.tangent_graph->clone();
  for (Input& in : tangent->inputs()) {
    if (in.role != Role::Constant) continue;
    auto it = residual_at.find(in.name);
    if (it == residual_at.end()) return nullptr;  // a constant fold did not make: not kept
    e->residual_output.push_back(it->second);
    in.data = at::Tensor();
    in.data_version.reset();
  }
  e->primal = std::shared_ptr<const Graph>(std::move(primal));
  e->tangent_graph = std::shared_ptr<const Graph>(std::move(tangent));
  e->tangent = std::make_shared<const Executable>(e->tangent_graph, runtime);
  e->report = lin.report;
  return e;
}

}  // namespace

size_t LinearizeCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::shared_ptr<const LinearizeCache::Entry> LinearizeCache::find(const std::string& key,
                                                                  const std::vector<at::Tensor>& constants) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const Entry& e = **it;
    if (e.key != key || e.constants.size() != constants.size()) continue;
    bool same = true;
    for (size_t i = 0; same && i < constants.size(); ++i) same = same_constant(e.constants[i], constants[i]);
    if (!same) continue;
    auto found = *it;
    entries_.splice(entries_.begin(), entries_, it);
    return found;
  }
  return nullptr;
}

void LinearizeCache::keep(std::shared_ptr<const Entry> e) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_front(std::move(e));
  while (entries_.size() > capacity_) entries_.pop_back();
}

Linearized LinearizeCache::linearize(const TensorFn& fn, const std::vector<TraceInput>& primals,
                                     const LinearizeOptions& options) {
  detail::refuse_state(primals, "linearize");
  KernelWatch watch;  // everything this call runs: the trace, and fold or the passes
  auto t0 = clock::now();
  TraceOptions at_these_primals;
  at_these_primals.specialize_on_scalars = true;  // as linearize: the graph records the values read
  Trace t = detail::counted_trace(fn, primals, at_these_primals, watch);
  for (auto& [id, v] : t.values)
    if (v.defined() && v.requires_grad()) v = v.detach();
  const double trace_ms = detail::ms_since(t0);
  std::vector<Linearized::Captured> captured = detail::captured_of(*t.graph);

  auto t1 = clock::now();
  const bool keepable = capacity_ > 0 && options.observers.empty() && cacheable(*t.graph);
  std::string key = keepable ? to_text(*t.graph) + "\n" + options_key(options) : std::string();
  std::vector<at::Tensor> constants = bound_constants(*t.graph);
  std::shared_ptr<const Entry> e = keepable ? find(key, constants) : nullptr;
  const double lookup_ms = detail::ms_since(t1);

  if (!e) {
    ++misses_;
    auto split = keepable ? std::make_shared<PrimalSplit>() : nullptr;
    Linearized lin = detail::linearize_trace(std::move(t), options, watch, split);
    lin.captured = std::move(captured);
    if (split && split->primal) {
      auto made = entry_of(std::move(key), std::move(constants), std::move(split->primal), lin, options.runtime);
      if (made) keep(std::move(made));
    }
    detail::add_trace_and_total(lin.report, trace_ms, t0);
    return lin;
  }

  ++hits_;
  auto t2 = clock::now();
  std::vector<at::Tensor> residuals = fold(*e, *t.graph, t.values);
  Linearized lin;
  lin.primal_outputs = std::move(t.outputs);
  copy_outputs_sharing_residuals(lin.primal_outputs, residuals);
  lin.tangent_graph = e->tangent_graph;
  lin.jvp_fn = std::shared_ptr<Executable>(e->tangent->with_constants(residuals));
  lin.captured = std::move(captured);
  lin.report = e->report;
  lin.report.timings.clear();  // no pass ran
  lin.report.linearize_matmul_flops = watch.matmul_flops();
  lin.report.linearize_matmul_by_op = watch.matmul_flops_by_op();
  lin.report.phases = {{"trace", trace_ms}, {"cache", lookup_ms}, {"fold", detail::ms_since(t2)}};
  lin.report.phases.push_back({"total", detail::ms_since(t0)});
  return lin;
}

}  // namespace jvpc
