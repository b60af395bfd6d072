#include "compiler/trace/tracer.h"

#include "compiler/ir/builder.h"

#include "compiler/ir/ops.h"
#include "compiler/ir/verifier.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_set>

namespace jvpc {
namespace {

constexpr c10::DispatchKey kTraceKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

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
      : g_(g), keep_values_(options.keep_values), specialize_on_scalars_(options.specialize_on_scalars) {}

  Value* bind_input(const TraceInput& in) {
    if (std::any_of(in.name.begin(), in.name.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; }))
      throw Error("input name contains a control character (a saved graph could not be read back)");
    if (!in.value.defined()) throw Error("input '" + in.name + "' is an undefined tensor");
    if (in.value.layout() != c10::kStrided)
      throw Error("input '" + in.name + "' is a " + (std::ostringstream() << in.value.layout()).str() +
                  " tensor; jvpc traces strided tensors");
    if (value_of_.count(in.value.unsafeGetTensorImpl()))
      throw Error("input '" + in.name + "' is the same tensor as an earlier input");
    Value* v = g_.add_input(in.name, TensorMeta::of(in.value), Role::Primal,
                            in.differentiable && differentiable_dtype(in.value.scalar_type()));
    bind(in.value, v);
    from_inputs_.insert(v);
    protected_storages_.insert(storage_of(in.value));
    return v;
  }

  /// The value a tensor argument stands for; tensors never seen are captured as constants.
  /// `reads_data`: whether the reader uses the tensor's contents (fill_ and empty_like do not).
  Value* value_for(const at::Tensor& t, const std::string& reader, bool reads_data = true) {
    auto it = value_of_.find(t.unsafeGetTensorImpl());
    if (it == value_of_.end()) {
      // A tensor the dispatcher never returned that shares a traced value's storage (.data(),
      // variable_data(), a shallow copy): captured, it would replay these inputs' values.
      auto shared = by_storage_.find(storage_of(t));
      if (!specialize_on_scalars_ && shared != by_storage_.end())
        for (const Value* v : shared->second)
          if (from_inputs_.count(v))
            throw Error(reader +
                        " reads a tensor that aliases a value computed from the inputs but was made outside "
                        "the dispatcher (.data(), variable_data()); the graph would replay it as a constant");
      auto written = written_captured_.find(storage_of(t));
      if (written != written_captured_.end())
        throw Error(reader + " reads a tensor the callable captured after it was written in place by " +
                    written->second + ", which the graph does not record; pass that tensor as an input instead");
      return capture(t, t);
    }
    if (stale_.count(it->second)) {
      // A view whose storage was written through another view (or its base): taken again from
      // its base's current value, when jvpc knows how it was taken.
      auto link = view_links_.find(t.unsafeGetTensorImpl());
      if (link == view_links_.end())
        throw Error(reader +
                    " reads a tensor whose storage an earlier in-place op wrote through another view; "
                    "jvpc's functional IR cannot express this");
      Value* base = value_for(link->second.base, reader, false);
      c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);  // shape inference runs kernels on Meta
      std::vector<BArg> args = {base};
      for (size_t i = 1; i < link->second.args.size(); ++i) args.push_back(BArg::of_arg(link->second.args[i], nullptr));
      Value* v = Builder(g_).call(link->second.op, std::move(args));
      derived(v, {base});
      bind(t, v);
      return v;
    }
    // An allocation without contents (empty) that is read: its data was written outside the
    // dispatcher (at::tensor({...}) copies its values in by pointer), so it is captured as it
    // is now. Replaying `empty` would read uninitialized memory.
    if (reads_data && uninitialized_.count(it->second)) {
      // Inside a decomposed op, such an allocation is the op's own result, computed by code the
      // tracer cannot see (max_pool1d's CPU path): its contents depend on the inputs.
      auto inside = allocated_inside_.find(it->second);
      if (inside != allocated_inside_.end()) throw computes_outside_the_dispatcher(inside->second);
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

    Call call = recorded_form(info, std::vector<c10::IValue>(first, stack->end()));
    if (call.captured_write) {
      written_captured_.emplace(storage_of(call.written), info.name + " (" + TensorMeta::of(call.written).str() + ")");
      c10::impl::ExcludeDispatchKeyGuard guard(kTraceKey);
      PythonModesOn modes;
      op.callBoxed(stack);
      return;
    }
    std::vector<Value*> operands;
    std::vector<Arg> args = recorded_args(call, info.name, operands);
    keep_what_the_call_overwrites(call);
    {
      c10::impl::ExcludeDispatchKeyGuard guard(kTraceKey);
      PythonModesOn modes;
      op.callBoxed(stack);
    }
    std::vector<int> counts;
    std::vector<at::Tensor> results = unpack_returns(*stack, stack->size() - schema.returns().size(), counts);
    if (results.empty()) {  // metadata queries (no tensor results) are not part of the graph
      // ... but a scalar read from an input's data (item(), if (t), equal) would be replayed as
      // a constant: the graph would be right for these inputs only.
      if (!specialize_on_scalars_ && reads_scalar_data(info.name))
        for (const Value* v : operands)
          if (from_inputs_.count(v))
            throw Error(
                info.name +
                " reads a value computed from the inputs into a C++ scalar (item(), if (tensor), "
                "equal, allclose); the graph would replay it as a constant. Keep the computation in tensors, or "
                "trace with specialize_on_scalars (linearize does)");
      return;
    }
    std::vector<TensorMeta> metas;
    for (const auto& t : results) metas.push_back(TensorMeta::of(t));
    bool impure = is_impure(*call.op, args);
    Node* n =
        g_.create(call.op->name, std::move(args), std::move(operands), std::move(metas), std::move(counts), impure);
    track(call, n, results);
  }

