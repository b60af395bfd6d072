// The tracer's functionalization: in-place ops by their functional forms, view links, writes
// through to bases, staleness (functionalize.h).
#include "compiler/trace/functionalize.h"
#include "ir/op.h"

#include "ir/builder.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

namespace jvpc {
namespace {

bool updates_running_stats(const std::string& op) {
  return op == ops::native_batch_norm || op == ops::cudnn_batch_norm || op == ops::miopen_batch_norm;
}

// Views that jvpc can take again from a base, and write back into it.
bool invertible_view(const OpInfo& op) {
  static const std::unordered_set<const OpInfo*> ops = [] {
    std::unordered_set<const OpInfo*> s;
    for (Op name : {ops::slice_Tensor, ops::select_int, ops::diagonal, ops::alias, ops::transpose_int, ops::t,
                    ops::permute, ops::unsqueeze, ops::squeeze_dim, ops::view})
      s.insert(&op_info(name));
    return s;
  }();
  return ops.count(&op) > 0;
}

// aten::add_.Tensor -> aten::add.Tensor, with the same arguments.
const OpInfo& functional_form(const OpInfo& info) {
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
      {ops::bernoulli__float, ops::bernoulli_p},  {ops::transpose_, ops::transpose_int},
      {ops::pow__Scalar, ops::pow_Tensor_Scalar},  // pow.Scalar is (Scalar self, Tensor exponent)
      {ops::pow__Tensor, ops::pow_Tensor_Tensor}, {ops::normal_, ops::normal_functional},
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

}  // namespace

RecordedCall Functionalizer::recorded_form(const OpInfo& info, std::vector<c10::IValue> args) const {
  RecordedCall c{&info, std::move(args), {}, {}, false, {}, {}, false};
  for (size_t i = 0; i < c.args.size(); ++i) c.arg_index.push_back(i);
  if (info.mutates) {
    if (!c.args.at(0).isTensor())
      throw Error(info.name + " writes in place to a list of tensors; jvpc records in-place ops on one tensor");
    if (info.name.rfind(ops::resize_, 0) == 0 || info.name.rfind(ops::set_, 0) == 0)
      throw Error(info.name + " changes a tensor's storage; jvpc cannot record it (make a new tensor instead)");
    c.op = &functional_form(info);
    if (c.op->is_view) {
      c.restrided = c.args[0].toTensor();
    } else {
      c.written = c.args[0].toTensor();
      auto written = s_.protected_storages.find(TraceState::storage_of(c.written));
      if (written != s_.protected_storages.end() && !written->second.empty())
        throw Error(info.name + " writes in place to the input '" + written->second + "' (" +
                    TensorMeta::of(c.written).str() +
                    "); only values computed while tracing may be written (a module's buffer, such as BatchNorm's "
                    "num_batches_tracked in training mode, is an input of a compiled program: use linearize, or the "
                    "module in eval mode)");
      if (written != s_.protected_storages.end())
        throw Error(info.name + " writes in place to a captured tensor the traced code read before (" +
                    TensorMeta::of(c.written).str() + "); only values computed while tracing may be written");
      // A tensor the callable captured and has not read (a module's counter, such as BatchNorm's
      // num_batches_tracked += 1): written as eager code would, once, and not recorded, like
      // batch norm's running statistics. Reading it afterwards is an error (value_for).
      if (!s_.value_of.count(c.written.unsafeGetTensorImpl())) c.captured_write = true;
    }
  } else if (info.name == ops::_reshape_alias || info.name == ops::_unsafe_view) {
    c.op = &op_info(ops::view);
    c.arg_index = {0, 1};
  } else if (updates_running_stats(info.name) && c.args.at(5).isBool() && c.args[5].toBool() && c.args[3].isTensor() &&
             c.args[3].toTensor().defined() && s_.state_storages.count(TraceState::storage_of(c.args[3].toTensor()))) {
    // Running statistics that are state: their update is recorded, by the functional form of
    // the same kernel (it clones them, then updates the clones in place: the same arithmetic).
    if (info.name != ops::native_batch_norm)
      throw Error(info.name +
                  " updates the running statistics of a module whose buffers are a compiled program's "
                  "state, which jvpc records for aten::native_batch_norm only: compile on the CPU, or use linearize");
    c.op = &op_info(ops::_native_batch_norm_legit_functional);
    c.running_stats = {c.args[3].toTensor(), c.args[4].toTensor()};
    c.stats_as_results = true;
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

Value* Functionalizer::take_again(const at::Tensor& t, const std::string& reader,
                                  const std::function<Value*(const at::Tensor&)>& base_value) {
  // A view whose storage was written through another view (or its base): taken again from
  // its base's current value, when jvpc knows how it was taken.
  auto link = view_links_.find(t.unsafeGetTensorImpl());
  if (link == view_links_.end())
    throw Error(reader +
                " reads a tensor whose storage an earlier in-place op wrote through another view; "
                "jvpc's functional IR cannot express this");
  Value* base = base_value(link->second.base);
  c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);  // shape inference runs kernels on Meta
  const std::vector<Arg>& link_args = link->second.arguments();
  std::vector<BArg> args = {base};
  for (size_t i = 1; i < link_args.size(); ++i) args.push_back(BArg::of_arg(link_args[i], nullptr));
  Value* v = Builder(s_.g).call(link->second.op_name(), std::move(args));
  s_.derived(v, {base});
  s_.bind(t, v);
  return v;
}

void Functionalizer::keep_what_the_call_overwrites(const RecordedCall& c) {
  if (c.written.defined()) keep_values_before_write(c.written);
  if (c.restrided.defined()) keep_metadata_before_restride(c.restrided);  // (a constant captured just now, too)
  for (const at::Tensor& stats : c.running_stats)
    if (s_.value_of.count(stats.unsafeGetTensorImpl())) {
      keep_values_before_write(stats);
      mark_stale(stats);
    }
}

void Functionalizer::mark_stale(const at::Tensor& t) {
  for (const TraceState::Bound& alias : s_.by_storage[TraceState::storage_of(t)]) stale_.insert(alias.value);
}

void Functionalizer::track_views(const RecordedCall& c, Node* n, const std::vector<at::Tensor>& results) {
  if (c.restrided.defined()) {
    // New metadata, the same data: nothing is stale. How the tensor was taken from a base, and
    // how views were taken from it, no longer describe it; they are forgotten (a view read
    // after a later write is then an error, never taken again wrongly).
    const c10::TensorImpl* impl = c.restrided.unsafeGetTensorImpl();
    view_links_.erase(impl);
    for (Input& in : s_.g.inputs())  // the op moved the version counter of the constants it shares
      if (in.data.defined() && in.data.is_alias_of(c.restrided)) in.bind(in.data);
    for (auto it = view_links_.begin(); it != view_links_.end();)
      it = it->second.base.unsafeGetTensorImpl() == impl ? view_links_.erase(it) : std::next(it);
  } else if (!c.written.defined() && results.size() == 1 && invertible_view(*c.op) && c.args.at(0).isTensor()) {
    view_links_[results[0].unsafeGetTensorImpl()] = ViewLink{c.args[0].toTensor(), n, {}, {}};
  } else if (!c.written.defined()) {
    link_parts(c, results);  // split, unbind (one part too: unbind of a batch of 1, chunk(1))
  }
  if (c.written.defined()) write_through(c.written);
}

/// The results of split, unsafe_split, split_with_sizes and unbind, linked to their base as
/// slices (selects), so that an in-place write into one reaches the base and the others are
/// taken again from it (ATen's LSTM and GRU cells: gates.unsafe_chunk(4, 1), then
/// chunk[0].sigmoid_()).
void Functionalizer::link_parts(const RecordedCall& c, const std::vector<at::Tensor>& results) {
  const std::string& op = c.op->name;
  bool unbind = op == ops::unbind_int;
  if (!unbind && op != ops::split_Tensor && op != ops::unsafe_split_Tensor && op != ops::split_with_sizes &&
      op != ops::unsafe_split_with_sizes)
    return;
  const at::Tensor& base = c.args.at(0).toTensor();
  int64_t dim = c10::maybe_wrap_dim(c.args.at(unbind ? 1 : 2).toInt(), base.dim());
  int64_t start = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const c10::TensorImpl* part = results[i].unsafeGetTensorImpl();
    if (unbind) {
      view_links_[part] = ViewLink{
          base, nullptr, ops::select_int, {Arg::tensor(0), Arg::of_int(dim), Arg::of_int(static_cast<int64_t>(i))}};
    } else {
      int64_t end = start + results[i].size(dim);
      view_links_[part] =
          ViewLink{base,
                   nullptr,
                   ops::slice_Tensor,
                   {Arg::tensor(0), Arg::of_int(dim), Arg::of_int(start), Arg::of_int(end), Arg::of_int(1)}};
      start = end;
    }
  }
}

/// Before an in-place view op (t_, unsqueeze_) gives `t` new metadata: the values kept for
/// folding, and captured constants, that are this very tensor keep the metadata they had.
void Functionalizer::keep_metadata_before_restride(const at::Tensor& t) {
  c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
  for (auto& [id, kept] : s_.values)
    if (kept.is_same(t)) kept = t.alias();
  for (Input& in : s_.g.inputs())
    if (in.data.defined() && in.data.is_same(t)) in.data = t.alias();  // same version counter
}

/// After an in-place op wrote `view`, its base (and the base's base...) takes the written
/// values: base' = slice_scatter(base, view', ...) and the like, as functionalization does.
void Functionalizer::write_through(const at::Tensor& view) {
  auto link = view_links_.find(view.unsafeGetTensorImpl());
  if (link == view_links_.end()) return;
  const ViewLink& l = link->second;
  const std::string& op = l.op_name();
  const std::vector<Arg>& link_args = l.arguments();
  Value* base = s_.value_of.at(l.base.unsafeGetTensorImpl());  // its value before the write
  Value* src = s_.value_of.at(view.unsafeGetTensorImpl());
  const Value* written = src;
  c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);  // shape inference runs kernels on Meta
  // A base still holding what at::tensor({...}) copied in by pointer: captured (its written
  // part is replaced below). Inside a decomposed op, an allocation being filled stays.
  if (s_.uninitialized.count(base) && !s_.allocated_inside.count(base)) base = s_.capture(l.base, l.base.clone());
  Builder b(s_.g);
  auto arg = [&](size_t i) { return BArg::of_arg(link_args.at(i), nullptr); };
  const auto& base_sizes = base->meta().sizes;
  Value* updated = nullptr;
  if (op == ops::slice_Tensor) {
    updated = b.call(ops::slice_scatter, {base, src, arg(1), arg(2), arg(3), arg(4)});
  } else if (op == ops::select_int) {
    updated = b.call(ops::select_scatter, {base, src, arg(1), arg(2)});
  } else if (op == ops::diagonal) {
    updated = b.call(ops::diagonal_scatter, {base, src, arg(1), arg(2), arg(3)});
  } else if (op == ops::alias) {
    updated = src;
  } else if (op == ops::transpose_int || op == ops::t) {
    std::vector<BArg> args = {src};
    for (size_t i = 1; i < link_args.size(); ++i) args.push_back(arg(i));
    updated = b.call(op, std::move(args));
  } else if (op == ops::permute) {
    std::vector<int64_t> perm = link_args.at(1).value.toIntVector(), inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i)
      inverse[static_cast<size_t>(c10::maybe_wrap_dim(perm[i], static_cast<int64_t>(perm.size())))] =
          static_cast<int64_t>(i);
    updated = b.call(ops::permute, {src, inverse});
  } else if (op == ops::unsqueeze) {
    updated = b.call(ops::squeeze_dim, {src, arg(1)});
  } else {  // view, squeeze.dim: back to the base's shape
    if (!src->meta().is_contiguous()) src = b.call(ops::clone, {src, c10::MemoryFormat::Contiguous});
    updated = b.call(ops::view, {src, base_sizes});
  }
  s_.derived(updated, {base, written});
  stale_.erase(updated);
  s_.bind(l.base, updated);
  write_through(l.base);
}

/// The values kept for folding are the tensors themselves: before an in-place op writes a
/// storage, the values that live in it are copied, so that folding sees them as they were.
void Functionalizer::keep_values_before_write(const at::Tensor& written) {
  if (!s_.keep_values) return;
  c10::impl::ExcludeDispatchKeyGuard untraced(kTraceKey);
  for (const TraceState::Bound& bound : s_.by_storage[TraceState::storage_of(written)]) {
    Value* v = bound.value;
    auto it = s_.values.find(v->id());
    if (it != s_.values.end() && !copied_.count(v)) {
      it->second = it->second.clone();
      copied_.insert(v);
    }
  }
}

}  // namespace jvpc
