#include "runtime/executable.h"

#include "runtime/attention_tangent.h"

#include "ir/io/limits.h"
#include "ir/liveness.h"
#include "ir/op_contracts.h"
#include "ir/ops.h"
#include "ir/verifier.h"
#include "runtime/cuda_graph.h"
#include "runtime/one_thread.h"
#include "runtime/plan.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

namespace jvpc {

namespace {

bool device_matches(const c10::Device& declared, const c10::Device& actual) {
  return declared.type() == actual.type() && (!declared.has_index() || declared.index() == actual.index());
}

std::string meta_of(const at::Tensor& t) { return TensorMeta::of(t).str(); }

// Zeroes all of `t`'s storage, the gaps between its elements included (an empty_strided with
// gaps, which copy and the scatters clone whole).
void zero_storage(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) return;
  t.as_strided({static_cast<int64_t>(t.storage().nbytes() / t.itemsize())}, {1}, 0).zero_();
}

// Whether `t` reaches all of its storage from its start: no offset, no bytes it cannot reach.
bool owns_its_storage(const at::Tensor& t) {
  if (!t.has_storage() || t.storage_offset() != 0) return false;
  size_t reach = t.numel() ? at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize()) : 0;
  return t.storage().nbytes() == reach;
}

// A result must have the shape and dtype the graph declares for it: the graph's metadata may
// come from a file (for kernels without a Meta implementation the loader cannot re-derive it).
// `where()` names the node in an error; it is called only to report one.
template <class Where>
void check_result(const Where& where, const Value* v, const at::Tensor& t) {
  const TensorMeta& m = v->meta();
  if (!t.defined() || t.sizes() != c10::IntArrayRef(m.sizes) || t.scalar_type() != m.dtype)
    throw Error(where() + ": result %" + std::to_string(v->id()) + " is " +
                (t.defined() ? meta_of(t) : std::string("an undefined tensor")) + " where the graph declares " +
                m.str());
}

// A node's results from its call's boxed returns (unpack_returns), in the form the node
// declares: `traced` holds its count per return (Node::return_counts). A return the node does not
// use (count 0) is skipped; one that now holds another number of tensors is an error. An
// undefined tensor where one was traced is kept, for check_result to name.
template <class Where>
void node_results(const Where& where, const std::vector<c10::IValue>& stack, c10::ArrayRef<int> traced,
                  c10::SmallVectorImpl<at::Tensor>& results) {
  results.clear();
  if (traced.size() == 1 && traced[0] == 1 && stack.size() == 1 && stack[0].isTensor()) {
    results.push_back(stack[0].toTensor());  // most ops: one tensor (an undefined one is kept too)
    return;
  }
  std::vector<int> counts;
  std::vector<at::Tensor> returned = unpack_returns(stack, 0, counts);
  size_t next = 0;
  for (size_t r = 0; r < traced.size(); ++r) {
    int got = r < counts.size() ? counts[r] : 0;
    if (traced[r] == got) {
      for (int k = 0; k < got; ++k) results.push_back(std::move(returned[next + static_cast<size_t>(k)]));
    } else if (traced[r] == 1 && got == 0 && stack[r].isTensor()) {
      results.emplace_back();
    } else if (traced[r] != 0) {
      throw Error(where() + ": return " + std::to_string(r) + " does not have the traced form");
    }
    next += static_cast<size_t>(got);
  }
}

// The references a buffer has when nothing else holds it: the tensor's own, and, where the tensor
// is an autograd view (a view op's result outside inference mode) whose base no slot holds any
// more, its base's, which the view keeps.
size_t sole_owners(const at::Tensor& self) {
  if (!self.is_view()) return 1;
  const at::TensorBase& base = self._base();
  return base.use_count() == 1 && base.storage().is_alias_of(self.storage()) ? 2 : 1;
}

}  // namespace

namespace {
const std::shared_ptr<const Graph>& verified(const std::shared_ptr<const Graph>& graph) {
  if (!graph) throw Error("Executable: null graph");
  runtime::register_ops();  // before the schemas of its operators are looked up
  VerifyOptions schemas_only;
  schemas_only.check_shapes = false;  // checked on the first call, against the real results
  verify(*graph, schemas_only);
  return graph;
}
}  // namespace

Executable::Executable(std::shared_ptr<const Graph> graph, ExecutableOptions options)
    : Executable(verified(graph), options, Verified{}) {}

