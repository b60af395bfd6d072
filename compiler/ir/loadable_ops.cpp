// The list of ops graph files may use, and the load-time checks that go with it.
#include "compiler/ir/loadable_ops.h"

#include "compiler/ir/ops.h"
#include "compiler/ir/verifier.h"

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
#include "compiler/ir/loadable_ops.inc"
    };
    std::sort(v.begin(), v.end());
    return v;
  }();
  return ops;
}

bool is_loadable_op(const std::string& op) { return loadable_set().count(op) > 0; }

std::string not_loadable(const std::string& op) {
  return op +
         " is not on the list of ops graph files may use (jvpc rules --loadable); a file you made yourself can be "
         "saved and loaded as trusted (--trusted)";
}

void check_loadable_ops(const Graph& g, const std::string& what) {
  for (const Node* n : g.nodes())
    if (!is_loadable_op(n->op())) throw Error(what + ": " + describe(n) + ": " + not_loadable(n->op()));
}

std::string hidden_write(const Node& n) {
  // Batch norms in training mode (instance norm with use_input_stats) update the running
  // statistics they are given in place, though their schemas (native_batch_norm, batch_norm,
  // instance_norm, _batch_norm_impl_index, cudnn_batch_norm, ...) do not mark them as written.
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

// Which elements of a value are known to be initialized: all (absent from the map), or a
// boolean mask of its shape. A mask is kept only for values small enough to simulate.
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
  // Values not wholly initialized: a mask of their initialized elements, laid out as they are
  // (undefined: too large to track, so any read is refused).
  std::unordered_map<const Value*, at::Tensor> mask;
  auto refuse = [](const Node* n, const std::string& why) {
    throw Error(describe(n) + ": " + why + " (its bytes would be whatever the heap held; use aten::zeros)");
  };
  for (const Node* n : g.nodes()) {
    const std::string& op = n->op();
    if (allocates_uninitialized(op)) {
      const TensorMeta& m = n->output()->meta();
      int64_t span = m.numel() ? static_cast<int64_t>(at::detail::computeStorageNbytes(m.sizes, m.strides, 1)) : 0;
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
      if (!mask.count(v)) continue;
      bool as_self = i == 0 && self_refs == 1 && n->arg(0).kind == ArgKind::Tensor && (meta_only || view || scatter);
      if (!as_self)
        refuse(n, "reads an uninitialized allocation (%" + std::to_string(v->id()) + ", from " + v->producer()->op() +
                      " or a view of it)");
    }
    if (n->inputs().empty() || !mask.count(n->input(0)) || meta_only) continue;
    const at::Tensor& m = mask.at(n->input(0));
    if (!m.defined() || n->outputs().size() != 1) {
      if (scatter) refuse(n, "writes part of an uninitialized allocation too large to track");
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
    if (!out.all().item<bool>()) mask[n->output()] = out;
  }
  for (const Value* o : g.outputs())
    if (mask.count(o))
      throw Error("graph output %" + std::to_string(o->id()) + " is (part of) an uninitialized allocation (from " +
                  o->producer()->op() + "; use aten::zeros)");
}

// --- index constants --------------------------------------------------------------------------

namespace {

// Where an op reads indices: the index argument, the argument it indexes, the dim it indexes
// (an argument name, or a fixed dim when `dim_arg` is null), and the range [lo, hi) where hi is
// that dim's size plus `hi_offset` and lo is -size (negative indices wrap) or `lo`.
struct IndexUse {
  const char* index;
  const char* indexed;
  const char* dim_arg;
  int64_t fixed_dim;
  bool negative_wraps;
  int64_t lo = 0, hi_offset = 0;
};

const std::unordered_map<std::string, std::vector<IndexUse>>& index_uses() {
  static const std::unordered_map<std::string, std::vector<IndexUse>> t = {
      {"aten::gather", {{"index", "self", "dim", 0, false}}},
      {"aten::scatter.src", {{"index", "self", "dim", 0, false}}},
      {"aten::scatter.value", {{"index", "self", "dim", 0, false}}},
      {"aten::scatter_add", {{"index", "self", "dim", 0, false}}},
      {"aten::scatter_reduce.two", {{"index", "self", "dim", 0, false}}},
      {"aten::index_select", {{"index", "self", "dim", 0, false}}},
      {"aten::index_add", {{"index", "self", "dim", 0, false}}},
      {"aten::index_copy", {{"index", "self", "dim", 0, false}}},
      {"aten::index_fill.int_Scalar", {{"index", "self", "dim", 0, true}}},
      {"aten::index_fill.int_Tensor", {{"index", "self", "dim", 0, true}}},
      {"aten::embedding", {{"indices", "weight", nullptr, 0, false}}},
      {"aten::_embedding_bag", {{"indices", "weight", nullptr, 0, false}}},
      {"aten::_embedding_bag_forward_only", {{"indices", "weight", nullptr, 0, false}}},
      // LU pivots are 1-based row numbers.
      {"aten::lu_unpack", {{"LU_pivots", "LU_data", nullptr, -2, false, 1, 1}}},
      {"aten::linalg_lu_solve", {{"pivots", "LU", nullptr, -2, false, 1, 1}}},
  };
  return t;
}

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

void check_range(const Node* n, const std::string& what, const at::Tensor& idx, int64_t lo, int64_t hi) {
  if (idx.numel() == 0 || !c10::isIntegralType(idx.scalar_type(), /*includeBool=*/false)) return;
  int64_t min = idx.min().item<int64_t>(), max = idx.max().item<int64_t>();
  if (min < lo || max >= hi)
    throw Error(describe(n) + ": " + what + " holds an index out of range [" + std::to_string(lo) + ", " +
                std::to_string(hi) + ") (from " + std::to_string(min) + " to " + std::to_string(max) + ")");
}

}  // namespace

void check_index_constants(const Graph& g) {
  for (const Node* n : g.nodes()) {
    const auto& s = op_info(n->op()).schema();
    auto it = index_uses().find(n->op());
    if (it != index_uses().end()) {
      for (const IndexUse& u : it->second) {
        int i = arg_index(s, u.index), x = arg_index(s, u.indexed);
        if (i < 0 || x < 0 || n->arg(static_cast<size_t>(i)).kind != ArgKind::Tensor) continue;
        at::Tensor idx = stored_value(g, n->tensor_arg(static_cast<size_t>(i)));
        if (!idx.defined()) continue;
        const std::vector<int64_t>& sizes = n->tensor_arg(static_cast<size_t>(x))->meta().sizes;
        int64_t dim = u.dim_arg ? n->arg(static_cast<size_t>(arg_index(s, u.dim_arg))).value.toInt() : u.fixed_dim;
        int64_t rank = std::max<int64_t>(static_cast<int64_t>(sizes.size()), 1);
        if (dim < -rank || dim >= rank) continue;  // the kernel refuses it
        int64_t size = sizes.empty() ? 1 : sizes[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
        check_range(n, std::string("its ") + u.index, idx, u.negative_wraps ? -size : u.lo, size + u.hi_offset);
      }
    }
    // index.Tensor and index_put: the k-th index tensor of the list indexes dim k of self.
    if (n->op() == "aten::index.Tensor" || n->op() == "aten::index_put") {
      const Arg& list = n->arg(1);
      const std::vector<int64_t>& sizes = n->tensor_arg(0)->meta().sizes;
      for (size_t k = 0; k < list.operands.size() && k < sizes.size(); ++k) {
        if (list.operands[k] < 0) continue;
        at::Tensor idx = stored_value(g, n->input(static_cast<size_t>(list.operands[k])));
        if (idx.defined()) check_range(n, "index " + std::to_string(k), idx, -sizes[k], sizes[k]);
      }
    }
    // NLL losses: class indices into dim 1 (dim 0 for one sample), or the ignore_index.
    if (n->op() == "aten::nll_loss_forward" || n->op() == "aten::nll_loss2d_forward") {
      at::Tensor target = stored_value(g, n->tensor_arg(1));
      if (!target.defined() || target.numel() == 0) continue;
      const std::vector<int64_t>& sizes = n->tensor_arg(0)->meta().sizes;
      int64_t classes = sizes.size() == 1 ? sizes[0] : sizes.size() > 1 ? sizes[1] : 1;
      int64_t ignore = n->arg(static_cast<size_t>(arg_index(s, "ignore_index"))).value.toInt();
      check_range(n, "its target", target.masked_fill(target == ignore, 0), 0, classes);
    }
  }
}

}  // namespace jvpc
