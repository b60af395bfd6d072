#include "compiler/trace/tracer.h"
#include "ir/op.h"

#include "ir/cost/kernel_watch.h"
#include "ir/builder.h"
#include "compiler/trace/functionalize.h"

#include "ir/ops.h"
#include "ir/verifier.h"

#include <ATen/autocast_mode.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <sstream>

namespace jvpc {
namespace {

// Python dispatch modes (FlopCounterMode) are off while the callable runs, so that composites
// decompose as they do without one (an active mode makes isTensorSubclassLike true, and SDPA's
// math path, for one, then takes another route), and on again around each recorded kernel, so
// that a mode sees, and counts, what runs. The keys the trace turned off, per thread.
const c10::DispatchKeySet kPythonModeKeys({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
thread_local c10::DispatchKeySet t_python_modes_off;

struct PythonModesOn {
  c10::DispatchKeySet keys = t_python_modes_off;
  PythonModesOn() {
    for (c10::DispatchKey k : keys) c10::impl::tls_set_dispatch_key_excluded(k, false);
  }
  ~PythonModesOn() {
    for (c10::DispatchKey k : keys) c10::impl::tls_set_dispatch_key_excluded(k, true);
  }
};

Error computes_outside_the_dispatcher(const std::string& op) {
  return Error(op +
               " computes its result outside the dispatcher, where jvpc's tracer cannot see it; jvpc cannot "
               "trace this op");
}

// Per-trace state, reached from the fallback through a thread-local pointer.
class Recorder {
 public:
  Recorder(Graph& g, const TraceOptions& options)
      : s_(g, options), fz_(s_), specialize_on_scalars_(options.specialize_on_scalars) {}

  Value* bind_input(const TraceInput& in) {
    if (std::any_of(in.name.begin(), in.name.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; }))
      throw Error("input name contains a control character (a saved graph could not be read back)");
    if (!in.value.defined()) throw Error("input '" + in.name + "' is an undefined tensor");
    if (in.value.layout() != c10::kStrided)
      throw Error("input '" + in.name + "' is a " + (std::ostringstream() << in.value.layout()).str() +
                  " tensor; jvpc traces strided tensors");
    if (s_.value_of.count(in.value.unsafeGetTensorImpl()))
      throw Error("input '" + in.name + "' is the same tensor as an earlier input");
    Value* v = s_.g.add_input(in.name, TensorMeta::of(in.value), Role::Primal,
                              !in.state && in.differentiable && differentiable_dtype(in.value.scalar_type()));
    bind(in.value, v);
    s_.input_names.insert(in.name);
    s_.from_inputs.insert(v);
    if (in.state)
      s_.state_storages.insert(storage_of(in.value));
    else
      s_.protected_storages.emplace(storage_of(in.value), in.name);
    return v;
  }

  /// The value a tensor argument stands for; tensors never seen are captured as constants.
  /// `reads_data`: whether the reader uses the tensor's contents (fill_ and empty_like do not).
  Value* value_for(const at::Tensor& t, const std::string& reader, bool reads_data = true) {
    auto it = s_.value_of.find(t.unsafeGetTensorImpl());
    if (it == s_.value_of.end()) {
      // A factory's result as Python and torch:: factories return it: LibTorch wraps the kernel's
      // result in a new TensorImpl on the same storage (make_variable's shallow copy, since the
      // tracer holds the original). It is that result.
      if (Value* made = factory_result(t)) {
        s_.bind(t, made);
        return value_for(t, reader, reads_data);
      }
      // Inside a backward that the callable runs (torch.autograd.grad, torch.func.grad), the
      // engine unpacks a saved result as a new TensorImpl on its storage: it is that value.
      if (Value* saved = saved_by_autograd(t)) {
        s_.bind(t, saved);
        return value_for(t, reader, reads_data);
      }
      // A tensor the dispatcher never returned that shares a traced value's storage (.data(),
      // variable_data(), a shallow copy): captured, it would replay these inputs' values.
      auto shared = s_.by_storage.find(storage_of(t));
      if (!specialize_on_scalars_ && shared != s_.by_storage.end())
        for (const TraceState::Bound& bound : shared->second)
          if (s_.from_inputs.count(bound.value))
            throw Error(reader +
                        " reads a tensor that aliases a value computed from the inputs but was made outside "
                        "the dispatcher (.data(), variable_data()); the graph would replay it as a constant");
      auto written = written_captured_.find(storage_of(t));
      if (written != written_captured_.end())
        throw Error(reader + " reads a tensor the callable captured after it was written in place by " +
                    written->second + ", which the graph does not record; pass that tensor as an input instead");
      return capture(t, t);
    }
    if (fz_.stale(it->second))
      return fz_.take_again(t, reader, [&](const at::Tensor& base) { return value_for(base, reader, false); });
    // An allocation without contents (empty) that is read: its data was written outside the
    // dispatcher (at::tensor({...}) copies its values in by pointer), so it is captured as it
    // is now. Replaying `empty` would read uninitialized memory.
    if (reads_data && s_.uninitialized.count(it->second)) {
      // Inside a decomposed op, such an allocation is the op's own result, computed by code the
      // tracer cannot see (max_pool1d's CPU path): its contents depend on the inputs.
      auto inside = s_.allocated_inside.find(it->second);
      if (inside != s_.allocated_inside.end()) throw computes_outside_the_dispatcher(inside->second);
      c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
      return capture(t, t.clone());
    }
    return it->second;
  }

  void record(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack) {
    kernels_.push_back(info.name);
    const auto& schema = info.schema();
    const size_t nargs = schema.arguments().size();
    if (stack->size() < nargs) throw Error(info.name + ": boxed stack is shorter than the schema");
    auto first = stack->end() - static_cast<std::ptrdiff_t>(nargs);
    // Fused attention kernels: ask for the logsumexp, which their JVP rule needs.
    for (size_t i = 0; i < nargs; ++i)
      if (schema.arguments()[i].name() == "compute_log_sumexp" && first[i].isBool()) first[i] = true;

    RecordedCall call = fz_.recorded_form(info, std::vector<c10::IValue>(first, stack->end()));
    if (call.captured_write) {
      written_captured_.emplace(storage_of(call.written), info.name + " (" + TensorMeta::of(call.written).str() + ")");
      run(op, info, call.args, stack);
      return;
    }
    std::vector<Value*> operands;
    std::vector<Arg> args = recorded_args(call, info.name, operands);
    fz_.keep_what_the_call_overwrites(call);
    run(op, info, call.args, stack);
    std::vector<int> counts;
    std::vector<at::Tensor> results = unpack_returns(*stack, stack->size() - schema.returns().size(), counts);
    if (call.stats_as_results)  // the running statistics, which the kernel just updated
      for (const at::Tensor& stats : call.running_stats) {
        results.push_back(stats);
        counts.push_back(1);
      }
    if (results.empty()) {  // metadata queries (no tensor results) are not part of the graph
      // ... but a scalar read from an input's data (item(), if (t), equal) would be replayed as
      // a constant: the graph would be right for these inputs only.
      if (!specialize_on_scalars_ && reads_scalar_data(info.name))
        for (const Value* v : operands)
          if (s_.from_inputs.count(v))
            throw Error(
                info.name +
                " reads a value computed from the inputs into a C++ scalar (item(), if (tensor), "
                "equal, allclose); the graph would replay it as a constant. Keep the computation in tensors, or "
                "trace with specialize_on_scalars (linearize does)");
      return;
    }
    std::vector<TensorMeta> metas;
    metas.reserve(results.size());
    for (const auto& t : results) metas.push_back(TensorMeta::of(t));
    bool impure = is_impure(*call.op, args);
    Node* n =
        s_.g.create(call.op->name, std::move(args), std::move(operands), std::move(metas), std::move(counts), impure);
    track(call, n, results);
    // Computed with forward AD turned off (forward_ad._set_fwd_grad_enabled(False)): a
    // constant of the map, as forward AD leaves it: its readers read it detached.
    if (!c10::AutogradState::get_tls_state().get_fw_grad_mode()) no_tangent(n, results);
  }

  void no_tangent(Node* n, const std::vector<at::Tensor>& results) {
    c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);  // shape inference runs kernels on Meta
    for (size_t i = 0; i < results.size(); ++i) {
      if (!differentiable_dtype(n->output(i)->meta().dtype)) continue;
      Value* d = Builder(s_.g).call(ops::detach, {n->output(i)});
      s_.derived(d, {n->output(i)});
      s_.bind(results[i], d);
    }
  }

  /// Runs the kernel below the tracer's key (Python modes on), and counts its matmul FLOPs.
  void run(const c10::OperatorHandle& op, const OpInfo& info, const std::vector<c10::IValue>& args,
           torch::jit::Stack* stack) {
    c10::impl::ExcludeDispatchKeyGuard guard(kTraceKey);
    PythonModesOn modes;
    auto call = [&]() -> const c10::IValue* {
      op.callBoxed(stack);
      const size_t nret = info.schema().returns().size();
      return nret && stack->size() >= nret ? &(*stack)[stack->size() - nret] : nullptr;
    };
    count_kernel_call(
        info, call, [&] { return args; }, matmul_flops_by_op_);
  }

  /// The recorded op's arguments, with each tensor resolved to its graph value (in `operands`).
  std::vector<Arg> recorded_args(const RecordedCall& c, const std::string& reader, std::vector<Value*>& operands) {
    std::vector<Arg> out;
    out.reserve(c.op->schema().arguments().size());
    operands.reserve(c.op->schema().arguments().size());
    for (size_t i = 0; i < c.op->schema().arguments().size(); ++i) {
      const auto& sarg = c.op->schema().arguments()[i];
      const c10::IValue& value = c.args[c.arg_index[i]];
      if (value.isComplexDouble())
        throw Error(reader + ": argument '" + sarg.name() +
                    "' is a complex number, which jvpc's graphs do not hold; "
                    "use a 0-dim complex tensor (at::scalar_tensor(c10::complex<double>(0, 1), at::kComplexDouble))");
      Arg a = arg_from_ivalue(sarg, value, [&](const at::Tensor& t) {
        // a view reads no data (it may be taken of an allocation its op is about to fill)
        operands.push_back(value_for(t, reader, !(i == 0 && (ignores_self_data(*c.op) || c.op->is_view))));
        return static_cast<int>(operands.size() - 1);
      });
      if (!kind_matches(a.kind, sarg))
        throw Error(reader + ": argument '" + sarg.name() + "' cannot be recorded as " + arg_kind_name(a.kind));
      out.push_back(std::move(a));
    }
    return out;
  }

  /// After the call: binds its results to node n's outputs, and updates what the tracer knows
  /// about them (computed from the inputs, uninitialized, taken from a base, stale).
  void track(const RecordedCall& c, Node* n, const std::vector<at::Tensor>& results) {
    // A factory of another tensor's shape (zeros_like, new_ones, fill) reads none of its values.
    const bool metadata_only = c.op->reads_only_metadata_of_self || c.op->fills_self_at_random;
    for (size_t i = metadata_only ? 1 : 0; i < n->inputs().size(); ++i)
      if (s_.from_inputs.count(n->input(i))) s_.from_inputs.insert(n->outputs().begin(), n->outputs().end());
    if (results.size() == 1 && (n->inputs().empty() || (metadata_only && n->inputs().size() == 1)))
      factories_[storage_of(results[0])] = {results[0].unsafeGetTensorImpl(), n->output(0)};
    if (c.op->allocates_uninitialized)
      for (Value* v : n->outputs()) {
        s_.uninitialized.insert(v);
        if (!decomposing_.empty()) s_.allocated_inside[v] = decomposing_.back();
      }
    if (c.op->is_view && !n->inputs().empty() && s_.uninitialized.count(n->input(0)))  // at::tensor({...}).view(...)
      for (Value* v : n->outputs()) {
        s_.uninitialized.insert(v);
        auto inside = s_.allocated_inside.find(n->input(0));
        if (inside != s_.allocated_inside.end()) s_.allocated_inside[v] = inside->second;
      }
    for (size_t i = 0; i < results.size(); ++i) {
      if (c.written.defined() && results[i].unsafeGetTensorImpl() == c.written.unsafeGetTensorImpl())
        fz_.mark_stale(c.written);  // all but the new value, bound here
      bind(results[i], n->output(i));
    }
    fz_.track_views(c, n, results);
  }

  /// Erases the allocations whose contents were captured instead (nothing reads them now).
  void drop_unread_allocations() {
    if (s_.uninitialized.empty()) return;
    std::vector<Node*> nodes = s_.g.nodes();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {  // views of them first
      Node* n = *it;
      if (s_.uninitialized.count(n->output(0)) &&
          std::none_of(n->outputs().begin(), n->outputs().end(),
                       [](const Value* v) { return v->has_uses(); })) {  // outputs are uses
        for (Value* v : n->outputs()) s_.values.erase(v->id());
        s_.g.erase(n);
      }
    }
  }

  /// Whether `t` is a value of the trace (an input or a recorded kernel's result).
  bool produced(const at::Tensor& t) const { return s_.value_of.count(t.unsafeGetTensorImpl()) > 0; }

  ValueOrigin origin(const at::Tensor& t) const {
    ValueOrigin o;
    std::vector<const Value*> todo;
    auto it = s_.value_of.find(t.unsafeGetTensorImpl());
    if (it != s_.value_of.end()) {
      todo.push_back(it->second);
    } else if (auto shared = s_.by_storage.find(storage_of(t)); shared != s_.by_storage.end()) {
      for (const TraceState::Bound& bound : shared->second) todo.push_back(bound.value);  // an alias of traced values
    } else {
      o.captured.push_back(t);  // not seen yet: a captured tensor, read as it is
      return o;
    }
    ska::flat_hash_set<const Value*> seen;
    while (!todo.empty()) {
      const Value* v = todo.back();
      todo.pop_back();
      if (!seen.insert(v).second) continue;
      if (s_.from_inputs.count(v)) return {true, {}};
      if (const Node* n = v->producer())
        todo.insert(todo.end(), n->inputs().begin(), n->inputs().end());
      else if (s_.g.input_of(v).role == Role::Constant)
        o.captured.push_back(s_.g.input_of(v).data);
    }
    return o;
  }

  /// The CompositeImplicitAutograd ops being decomposed, outermost first.
  std::vector<std::string> decomposing_;

  std::vector<std::string_view> kernels_;
  std::map<std::string, int64_t> matmul_flops_by_op_;
  TensorsById& values() { return s_.values; }
  /// The first error the tracer raised inside the callable: the trace fails with it, however the
  /// callable passed it on (Python turns it into a RuntimeError) or whether it caught it.
  std::string error_;

 private:
  static bool reads_scalar_data(const std::string& op) {
    return op == ops::_local_scalar_dense || op == ops::equal || op == ops::allclose;
  }

  // Ops whose first argument is used for its metadata only, or overwritten (whole or in part:
  // what the rest holds is the caller's, an empty's garbage in eager as in a replay;
  // _pad_circular fills an empty by slice_scatter), or filled at random (dropout's mask).
  static bool ignores_self_data(const OpInfo& op) {
    return op.reads_only_metadata_of_self || op.view_scatter || op.fills_self_at_random;
  }

  /// The factory result (track: a node with no operands but its self's metadata) that `t` is a
  /// shallow copy of: the same storage, offset, sizes, strides and dtype.
  Value* factory_result(const at::Tensor& t) const {
    auto f = factories_.find(storage_of(t));
    if (f == factories_.end()) return nullptr;
    return shallow_copy_of(f->second.first, t) ? f->second.second : nullptr;
  }

  /// While autograd's engine runs a backward: the traced value that `t` is a shallow copy of
  /// (the same storage, offset, sizes, strides and dtype), the latest bound; else null.
  Value* saved_by_autograd(const at::Tensor& t) const {
    if (torch::autograd::get_current_graph_task_id() == -1) return nullptr;
    auto bound = s_.by_storage.find(storage_of(t));
    if (bound == s_.by_storage.end()) return nullptr;
    for (auto it = bound->second.rbegin(); it != bound->second.rend(); ++it)
      if (shallow_copy_of(it->impl, t)) return it->value;
    return nullptr;
  }

  /// Whether `t` views `made`'s storage exactly as `made` does (offset, sizes, strides, dtype).
  static bool shallow_copy_of(const c10::TensorImpl* made, const at::Tensor& t) {
    return made->storage_offset() == t.storage_offset() && made->sizes() == t.sizes() &&
           made->strides() == t.strides() && made->dtype() == t.dtype();
  }

  Value* capture(const at::Tensor& t, const at::Tensor& value) { return s_.capture(t, value); }
  void bind(const at::Tensor& t, Value* v) { s_.bind(t, v); }
  static const void* storage_of(const at::Tensor& t) { return TraceState::storage_of(t); }

  TraceState s_;
  Functionalizer fz_;
  bool specialize_on_scalars_;
  std::unordered_map<const void*, std::string> written_captured_;  // storage -> the unrecorded write
  // storage -> the factory result that made it (kept alive by TraceState::keep), and its value
  ska::flat_hash_map<const void*, std::pair<const c10::TensorImpl*, Value*>> factories_;
};

thread_local Recorder* t_recorder = nullptr;

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().defined()) return {v.toTensor()};
  if (v.isTensorList()) return v.toTensorVector();
  return {};
}