Executable::Executable(std::shared_ptr<const Graph> graph, ExecutableOptions options, Verified)
    : graph_(std::move(graph)), options_(options), cuda_(std::make_unique<CudaGraph>()) {
  if (!graph_) throw Error("Executable: null graph");
  runtime::register_ops();  // keeps the runtime's operators in a static link
  if (!at::hasCUDA())
    for (const Input& in : graph_->inputs())
      if (in.value->meta().device.is_cuda())
        throw Error("input '" + in.name + "' is on " + in.value->meta().device.str() +
                    ", and CUDA is not available on this machine");
  // Before anything is allocated: against the memory of the device the graph runs on.
  Liveness live = analyze_liveness(*graph_);
  check_memory_limit(memory_needed(*graph_, live), options_.max_memory, execution_device(*graph_),
                     "ExecutableOptions::max_memory, --max-memory");
  for (const Input& in : graph_->inputs()) {
    if (in.role != Role::Constant) continue;
    in.check_unwritten();  // since the graph was compiled (or loaded)
    const c10::Device device = in.value->meta().device;
    constants_.push_back(!in.data.defined() ? at::Tensor() : in.data.device() == device ? in.data : in.data.to(device));
    versions_.push_back(version_counter(constants_.back()));  // to notice writes by others holding it
  }
  plan_ = std::make_shared<Plan>(make_plan(*graph_, live, options_.reuse_buffers));
  if (options_.cuda_graph)
    cuda_device_ = cuda_graph_device(*graph_, plan_->arguments, plan_->impure || plan_->checks_indices);
}

Executable::~Executable() = default;

at::Tensor Executable::bindable(size_t i, const at::Tensor& value) const {
  const Input& in = *plan_->constants[i];
  const Value* v = in.value;
  if (!value.defined()) throw Error("constant '" + in.name + "': undefined tensor");
  if (value.sizes().vec() != v->meta().sizes || value.scalar_type() != v->meta().dtype)
    throw Error("constant '" + in.name + "': expected " + v->meta().str() + " but got " + meta_of(value));
  try {
    at::Tensor bound = value.to(v->meta().device);
    // A layout the graph was not compiled for (its views may need the declared one).
    if (v->meta().is_contiguous() && !bound.is_contiguous()) bound = bound.contiguous();
    return bound;
  } catch (const c10::Error& e) {
    throw Error("constant '" + in.name + "': " + one_line(e));
  }
}

void Executable::bind(const std::string& name, const at::Tensor& value) {
  for (size_t i = 0; i < plan_->constants.size(); ++i) {
    if (plan_->constants[i]->name != name) continue;
    at::Tensor bound = bindable(i, value);
    constants_[i] = bound;
    versions_[i] = version_counter(bound);
    std::lock_guard<std::mutex> lock(mu_);
    cuda_ = std::make_unique<CudaGraph>();  // a captured graph read the old tensor
    return;
  }
  throw Error("the graph has no constant named '" + name + "'");
}

Executable::Executable(const Executable& other, std::vector<at::Tensor> constants)
    : graph_(other.graph_),
      options_(other.options_),
      plan_(other.plan_),
      constants_(std::move(constants)),
      cuda_device_(other.cuda_device_),
      cuda_(std::make_unique<CudaGraph>()),
      results_checked_(other.results_checked_.load()) {
  for (const at::Tensor& c : constants_) versions_.push_back(version_counter(c));
}

std::unique_ptr<Executable> Executable::with_constants(const std::vector<at::Tensor>& constants) const {
  if (constants.size() != plan_->constants.size())
    throw Error("expected " + std::to_string(plan_->constants.size()) + " constants, got " +
                std::to_string(constants.size()));
  std::vector<at::Tensor> bound;
  bound.reserve(constants.size());
  for (size_t i = 0; i < constants.size(); ++i) bound.push_back(bindable(i, constants[i]));
  return std::unique_ptr<Executable>(new Executable(*this, std::move(bound)));
}

