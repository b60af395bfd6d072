// The list of ops graph files may use, and the load-time checks that go with it.
#include "ir/loadable_ops.h"
#include "ir/op.h"

#include "ir/op_contracts.h"
#include "ir/ops.h"
#include "ir/verifier.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

namespace {

const std::unordered_set<std::string>& loadable_set() {
  static const std::unordered_set<std::string> s(loadable_ops().begin(), loadable_ops().end());
  return s;
}

// The schema position of the argument named `name`, or -1.
int arg_index(const c10::FunctionSchema& s, const char* name) {
  auto i = s.argumentIndexWithName(name);
  return i ? static_cast<int>(*i) : -1;
}

}  // namespace

const std::vector<std::string>& loadable_ops() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> v = {
#include "ir/loadable_ops.inc"
    };
    std::sort(v.begin(), v.end());
    return v;
  }();
  return ops;
}

bool is_loadable_op(const std::string& op) { return loadable_set().count(op) > 0 && op_contract(op) != nullptr; }

std::string not_loadable(const std::string& op) {
  std::string why = loadable_set().count(op) ? " has no safety contract (ir/op_contracts.cpp), so graph files "
                                               "may not use it"
                                             : " is not on the list of ops graph files may use (jvpc rules --loadable)";
  return op + why + "; a file you made yourself can be saved and loaded as trusted (--trusted)";
}

void check_loadable_ops(const Graph& g, const std::string& what) {
  for (const Node* n : g.nodes())
    if (!is_loadable_op(n->op())) throw Error(what + ": " + describe(n) + ": " + not_loadable(n->op()));
}

std::string hidden_write(const Node& n) {
  // Batch norms in training mode (instance norm with use_input_stats) update the running
  // statistics they are given in place, though their schemas (native_batch_norm, batch_norm,
  // instance_norm, _batch_norm_impl_index, cudnn_batch_norm, ...) do not mark them as written.
  // The functional form returns their new values and writes nothing it is given.
  if (n.is(ops::_native_batch_norm_legit_functional)) return "";
  const auto& s = op_info(n.op()).schema();
  int flag = arg_index(s, "training");
  if (flag < 0) flag = arg_index(s, "use_input_stats");
  if (flag < 0 || n.arg(static_cast<size_t>(flag)).kind != ArgKind::Bool ||
      !n.arg(static_cast<size_t>(flag)).value.toBool())
    return "";
  for (const char* stat : {"running_mean", "running_var"}) {
    int i = arg_index(s, stat);
    if (i >= 0 && n.arg(static_cast<size_t>(i)).kind == ArgKind::Tensor)
      return n.op() + " in training mode writes its running statistics (" + stat +
             "), which its schema does not mark as written; a graph may use it in training mode only without running "
             "statistics";
  }
  return "";
}

// --- uninitialized allocations ----------------------------------------------------------------

namespace {

// Which elements of a value's storage are known to be initialized: all (absent from the map), or
// a boolean mask laid out as the value is, over a storage as large as the value's. A mask is
// kept only for values small enough to simulate.
constexpr int64_t kMaxMaskElements = int64_t{1} << 24;

at::Tensor call_on(const Node& n, const std::vector<at::Tensor>& operands) {
  const OpInfo& info = op_info(n.op());
  torch::jit::Stack stack;
  for (const Arg& a : n.args())
    stack.push_back(arg_to_ivalue(a, [&](int o) { return operands.at(static_cast<size_t>(o)); }));
  info.handle.callBoxed(stack);
  return stack.at(0).toTensor();
}

}  // namespace