  /// What record() makes of one boxed call: the op it records (in-place ops by their functional
  /// form, _reshape_alias as view, training batch norm without its running statistics) and
  /// that op's arguments, arg_index[i] being the boxed argument of its argument i.
  struct Call {
    const OpInfo* op;
    std::vector<c10::IValue> args;
    std::vector<size_t> arg_index;
    std::vector<at::Tensor> running_stats;  // batch norm's, which it updates in place, unrecorded
    at::Tensor written;                     // the tensor an in-place op writes
    at::Tensor restrided;                   // the tensor an in-place view op (t_, unsqueeze_) restrides
    bool captured_write = false;            // `written` is a captured tensor: run, not recorded
  };

  Call recorded_form(const OpInfo& info, std::vector<c10::IValue> args) {
    Call c{&info, std::move(args), {}, {}, {}, {}, false};
    for (size_t i = 0; i < c.args.size(); ++i) c.arg_index.push_back(i);
    if (info.mutates) {
      if (!c.args.at(0).isTensor())
        throw Error(info.name + " writes in place to a list of tensors; jvpc records in-place ops on one tensor");
      if (info.name.rfind("aten::resize_", 0) == 0 || info.name.rfind("aten::set_", 0) == 0)
        throw Error(info.name + " changes a tensor's storage; jvpc cannot record it (make a new tensor instead)");
      c.op = &functional_form(info);
      if (c.op->is_view) {
        c.restrided = c.args[0].toTensor();
      } else {
        c.written = c.args[0].toTensor();
        if (protected_storages_.count(storage_of(c.written)))
          throw Error(info.name +
                      " writes in place to an input, or to a captured tensor the traced code read before (" +
                      TensorMeta::of(c.written).str() + "); only values computed while tracing may be written");
        // A tensor the callable captured and has not read (a module's counter, such as BatchNorm's
        // num_batches_tracked += 1): written as eager code would, once, and not recorded, like
        // batch norm's running statistics. Reading it afterwards is an error (value_for).
        if (!value_of_.count(c.written.unsafeGetTensorImpl())) c.captured_write = true;
      }
    } else if (info.name == "aten::_reshape_alias" || info.name == "aten::_unsafe_view") {
      c.op = &op_info("aten::view");
      c.arg_index = {0, 1};
    } else if (updates_running_stats(info.name) && c.args.at(5).isBool() && c.args[5].toBool()) {
      // Batch norm in training mode updates its running statistics in place, which its schema
      // does not declare; its results do not depend on them. The tracing run updates them once,
      // as eager execution would, and the graph records the op without them: replaying it
      // changes nobody's tensors. Traced values in them are kept as they were, and reading them
      // afterwards is an error (the graph cannot say what they became).
      for (size_t i : {size_t{3}, size_t{4}})
        if (c.args[i].isTensor() && c.args[i].toTensor().defined()) c.running_stats.push_back(c.args[i].toTensor());
      c.args[3] = c10::IValue();
      c.args[4] = c10::IValue();
    }
    return c;
  }