std::vector<at::Tensor> Executable::checked(const std::vector<at::Tensor>& inputs) const {
  const std::vector<const Input*>& arguments = plan_->arguments;
  if (inputs.size() != arguments.size())
    throw Error("expected " + std::to_string(arguments.size()) + " input tensors, got " +
                std::to_string(inputs.size()));
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& in = *arguments[i];
    const TensorMeta& m = in.value->meta();
    const at::Tensor& t = inputs[i];
    std::string who = std::string(role_name(in.role)) + " '" + in.name + "'";
    if (!t.defined()) throw Error(who + " is an undefined tensor");
    if (t.sizes().vec() != m.sizes) throw Error(who + ": expected shape " + m.str() + " but got " + meta_of(t));
    if (t.scalar_type() != m.dtype) throw Error(who + ": expected dtype " + m.str() + " but got " + meta_of(t));
    if (!device_matches(m.device, t.device()))
      throw Error(who + ": expected device " + m.device.str() + " but got " + t.device().str());
    if (t.layout() != c10::kStrided) throw Error(who + ": only strided tensors are supported");
    if (t.is_neg() || t.is_conj()) throw Error(who + ": lazily negated or conjugated tensors are not supported");
    // Views with a layout the graph was not compiled for are made contiguous (a copy);
    // contiguous inputs are used as they are, unless the graph addresses storage by absolute
    // offsets and the input is a view into a larger storage: it then gets a storage of its own,
    // so that those offsets mean what they meant when traced and stay inside the input.
    at::Tensor x = m.is_contiguous() && !t.is_contiguous() ? t.contiguous() : t;
    if (plan_->storage_relative && !owns_its_storage(x)) x = x.clone(at::MemoryFormat::Preserve);
    out.push_back(std::move(x));
  }
  for (size_t i = 0; i < constants_.size(); ++i) {
    const at::Tensor& c = constants_[i];
    const Input& in = *plan_->constants[i];
    if (!c.defined()) throw Error("constant '" + in.name + "' is not bound");
    if (versions_[i] && c._version() != *versions_[i]) throw Error(in.written_error());
  }
  return out;
}

std::vector<at::Tensor> Executable::run_eager(const std::vector<at::Tensor>& inputs, bool functional) const {
  const Plan& plan = *plan_;
  std::vector<at::Tensor> slots(static_cast<size_t>(plan.num_slots));
  for (size_t i = 0; i < inputs.size(); ++i) slots[static_cast<size_t>(plan.argument_slots[i])] = inputs[i];
  for (size_t i = 0; i < constants_.size(); ++i) slots[static_cast<size_t>(plan.constant_slots[i])] = constants_[i];
  torch::jit::Stack stack;
  c10::SmallVector<at::Tensor, 4> results;      // each step's, reused
  const bool check = !results_checked_.load();  // the first call checks results against the graph
  for (const PlanStep& st : plan.steps) {
    stack = st.stack;
    for (const auto& ta : st.tensors) stack[ta.pos] = slots[static_cast<size_t>(ta.slot)];
    for (const auto& la : st.lists) {
      if (la.optional) {
        c10::List<std::optional<at::Tensor>> l;
        for (int s : la.slots)
          l.push_back(s < 0 ? std::optional<at::Tensor>() : std::optional<at::Tensor>(slots[static_cast<size_t>(s)]));
        stack[la.pos] = std::move(l);
      } else {
        c10::List<at::Tensor> l;
        for (int s : la.slots) l.push_back(slots[static_cast<size_t>(s)]);
        stack[la.pos] = std::move(l);
      }
    }
    // The in-place form only on a buffer this call allocated and nothing else holds: not another
    // tensor on its storage (but the dead base a view keeps), not the same tensor under another
    // name (an op that returned its input as it is: the slot and the stack hold it, nobody else),
    // and not memory an op mapped or wrapped from elsewhere (a file, a blob): its storage must
    // come from the device's allocator.
    const OpInfo* info = st.info;
    if (st.functional && functional) {
      info = st.functional;
    } else if (st.functional) {
      const at::Tensor& self = stack[0].toTensor();
      if (self.storage().use_count() != sole_owners(self) || self.use_count() > 2 ||
          self.storage().allocator() != device_allocator(self.device()))
        info = st.functional;
    }
    auto where = [&] { return st.where(); };
    if (st.checked_indices) check_index_arguments(where, *st.checked_indices, stack);
    try {
      OneThread one_thread(st.one_thread);
      info->handle.callBoxed(stack);
    } catch (const std::exception& e) {
      throw Error(st.where() + ": " + one_line(e));
    }
    node_results(where, stack, st.return_counts, results);
    if (st.zero_results)
      for (const at::Tensor& r : results) zero_storage(r);
    for (size_t k = 0; k < results.size(); ++k) slots[static_cast<size_t>(st.out_slots[k])] = std::move(results[k]);
    if (check)
      for (size_t k = 0; k < st.outs.size(); ++k)
        check_result(where, st.outs[k], slots[static_cast<size_t>(st.out_slots[k])]);
    for (int s : st.release) slots[static_cast<size_t>(s)] = at::Tensor();
  }
  std::vector<at::Tensor> outs;
  outs.reserve(plan.output_slots.size());
  // Results that share a constant's storage (the constant, a view of it, or an op that returned
  // it as it is) are copies: a caller writing into a result must not change later calls.
  auto aliases_a_constant = [&](const at::Tensor& t) {
    const c10::StorageImpl* s = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    for (const at::Tensor& c : constants_)
      if (s && c.defined() && c.storage().unsafeGetStorageImpl() == s) return true;
    return false;
  };
  for (size_t i = 0; i < plan.output_slots.size(); ++i) {
    const at::Tensor& t = slots[static_cast<size_t>(plan.output_slots[i])];
    if (!plan.copied_outputs[i] && !aliases_a_constant(t)) {
      outs.push_back(t);
      continue;
    }
    // The runtime's own copy, which a Python dispatch mode does not see: it would get a Python
    // number LibTorch wrapped in a tensor (a constant such as the 1000 of `t * 1000`) as an int.
    c10::impl::ExcludeDispatchKeyGuard no_python_modes(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    outs.push_back(t.clone());
  }
  results_checked_ = true;
  return outs;
}

bool Executable::records_autograd(const std::vector<at::Tensor>& inputs) const {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : inputs)
    if (t.requires_grad()) return true;
  for (const at::Tensor& c : constants_)
    if (c.defined() && c.requires_grad()) return true;
  return false;
}

