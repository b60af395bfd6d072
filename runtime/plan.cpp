// The Executable's plan: slots, steps, in-place forms and releases, from a Graph and its liveness.
#include "runtime/plan.h"
#include "ir/op.h"

#include "ir/loadable_ops.h"
#include "ir/op_contracts.h"
#include "ir/ops.h"
#include "ir/verifier.h"

#include <ATen/Parallel.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <unordered_set>

namespace jvpc {

namespace {

// Ops whose in-place form (op_) the runtime may call when their first operand dies at the node:
// the result then reuses that operand's buffer instead of allocating (baddbmm would otherwise
// copy its `self` into a fresh output first).
bool has_safe_inplace_form(const std::string& op) {
  static const std::unordered_set<std::string> ops = {
      ops::baddbmm,    ops::addmm,      ops::add_Tensor, ops::sub_Tensor, ops::mul_Tensor, ops::div_Tensor,
      ops::mul_Scalar, ops::div_Scalar, ops::add_Scalar, ops::sub_Scalar, ops::addcmul,    ops::exp};
  return ops.count(op) > 0;
}

// The in-place form of `n`, if its first operand can be overwritten: an intermediate (or a view
// of one) read for the last time here, whose storage nothing else reads here or later (every
// value living in it dies here: no graph output, no other operand of n), laid out as the result.
// (A batched tangent graph accumulates q·dkᵀ into dq·kᵀ's result viewed with K in its columns.)
const OpInfo* inplace_form(const Graph& g, const Node* n, const Liveness& live, int position,
                           const ska::flat_hash_map<const Value*, int>& storage_last_use) {
  if (!has_safe_inplace_form(n->op()) || n->inputs().empty() || n->outputs().size() != 1) return nullptr;
  if (n->arg(0).kind != ArgKind::Tensor || n->arg(0).operands[0] != 0) return nullptr;
  const Value* self = n->input(0);
  const Value* out = n->output();
  const Value* root = live.storage_root(self);
  if (g.is_input(root) || storage_last_use.at(root) != position) return nullptr;
  if (live.last_use(self) != position) return nullptr;
  for (size_t i = 1; i < n->inputs().size(); ++i)
    if (live.storage_root(n->input(i)) == root) return nullptr;
  if (self->meta().sizes != out->meta().sizes || self->meta().strides != out->meta().strides ||
      self->meta().dtype != out->meta().dtype)
    return nullptr;
  auto [name, overload] = split_op_name(n->op());
  try {
    return &op_info(name + "_" + (overload.empty() ? "" : "." + overload));
  } catch (const Error&) {
    return nullptr;
  }
}

}  // namespace

bool runs_on_one_thread(const Node& n) {
  auto below = [](const Value* v) { return v->meta().numel() < at::internal::GRAIN_SIZE; };
  return std::all_of(n.inputs().begin(), n.inputs().end(), below) &&
         std::all_of(n.outputs().begin(), n.outputs().end(), below);
}

Plan make_plan(const Graph& g, const Liveness& live, bool reuse_buffers) {
  Plan p;
  ska::flat_hash_map<const Value*, int> slot;  // open addressing: no allocation per value
  auto slot_of = [&](const Value* v) {
    auto [it, added] = slot.emplace(v, p.num_slots);
    if (added) ++p.num_slots;
    return it->second;
  };
  for (const Input& in : g.inputs()) {
    int s = slot_of(in.value);
    if (in.role == Role::Constant) {
      p.constants.push_back(&in);
      p.constant_slots.push_back(s);
    } else {
      p.arguments.push_back(&in);
      p.argument_slots.push_back(s);
    }
  }
  ska::flat_hash_map<const Value*, int> storage_last_use;  // storage root -> the last read of any value in it
  auto nodes = g.nodes();
  p.steps.reserve(nodes.size());
  auto note_last_use = [&](const Value* v) {
    auto [it, added] = storage_last_use.emplace(live.storage_root(v), live.last_use(v));
    if (!added) it->second = std::max(it->second, live.last_use(v));
  };
  for (const Input& in : g.inputs()) note_last_use(in.value);
  for (const Node* n : nodes)
    for (const Value* o : n->outputs()) note_last_use(o);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i];
    p.impure |= n->impure();
    std::string written = hidden_write(*n);  // it would write a constant or an input
    if (!written.empty()) throw Error("node " + describe(n) + ": " + written);
    PlanStep st;
    const OpInfo* inplace = reuse_buffers ? inplace_form(g, n, live, static_cast<int>(i), storage_last_use) : nullptr;
    st.info = inplace ? inplace : &op_info(n->op());
    if (inplace) st.functional = &op_info(n->op());
    st.node = n;
    st.return_counts.assign(n->return_counts().begin(), n->return_counts().end());
    if (const OpContract* c = op_contract(n->op())) {
      if (!c->indices.empty()) st.checked_indices = n;
      p.storage_relative |= c->storage_relative;
    }
    p.checks_indices |= st.checked_indices != nullptr;
    st.zero_results = allocates_uninitialized(n->op());
    for (size_t a = 0; a < n->args().size(); ++a) {
      const Arg& arg = n->arg(a);
      if (arg.kind == ArgKind::Tensor) {
        st.tensors.push_back({a, slot_of(n->input(static_cast<size_t>(arg.operands[0])))});
        st.stack.emplace_back();
      } else if (arg.kind == ArgKind::TensorList || arg.kind == ArgKind::OptTensorList) {
        PlanStep::ListArg l{a, {}, arg.kind == ArgKind::OptTensorList};
        for (int o : arg.operands) l.slots.push_back(o < 0 ? -1 : slot_of(n->input(static_cast<size_t>(o))));
        st.lists.push_back(std::move(l));
        st.stack.emplace_back();
      } else {
        st.stack.push_back(arg.value);
      }
    }
    for (const Value* o : n->outputs()) st.out_slots.push_back(slot_of(o));
    st.one_thread = runs_on_one_thread(*n);
    st.outs.assign(n->outputs().begin(), n->outputs().end());
    // Release what dies here: operands read for the last time, and outputs nobody reads.
    auto dies = [&](const Value* v) { return !g.is_input(v) && live.last_use(v) <= static_cast<int>(i); };
    for (const Value* v : n->inputs())
      if (dies(v) && std::find(st.release.begin(), st.release.end(), slot.at(v)) == st.release.end())
        st.release.push_back(slot.at(v));
    for (const Value* o : n->outputs())
      if (dies(o)) st.release.push_back(slot.at(o));
    p.steps.push_back(std::move(st));
  }
  for (const Value* o : g.outputs()) p.output_slots.push_back(slot_of(o));
  std::unordered_set<const Value*> returned;
  for (const Value* o : g.outputs()) p.copied_outputs.push_back(!returned.insert(o).second);
  return p;
}

std::string PlanStep::where() const { return "node " + describe(node); }

}  // namespace jvpc