  /// The recorded op's arguments, with each tensor resolved to its graph value (in `operands`).
  std::vector<Arg> recorded_args(const Call& c, const std::string& reader, std::vector<Value*>& operands) {
    std::vector<Arg> out;
    for (size_t i = 0; i < c.op->schema().arguments().size(); ++i) {
      const auto& sarg = c.op->schema().arguments()[i];
      const c10::IValue& value = c.args[c.arg_index[i]];
      if (value.isComplexDouble())
        throw Error(reader + ": argument '" + sarg.name() +
                    "' is a complex number, which jvpc's graphs do not hold; "
                    "use a 0-dim complex tensor (at::scalar_tensor(c10::complex<double>(0, 1), at::kComplexDouble))");
      Arg a = arg_from_ivalue(sarg, value, [&](const at::Tensor& t) {
        // a view reads no data (it may be taken of an allocation its op is about to fill)
        operands.push_back(value_for(t, reader, !(i == 0 && (ignores_self_data(c.op->name) || c.op->is_view))));
        return static_cast<int>(operands.size() - 1);
      });
      if (!kind_matches(a.kind, sarg))
        throw Error(reader + ": argument '" + sarg.name() + "' cannot be recorded as " + arg_kind_name(a.kind));
      out.push_back(std::move(a));
    }
    return out;
  }

  /// Before the call (and after the operands were resolved: one may have been taken again from
  /// its base just now), the values living in the storage it writes are kept as they are.
  void keep_what_the_call_overwrites(const Call& c) {
    if (c.written.defined()) keep_values_before_write(c.written);
    if (c.restrided.defined()) keep_metadata_before_restride(c.restrided);  // (a constant captured just now, too)
    for (const at::Tensor& stats : c.running_stats)
      if (value_of_.count(stats.unsafeGetTensorImpl())) {
        keep_values_before_write(stats);
        mark_stale(stats);
      }
  }

  /// After the call: binds its results to node n's outputs, and updates what the tracer knows
  /// about them (computed from the inputs, uninitialized, taken from a base, stale).
  void track(const Call& c, Node* n, const std::vector<at::Tensor>& results) {
    for (const Value* o : n->inputs())
      if (from_inputs_.count(o)) from_inputs_.insert(n->outputs().begin(), n->outputs().end());
    if (allocates_uninitialized(c.op->name))
      for (Value* v : n->outputs()) {
        uninitialized_.insert(v);
        if (!decomposing_.empty()) allocated_inside_[v] = decomposing_.back();
      }
    if (c.op->is_view && !n->inputs().empty() && uninitialized_.count(n->input(0)))  // at::tensor({...}).view(...)
      for (Value* v : n->outputs()) {
        uninitialized_.insert(v);
        auto inside = allocated_inside_.find(n->input(0));
        if (inside != allocated_inside_.end()) allocated_inside_[v] = inside->second;
      }
    for (size_t i = 0; i < results.size(); ++i) {
      if (c.written.defined() && results[i].unsafeGetTensorImpl() == c.written.unsafeGetTensorImpl())
        mark_stale(c.written);  // all but the new value, bound here
      bind(results[i], n->output(i));
    }
    if (c.restrided.defined()) {
      // New metadata, the same data: nothing is stale. How the tensor was taken from a base, and
      // how views were taken from it, no longer describe it; they are forgotten (a view read
      // after a later write is then an error, never taken again wrongly).
      const c10::TensorImpl* impl = c.restrided.unsafeGetTensorImpl();
      view_links_.erase(impl);
      for (Input& in : g_.inputs())  // the op moved the version counter of the constants it shares
        if (in.data.defined() && in.data.is_alias_of(c.restrided)) in.bind(in.data);
      for (auto it = view_links_.begin(); it != view_links_.end();)
        it = it->second.base.unsafeGetTensorImpl() == impl ? view_links_.erase(it) : std::next(it);
    } else if (!c.written.defined() && results.size() == 1 && invertible_view(c.op->name) && c.args.at(0).isTensor()) {
      view_links_[results[0].unsafeGetTensorImpl()] = ViewLink{c.args[0].toTensor(), c.op->name, n->args()};
    } else if (!c.written.defined()) {
      link_parts(c, results);  // split, unbind (one part too: unbind of a batch of 1, chunk(1))
    }
    if (c.written.defined()) write_through(c.written);
  }