/// Whether `v` is a defined tensor, or a list holding one, for which `pred` holds (tensors_of
/// without the copies, for the checks every traced call makes).
template <class Pred>
bool any_tensor(const c10::IValue& v, Pred pred) {
  if (v.isTensor()) return v.toTensor().defined() && pred(v.toTensor());
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList().vec())
      if (t.defined() && pred(t)) return true;
  return false;
}

// Whether autocast, active for this call, changes the op (casts its operands): it has a kernel of
// its own at an active autocast key, which sits below the tracer's. That kernel casts the operands
// with calls that come back to the tracer and calls the op again with autocast off, which comes
// back too: passed below the tracer's key, the op records as it runs under autocast.
bool autocast_changes(const c10::OperatorHandle& op, c10::DispatchKeySet ks) {
  const c10::DispatchKeySet active = ks & c10::autocast_dispatch_keyset;
  if (active.empty()) return false;
  for (c10::DispatchKey k : active)
    if (op.hasKernelForDispatchKey(k)) return true;
  return false;
}

// Contexts whose dispatch keys sit below the tracer's, so that what it records is not what runs:
// torch.func's transforms (vmap, grad, jvp) and tensor subclasses with __torch_dispatch__
// (FakeTensor under torch.compile) wrap the tensors the kernels see.
void check_context(const OpInfo& info, c10::DispatchKeySet ks, const torch::jit::Stack& stack) {
  if (ks.has_any(c10::functorch_transforms_ks) || ks.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode))
    throw Error(info.name + " runs inside a torch.func transform (vmap, grad, jvp, ...), which jvpc's tracer cannot " +
                "record; apply the transform outside the traced function");
  size_t nargs = std::min(info.schema().arguments().size(), stack.size());
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(nargs); it != stack.end(); ++it)
    if (any_tensor(*it, [](const at::Tensor& t) { return t.key_set().has(c10::DispatchKey::Python); }))
      throw Error(info.name + " reads a tensor subclass with __torch_dispatch__ (a FakeTensor of torch.compile, " +
                  "...), which jvpc's tracer cannot record; trace plain tensors");
}