void check_initialized(const Graph& g) {
  // Values whose storage is not wholly initialized: a mask of it, laid out as they are
  // (undefined: too large to track, so any read is refused). A value's own elements may all be
  // initialized while the gaps between them are not: copy and the scatters into views clone
  // self's whole storage, gaps included, where a later as_strided can reach them.
  std::unordered_map<const Value*, at::Tensor> mask;
  auto refuse = [](const Node* n, const std::string& why) {
    throw Error(describe(n) + ": " + why + " (its bytes would be whatever the heap held; use aten::zeros)");
  };
  for (const Node* n : g.nodes()) {
    const std::string& op = n->op();
    if (allocates_uninitialized(op)) {
      const TensorMeta& m = n->output()->meta();
      int64_t span = kMaxMaskElements + 1;  // a span past size_t (found by the fuzzer): too large to track
      try {
        span = m.numel() ? static_cast<int64_t>(at::detail::computeStorageNbytes(m.sizes, m.strides, 1)) : 0;
      } catch (const c10::Error&) {}
      mask[n->output()] =
          span > kMaxMaskElements ? at::Tensor() : at::zeros({span}, at::kBool).as_strided(m.sizes, m.strides);
      continue;
    }
    // Operand 0 may be partly uninitialized where the op takes only its metadata, views it, or
    // scatters into it, and where no other argument passes it again.
    bool meta_only = reads_only_metadata_of_self(op), view = op_info(op).is_view, scatter = is_view_scatter(op);
    size_t self_refs = 0;
    for (const Arg& a : n->args())
      for (int o : a.operands) self_refs += o == 0;
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const Value* v = n->input(i);
      auto it = mask.find(v);
      if (it == mask.end()) continue;
      bool as_self = i == 0 && self_refs == 1 && n->arg(0).kind == ArgKind::Tensor && (meta_only || view || scatter);
      // Other ops read the value's elements only.
      if (!as_self && (!it->second.defined() || !it->second.all().item<bool>()))
        refuse(n, "reads an uninitialized allocation (%" + std::to_string(v->id()) + ", from " + v->producer()->op() +
                      " or a view of it)");
    }
    // copy clones self's storage (gaps included) and writes its elements: simulated like a scatter.
    bool clones_self = op == ops::copy;
    if (n->inputs().empty() || !mask.count(n->input(0)) || (meta_only && !clones_self)) continue;
    const at::Tensor& m = mask.at(n->input(0));
    if (!m.defined() || n->outputs().size() != 1) {
      if (scatter || clones_self) refuse(n, "writes part of an uninitialized allocation too large to track");
      for (const Value* o : n->outputs()) mask[o] = at::Tensor();
      continue;
    }
    // A view of the mask, or the scatter applied to it with a source that is all initialized.
    std::vector<at::Tensor> operands = {m};
    for (size_t i = 1; i < n->inputs().size(); ++i) operands.push_back(at::ones(n->input(i)->meta().sizes, at::kBool));
    at::Tensor out;
    try {
      out = call_on(*n, operands);
    } catch (const std::exception& e) {
      refuse(n, "reads an uninitialized allocation (" + one_line(e) + ")");
    }
    if (view) {  // the storage is that of self, known not to be wholly initialized
      mask[n->output()] = out;
      continue;
    }
    // A fresh storage (copy, the scatters): wholly initialized, or masked as it is.
    int64_t storage = static_cast<int64_t>(out.storage().nbytes());  // bool: one byte per element
    if (!out.as_strided({storage}, {1}, 0).all().item<bool>()) mask[n->output()] = out;
  }
  for (const Value* o : g.outputs())
    if (mask.count(o))
      throw Error("graph output %" + std::to_string(o->id()) + " is (part of) an uninitialized allocation (from " +
                  o->producer()->op() + "; use aten::zeros)");
}

// --- index constants --------------------------------------------------------------------------

namespace {

// The value of `v` if it is a stored constant or a view of one (views replayed on the data),
// else an undefined tensor.
at::Tensor stored_value(const Graph& g, const Value* v) {
  if (g.is_input(v)) {
    const Input& in = g.input_of(v);
    return in.role == Role::Constant ? in.data : at::Tensor();
  }
  const Node* p = v->producer();
  if (!op_info(p->op()).is_view || p->inputs().empty() || p->outputs().size() != 1) return {};
  std::vector<at::Tensor> operands;
  for (const Value* x : p->inputs()) {
    operands.push_back(stored_value(g, x));
    if (!operands.back().defined()) return {};
  }
  return call_on(*p, operands);
}

}  // namespace

void check_index_constants(const Graph& g) {
  for (const Node* n : g.nodes()) {
    const OpContract* c = op_contract(n->op());
    if (!c || c->indices.empty()) continue;
    // The node's arguments with the stored values where there are some, Meta tensors of the
    // declared shapes elsewhere (the contract reads only the shapes of what it indexes).
    bool stored = false;
    std::vector<at::Tensor> operands;
    for (const Value* v : n->inputs()) {
      at::Tensor t = stored_value(g, v);
      stored |= t.defined();
      operands.push_back(t.defined() ? t : on_meta(v->meta()));
    }
    if (!stored) continue;
    torch::jit::Stack stack;
    for (const Arg& a : n->args())
      stack.push_back(arg_to_ivalue(a, [&](int o) { return operands.at(static_cast<size_t>(o)); }));
    check_index_arguments([&] { return describe(n); }, *n, stack);
  }
}

}  // namespace jvpc
