// The tracer's functionalization: how the functional IR records what eager code does in place.
// In-place ops are recorded by their functional forms (add_ -> add); a view is linked to the
// base it was taken from, so that a write into the view reaches its base (base' =
// slice_scatter(base, view', ...), as functionalization does) and the other views of the
// written storage become stale, to be taken again from their base's new value when read.
// Internal to compiler/trace: the recorder (tracer.cpp) asks it before and after each call.
#pragma once

#include "ir/ops.h"
#include "compiler/trace/trace_state.h"

#include <c10/util/SmallVector.h>

#include <functional>

namespace jvpc {

/// What the recorder makes of one boxed call: the op it records (in-place ops by their
/// functional form, _reshape_alias as view, training batch norm without its running statistics)
/// and that op's arguments, arg_index[i] being the boxed argument of its argument i.
struct RecordedCall {
  const OpInfo* op;
  std::vector<c10::IValue> args;
  c10::SmallVector<size_t, 8> arg_index;
  std::vector<at::Tensor> running_stats;  // batch norm's, which it updates in place, unrecorded
  /// Batch norm's running statistics are state inputs (TraceInput::state): the call is recorded
  /// as _native_batch_norm_legit_functional, whose last two results are their new values (the
  /// tensors themselves, which the kernel updated), appended to the kernel's results.
  bool stats_as_results = false;
  at::Tensor written;           // the tensor an in-place op writes
  at::Tensor restrided;         // the tensor an in-place view op (t_, unsqueeze_) restrides
  bool captured_write = false;  // `written` is a captured tensor: run, not recorded
};

class Functionalizer {
 public:
  explicit Functionalizer(TraceState& state) : s_(state) {}

  /// The recorded form of a boxed call of `info` with `args`. Throws for writes jvpc cannot
  /// record (to inputs, to lists, to a tensor's storage, out= variants).
  RecordedCall recorded_form(const OpInfo& info, std::vector<c10::IValue> args) const;

  /// Whether `v`'s storage was written (through another view, or its base) after `v` was made.
  bool stale(const Value* v) const { return stale_.count(v) > 0; }

  /// A stale view `t`, taken again from its base's current value (`base_value` resolves the
  /// base), when jvpc knows how it was taken; otherwise an error naming `reader`.
  Value* take_again(const at::Tensor& t, const std::string& reader,
                    const std::function<Value*(const at::Tensor&)>& base_value);

  /// Before the call (and after the operands were resolved: one may have been taken again from
  /// its base just now), the values living in the storage it writes are kept as they are.
  void keep_what_the_call_overwrites(const RecordedCall& c);

  /// Every value living in `t`'s storage, which was just written, is out of date.
  void mark_stale(const at::Tensor& t);

  /// After the call, its results bound to node n's outputs: records how views were taken from
  /// their bases, and writes an in-place op's result through to the bases of what it wrote.
  void track_views(const RecordedCall& c, Node* n, const std::vector<at::Tensor>& results);

 private:
  struct ViewLink {  // how a view tensor was taken from its base
    at::Tensor base;
    const Node* view = nullptr;  // the recorded view (a node lives as long as the trace runs), or
    std::string op;              // for a part of split or unbind, the slice or select that takes it
    std::vector<Arg> args;
    const std::string& op_name() const { return view ? view->op() : op; }
    const std::vector<Arg>& arguments() const { return view ? view->args() : args; }
  };

  void link_parts(const RecordedCall& c, const std::vector<at::Tensor>& results);
  void keep_metadata_before_restride(const at::Tensor& t);
  void write_through(const at::Tensor& view);
  void keep_values_before_write(const at::Tensor& written);

  TraceState& s_;
  std::unordered_set<const Value*> stale_;
  std::unordered_map<const c10::TensorImpl*, ViewLink> view_links_;
  std::unordered_set<const Value*> copied_;  // values copied before an in-place write
};

}  // namespace jvpc