void traced_call(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

void trace_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  try {
    traced_call(op, ks, stack);
  } catch (const Error& e) {
    if (t_recorder && t_recorder->error_.empty()) t_recorder->error_ = e.what();
    throw;
  }
}

void traced_call(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const OpInfo& info = op_info(op);
  if (!t_recorder) {
    op.redispatchBoxed(ks.remove(kTraceKey), stack);
    return;
  }
  check_context(info, ks, *stack);
  if (info.name == ops::max_pool1d) {
    // Its CPU decomposition computes outside the dispatcher; the same op with indices does not
    // (it decomposes to max_pool2d_with_indices), and its values are the same.
    static const c10::OperatorHandle with_indices = op_info(ops::max_pool1d_with_indices).handle;
    with_indices.callBoxed(stack);
    stack->pop_back();  // the indices
    return;
  }
  if (info.name.rfind("profiler::", 0) == 0 || info.name.rfind("c10d::", 0) == 0) {
    // torch.autograd.profiler.record_function's markers, and collectives (DistributedDataParallel's
    // forward opens a profiler region and broadcasts the module's buffers from rank 0): they pass
    // objects no graph holds, and run as eager code runs them, once, while tracing. A buffer a
    // collective writes is read as it is then; a program does not broadcast it again.
    c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
    op.redispatchBoxed(ks.remove(kTraceKey), stack);
    return;
  }
  if (info.name == ops::_shape_as_tensor) {
    // Its value depends on metadata alone (it copies the sizes in by pointer): run untraced, its
    // result is captured as a constant where it is read.
    c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
    op.redispatchBoxed(ks.remove(kTraceKey), stack);
    return;
  }
  // Decomposes into kernels, or into autocast's casts and the op itself, which are recorded.
  if (info.composite_implicit || autocast_changes(op, ks)) {
    c10::SmallVector<const c10::TensorImpl*, 8> arguments;
    size_t nargs = info.schema().arguments().size();
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(std::min(nargs, stack->size())); it != stack->end(); ++it)
      any_tensor(*it, [&](const at::Tensor& t) {
        arguments.push_back(t.unsafeGetTensorImpl());
        return false;
      });
    t_recorder->decomposing_.push_back(info.name);
    struct Pop {
      ~Pop() {
        if (t_recorder) t_recorder->decomposing_.pop_back();
      }
    } pop;
    op.redispatchBoxed(ks.remove(kTraceKey), stack);
    size_t nret = info.schema().returns().size();
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(std::min(nret, stack->size())); it != stack->end(); ++it)
      for (const at::Tensor& t : tensors_of(*it))
        if (std::find(arguments.begin(), arguments.end(), t.unsafeGetTensorImpl()) == arguments.end() &&
            !t_recorder->produced(t))
          throw computes_outside_the_dispatcher(info.name);
    return;
  }
  t_recorder->record(op, info, stack);
}