std::vector<at::Tensor> Executable::run(const std::vector<at::Tensor>& inputs) {
  // A graph states its casts: autocast around the call would cast its operands again.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  std::vector<at::Tensor> in = checked(inputs);
  // Under autograd recording every node runs as the graph names it: an in-place reuse of a
  // buffer would overwrite a value autograd saved for the backward.
  if (records_autograd(in)) return run_eager(in, true);
  // Under a Python dispatch mode (FlopCounterMode) the mode sees the kernels the graph names:
  // no in-place forms it may not know (baddbmm_), no CUDA-graph replay (which dispatches nothing).
  if (options_.functional_under_dispatch_mode && c10::impl::dispatch_mode_enabled()) return run_eager(in, true);
  if (!cuda_device_) return run_eager(in);
  for (const at::Tensor& t : in)  // a graph declared on "cuda" accepts any GPU; its capture is on one
    if (t.device() != *cuda_device_) return run_eager(in);
  std::lock_guard<std::mutex> lock(mu_);
  return cuda_->run(in, plan_->arguments, *cuda_device_, options_.static_outputs,
                    [this](const std::vector<at::Tensor>& x) { return run_eager(x); });
}

const std::vector<const Input*>& Executable::arguments() const { return plan_->arguments; }

bool Executable::replaying_cuda_graph() const { return cuda_ && cuda_->captured(); }

std::vector<at::Tensor> Executable::input_buffers() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cuda_device_ && cuda_->captured()) return cuda_->static_inputs();
  throw Error("input_buffers(): no CUDA graph has been captured (call run() once on a CUDA device first)");
}

std::vector<at::Tensor> execute_node(const Node& n, const std::vector<at::Tensor>& operands) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // as Executable::run
  const OpInfo& info = op_info(n.op());
  torch::jit::Stack stack;
  stack.reserve(n.args().size());
  for (const Arg& a : n.args())
    stack.push_back(arg_to_ivalue(a, [&](int o) { return operands.at(static_cast<size_t>(o)); }));
  // The node as errors name it, made only for an error (fold runs a node per residual).
  auto where = [&] { return "node " + describe(&n); };
  const OpContract* contract = op_contract(n.op());
  if (contract && !contract->indices.empty()) check_index_arguments(where, n, stack);
  try {
    OneThread one_thread(runs_on_one_thread(n));
    info.handle.callBoxed(stack);
  } catch (const std::exception& e) {
    throw Error(where() + ": " + one_line(e));
  }
  c10::SmallVector<at::Tensor, 4> results;
  node_results(where, stack, n.return_counts(), results);
  std::vector<at::Tensor> out(std::make_move_iterator(results.begin()), std::make_move_iterator(results.end()));
  if (info.allocates_uninitialized)
    for (const at::Tensor& r : out) zero_storage(r);
  if (out.size() != n.outputs().size()) throw Error(where() + ": unexpected number of results");
  for (size_t i = 0; i < out.size(); ++i) check_result(where, n.output(i), out[i]);
  return out;
}

}  // namespace jvpc