  /// Before an in-place view op (t_, unsqueeze_) gives `t` new metadata: the values kept for
  /// folding, and captured constants, that are this very tensor keep the metadata they had.
  void keep_metadata_before_restride(const at::Tensor& t) {
    c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
    for (auto& [id, kept] : values_)
      if (kept.is_same(t)) kept = t.alias();
    for (Input& in : g_.inputs())
      if (in.data.defined() && in.data.is_same(t)) in.data = t.alias();  // same version counter
  }

  /// Every value living in `t`'s storage, which was just written, is out of date.
  void mark_stale(const at::Tensor& t) {
    for (Value* alias : by_storage_[storage_of(t)]) stale_.insert(alias);
  }

  /// After an in-place op wrote `view`, its base (and the base's base...) takes the written
  /// values: base' = slice_scatter(base, view', ...) and the like, as functionalization does.
  void write_through(const at::Tensor& view) {
    auto link = view_links_.find(view.unsafeGetTensorImpl());
    if (link == view_links_.end()) return;
    const ViewLink& l = link->second;
    Value* base = value_of_.at(l.base.unsafeGetTensorImpl());  // its value before the write
    Value* src = value_of_.at(view.unsafeGetTensorImpl());
    const Value* written = src;
    c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);  // shape inference runs kernels on Meta
    // A base still holding what at::tensor({...}) copied in by pointer: captured (its written
    // part is replaced below). Inside a decomposed op, an allocation being filled stays.
    if (uninitialized_.count(base) && !allocated_inside_.count(base)) base = capture(l.base, l.base.clone());
    Builder b(g_);
    auto arg = [&](size_t i) { return BArg::of_arg(l.args.at(i), nullptr); };
    const auto& base_sizes = base->meta().sizes;
    Value* updated = nullptr;
    if (l.op == "aten::slice.Tensor") {
      updated = b.call("aten::slice_scatter", {base, src, arg(1), arg(2), arg(3), arg(4)});
    } else if (l.op == "aten::select.int") {
      updated = b.call("aten::select_scatter", {base, src, arg(1), arg(2)});
    } else if (l.op == "aten::diagonal") {
      updated = b.call("aten::diagonal_scatter", {base, src, arg(1), arg(2), arg(3)});
    } else if (l.op == "aten::alias") {
      updated = src;
    } else if (l.op == "aten::transpose.int" || l.op == "aten::t") {
      std::vector<BArg> args = {src};
      for (size_t i = 1; i < l.args.size(); ++i) args.push_back(arg(i));
      updated = b.call(l.op, std::move(args));
    } else if (l.op == "aten::permute") {
      std::vector<int64_t> perm = l.args.at(1).value.toIntVector(), inverse(perm.size());
      for (size_t i = 0; i < perm.size(); ++i)
        inverse[static_cast<size_t>(c10::maybe_wrap_dim(perm[i], static_cast<int64_t>(perm.size())))] =
            static_cast<int64_t>(i);
      updated = b.call("aten::permute", {src, inverse});
    } else if (l.op == "aten::unsqueeze") {
      updated = b.call("aten::squeeze.dim", {src, arg(1)});
    } else {  // view, squeeze.dim: back to the base's shape
      if (!src->meta().is_contiguous()) src = b.call("aten::clone", {src, c10::MemoryFormat::Contiguous});
      updated = b.call("aten::view", {src, base_sizes});
    }
    derived(updated, {base, written});
    stale_.erase(updated);
    bind(l.base, updated);
    write_through(l.base);
  }

  /// The values kept for folding are the tensors themselves: before an in-place op writes a
  /// storage, the values that live in it are copied, so that folding sees them as they were.
  void keep_values_before_write(const at::Tensor& written) {
    if (!keep_values_) return;
    c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
    for (Value* v : by_storage_[storage_of(written)]) {
      auto it = values_.find(v->id());
      if (it != values_.end() && !copied_.count(v)) {
        it->second = it->second.clone();
        copied_.insert(v);
      }
    }
  }

  /// Erases the allocations whose contents were captured instead (nothing reads them now).
  void drop_unread_allocations() {
    std::unordered_set<const Value*> outputs(g_.outputs().begin(), g_.outputs().end());
    std::vector<Node*> nodes = g_.nodes();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {  // views of them first
      Node* n = *it;
      if (uninitialized_.count(n->output(0)) &&
          std::none_of(n->outputs().begin(), n->outputs().end(),
                       [&](const Value* v) { return v->has_uses() || outputs.count(v); })) {
        for (Value* v : n->outputs()) values_.erase(v->id());
        g_.erase(n);
      }
    }
  }

  /// Whether `t` is a value of the trace (an input or a recorded kernel's result).
  bool produced(const at::Tensor& t) const { return value_of_.count(t.unsafeGetTensorImpl()) > 0; }

  /// The CompositeImplicitAutograd ops being decomposed, outermost first.
  std::vector<std::string> decomposing_;

  std::vector<std::string> kernels_;
  std::unordered_map<int, at::Tensor> values_;
  /// The first error the tracer raised inside the callable: the trace fails with it, however the
  /// callable passed it on (Python turns it into a RuntimeError) or whether it caught it.
  std::string error_;

 private:
  static const void* storage_of(const at::Tensor& t) {
    return t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl())
                           : static_cast<const void*>(t.unsafeGetTensorImpl());
  }

  // A tensor the trace has not produced (or whose recorded producer left it uninitialized)
  // becomes a constant holding `value`; `t` stands for it from now on.
  Value* capture(const at::Tensor& t, const at::Tensor& value) {
    std::string name;  // c0, c1, ...: fresh, whatever the inputs are called (an LSTM's c0)
    do name = "c" + std::to_string(constants_++);
    while (g_.find_input(name));
    Value* c = g_.add_constant(name, value);
    bind(t, c);
    if (value.is_same(t)) protected_storages_.insert(storage_of(t));  // a copy may be written on
    return c;
  }

  /// The results of split, unsafe_split, split_with_sizes and unbind, linked to their base as
  /// slices (selects), so that an in-place write into one reaches the base and the others are
  /// taken again from it (ATen's LSTM and GRU cells: gates.unsafe_chunk(4, 1), then
  /// chunk[0].sigmoid_(): found by a probe).
  void link_parts(const Call& c, const std::vector<at::Tensor>& results) {
    const std::string& op = c.op->name;
    bool unbind = op == "aten::unbind.int";
    if (!unbind && op != "aten::split.Tensor" && op != "aten::unsafe_split.Tensor" && op != "aten::split_with_sizes" &&
        op != "aten::unsafe_split_with_sizes")
      return;
    const at::Tensor& base = c.args.at(0).toTensor();
    int64_t dim = c10::maybe_wrap_dim(c.args.at(unbind ? 1 : 2).toInt(), base.dim());
    int64_t start = 0;
    for (size_t i = 0; i < results.size(); ++i) {
      const c10::TensorImpl* part = results[i].unsafeGetTensorImpl();
      if (unbind) {
        view_links_[part] = ViewLink{
            base, "aten::select.int", {Arg::tensor(0), Arg::of_int(dim), Arg::of_int(static_cast<int64_t>(i))}};
      } else {
        int64_t end = start + results[i].size(dim);
        view_links_[part] =
            ViewLink{base,
                     "aten::slice.Tensor",
                     {Arg::tensor(0), Arg::of_int(dim), Arg::of_int(start), Arg::of_int(end), Arg::of_int(1)}};
        start = end;
      }
    }
  }

  // Views that jvpc can take again from a base, and write back into it.
  static bool invertible_view(const std::string& op) {
    static const std::unordered_set<std::string> ops = {
        "aten::slice.Tensor", "aten::select.int", "aten::diagonal",    "aten::alias", "aten::transpose.int", "aten::t",
        "aten::permute",      "aten::unsqueeze",  "aten::squeeze.dim", "aten::view"};
    return ops.count(op) > 0;
  }

  /// Bookkeeping for a value the tracer built itself (not a recorded kernel's result).
  void derived(Value* v, std::initializer_list<const Value*> from) {
    for (const Value* f : from)
      if (from_inputs_.count(f)) from_inputs_.insert(v);
  }

  static bool updates_running_stats(const std::string& op) {
    return op == "aten::native_batch_norm" || op == "aten::cudnn_batch_norm" || op == "aten::miopen_batch_norm";
  }

  static bool reads_scalar_data(const std::string& op) {
    return op == "aten::_local_scalar_dense" || op == "aten::equal" || op == "aten::allclose";
  }

  // Ops whose first argument is used for its metadata only, or overwritten (whole or in part:
  // what the rest holds is the caller's, an empty's garbage in eager as in a replay;
  // _pad_circular fills an empty by slice_scatter), or filled at random (bernoulli_, uniform_,
  // ...: dropout's mask, in their functional forms).
  static bool ignores_self_data(const std::string& op) {
    static const std::unordered_set<std::string> random_fills = {
        "aten::bernoulli.p", "aten::uniform",     "aten::normal.functional", "aten::random",     "aten::random.from",
        "aten::random.to",   "aten::exponential", "aten::geometric",         "aten::log_normal", "aten::cauchy"};
    return reads_only_metadata_of_self(op) || is_view_scatter(op) || random_fills.count(op) > 0;
  }

  void bind(const at::Tensor& t, Value* v) {
    value_of_[t.unsafeGetTensorImpl()] = v;
    by_storage_[storage_of(t)].push_back(v);
    keep_.push_back(t);
    if (keep_values_) values_[v->id()] = t;
  }

  // aten::add_.Tensor -> aten::add.Tensor, with the same arguments.
  static const OpInfo& functional_form(const OpInfo& info) {
    const auto& schema = info.schema();
    for (size_t i = 1; i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].alias_info() && schema.arguments()[i].alias_info()->isWrite())
        throw Error(info.name + " writes to its argument '" + schema.arguments()[i].name() +
                    "' (out= variants are not supported)");
    if (!schema.arguments().empty() &&
        !(schema.arguments()[0].alias_info() && schema.arguments()[0].alias_info()->isWrite()))
      throw Error(info.name + " mutates an argument in a way jvpc cannot record");
    // In-place ops whose functional form has another overload name.
    static const std::unordered_map<std::string, std::string> renamed = {
        {"aten::bernoulli_.float", "aten::bernoulli.p"},
        {"aten::transpose_", "aten::transpose.int"},
        {"aten::pow_.Scalar", "aten::pow.Tensor_Scalar"},  // pow.Scalar is (Scalar self, Tensor exponent)
        {"aten::pow_.Tensor", "aten::pow.Tensor_Tensor"},
    };
    auto [name, overload] = split_op_name(info.name);
    if (name.empty() || name.back() != '_') throw Error(info.name + " mutates its input and has no functional form");
    std::string functional = name.substr(0, name.size() - 1) + (overload.empty() ? "" : "." + overload);
    if (renamed.count(info.name)) functional = renamed.at(info.name);
    const OpInfo* f = nullptr;
    try {
      f = &op_info(functional);
    } catch (const Error&) {
      throw Error(info.name + " mutates its input and has no functional form " + functional);
    }
    const auto& fa = f->schema().arguments();
    if (fa.size() != schema.arguments().size())
      throw Error(info.name + ": functional form " + functional + " takes different arguments");
    for (size_t i = 0; i < fa.size(); ++i)
      if (fa[i].name() != schema.arguments()[i].name())
        throw Error(info.name + ": functional form " + functional + " takes different arguments");
    return *f;
  }

  Graph& g_;
  bool keep_values_;
  bool specialize_on_scalars_;
  std::unordered_map<const c10::TensorImpl*, Value*> value_of_;
  std::unordered_map<const void*, std::vector<Value*>> by_storage_;
  std::unordered_set<const Value*> stale_;
  std::unordered_map<const void*, std::string> written_captured_;  // storage -> the unrecorded write
  struct ViewLink {                                                // how a view tensor was taken from its base
    at::Tensor base;
    std::string op;
    std::vector<Arg> args;
  };
  std::unordered_map<const c10::TensorImpl*, ViewLink> view_links_;
  std::unordered_set<const Value*> from_inputs_;                    // values computed from the inputs
  std::unordered_set<const Value*> uninitialized_;                  // outputs of empty and its kin
  std::unordered_map<const Value*, std::string> allocated_inside_;  // ... allocated by a decomposed op
  std::unordered_set<const Value*> copied_;                         // values copied before an in-place write
  std::unordered_set<const void*> protected_storages_;
  std::vector<at::Tensor> keep_;  // keeps TensorImpl pointers unique for the whole trace
  int constants_ = 0;
};