void register_fallback() {
  static std::once_flag once;
  static std::unique_ptr<torch::Library> lib;
  std::call_once(once, [] {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kTraceKey))
      throw Error("the dispatch key TESTING_ONLY_GenericMode already has a fallback; jvpc's tracer needs it");
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kTraceKey, __FILE__, __LINE__);
    lib->fallback(torch::CppFunction::makeFromBoxedFunction<&trace_fallback>());
  });
}

}  // namespace

bool tracing() { return t_recorder != nullptr; }

std::optional<ValueOrigin> traced_value_origin(const at::Tensor& t) {
  if (!t_recorder || !t.defined()) return std::nullopt;
  return t_recorder->origin(t);
}

Trace trace(const TensorFn& fn, const std::vector<TraceInput>& inputs, const TraceOptions& options) {
  register_fallback();
  if (t_recorder) throw Error("trace() called while tracing (nested traces are not supported)");
  Trace result;
  result.graph = std::make_unique<Graph>();
  Recorder rec(*result.graph, options);
  std::vector<at::Tensor> args;
  for (const TraceInput& in : inputs) {
    rec.bind_input(in);
    args.push_back(in.value);
  }
  struct Reset {
    ~Reset() { t_recorder = nullptr; }
  } reset;
  t_recorder = &rec;
  {
    c10::impl::IncludeDispatchKeyGuard on(kTraceKey);
    // Autocast's cast of a weight, cached from an earlier call, would reach the trace as a tensor
    // it never saw made: every cast is made, and recorded, while tracing.
    struct NoAutocastCache {
      bool saved = at::autocast::is_autocast_cache_enabled();
      NoAutocastCache() { at::autocast::set_autocast_cache_enabled(false); }
      ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(saved); }
    } no_autocast_cache;
    c10::DispatchKeySet modes_off = kPythonModeKeys - c10::impl::tls_local_dispatch_key_set().excluded_;
    c10::impl::ExcludeDispatchKeyGuard python_modes_off(modes_off);
    struct Modes {
      c10::DispatchKeySet saved = t_python_modes_off;
      ~Modes() { t_python_modes_off = saved; }
    } restore_modes;
    t_python_modes_off = modes_off;
    try {
      result.outputs = fn(args);
    } catch (const std::exception& e) {
      if (!rec.error_.empty()) throw Error(rec.error_);
      if (dynamic_cast<const Error*>(&e)) throw;
      throw Error("the traced callable failed: " + one_line(e));  // LibTorch's errors carry a stack of lines
    }
  }
  t_recorder = nullptr;
  if (!rec.error_.empty()) throw Error(rec.error_);  // the callable caught it
  for (size_t i = 0; i < result.outputs.size(); ++i) {
    if (!result.outputs[i].defined())
      throw Error("output " + std::to_string(i) + " of the traced callable is undefined");
    result.graph->add_output(rec.value_for(result.outputs[i], "output " + std::to_string(i)));
  }
  // The state the callable wrote: its final value, after the outputs.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].state) continue;
    Value* now = rec.value_for(inputs[i].value, "state '" + inputs[i].name + "'");
    if (now == result.graph->inputs()[i].value) continue;
    result.graph->add_output(now, inputs[i].name);
    result.state_of.push_back(i);
  }
  rec.drop_unread_allocations();
  result.values = std::move(rec.values());
  result.kernels = std::move(rec.kernels_);
  result.matmul_flops_by_op = std::move(rec.matmul_flops_by_op_);
  verify(*result.graph, {true, false});
  return result;
}

}  // namespace jvpc