thread_local Recorder* t_recorder = nullptr;

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().defined()) return {v.toTensor()};
  if (v.isTensorList()) return v.toTensorVector();
  return {};
}

// Contexts whose dispatch keys sit below the tracer's, so that what it records is not what runs:
// autocast casts a recorded op's operands after the tracer saw them; torch.func's transforms (vmap,
// grad, jvp) and tensor subclasses with __torch_dispatch__ (FakeTensor under torch.compile) wrap
// the tensors the kernels see.
void check_context(const OpInfo& info, c10::DispatchKeySet ks, const torch::jit::Stack& stack) {
  if (ks.has_any(c10::autocast_dispatch_keyset))
    throw Error(info.name + " runs under autocast, whose casts jvpc's tracer cannot record; call the function " +
                "without autocast (cast explicitly)");
  if (ks.has_any(c10::functorch_transforms_ks) || ks.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode))
    throw Error(info.name + " runs inside a torch.func transform (vmap, grad, jvp, ...), which jvpc's tracer cannot " +
                "record; apply the transform outside the traced function");
  size_t nargs = std::min(info.schema().arguments().size(), stack.size());
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(nargs); it != stack.end(); ++it)
    for (const at::Tensor& t : tensors_of(*it))
      if (t.key_set().has(c10::DispatchKey::Python))
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
  if (info.name == "aten::max_pool1d") {
    // Its CPU decomposition computes outside the dispatcher; the same op with indices does not
    // (it decomposes to max_pool2d_with_indices), and its values are the same.
    static const c10::OperatorHandle with_indices =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::max_pool1d_with_indices", "");
    with_indices.callBoxed(stack);
    stack->pop_back();  // the indices
    return;
  }
  if (info.name == "aten::_shape_as_tensor") {
    // Its value depends on metadata alone (it copies the sizes in by pointer): run untraced, its
    // result is captured as a constant where it is read.
    c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
    op.redispatchBoxed(ks.remove(kTraceKey), stack);
    return;
  }
  if (info.composite_implicit) {  // decomposes into kernels, which are recorded
    std::unordered_set<const c10::TensorImpl*> arguments;
    size_t nargs = info.schema().arguments().size();
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(std::min(nargs, stack->size())); it != stack->end(); ++it)
      for (const at::Tensor& t : tensors_of(*it)) arguments.insert(t.unsafeGetTensorImpl());
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
        if (!arguments.count(t.unsafeGetTensorImpl()) && !t_recorder->produced(t))
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
  rec.drop_unread_allocations();
  result.values = std::move(rec.values_);
  result.kernels = std::move(rec.kernels_);
  verify(*result.graph, {true, false});
  return result;
}

}  // namespace jvpc
