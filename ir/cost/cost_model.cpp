#include "ir/cost/cost_model.h"
#include "ir/checked_math.h"
#include "ir/op.h"

#include "ir/cost/scaled_work.h"

#include "ir/liveness.h"
#include "ir/ops.h"

#include <nlohmann/json.hpp>

#include <unordered_map>
#include <unordered_set>

namespace jvpc {

namespace {

int64_t add(int64_t a, int64_t b) { return count_or_throw(checked::add(a, b)); }
template <typename Ints>
int64_t product_of(const Ints& xs) {
  return count_or_throw(checked::product(xs));
}
int64_t product(std::initializer_list<int64_t> xs) { return product_of(xs); }
int64_t product(const std::vector<int64_t>& xs) { return product_of(xs); }
void accumulate(int64_t& total, int64_t x) { total = add(total, x); }

}  // namespace

int64_t distinct_bytes(const TensorMeta& m) {
  int64_t numel = m.numel();
  if (numel == 0) return 0;
  int64_t extent = 1;
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    int64_t span = 0;
    if (__builtin_mul_overflow(m.sizes[i] - 1, m.strides[i], &span) || __builtin_add_overflow(extent, span, &extent))
      return m.nbytes();  // a span past int64: the tensor reads at most its elements
  }
  return std::min(numel, extent) * static_cast<int64_t>(c10::elementSize(m.dtype));
}

int64_t matmul_flops_for(const std::string& op, const std::vector<std::vector<int64_t>>& s,
                         const std::vector<int64_t>& out, bool transposed) {
  auto dim = [&](size_t t, size_t d) { return s.at(t).at(d); };
  if (op == ops::convolution) {
    // 2 · batch · w[0] · w[1] · prod(kernel) · prod(spatial), the spatial sizes of the output
    // (of the input, transposed); w[1] is the input channels per group. Bias is not counted.
    const auto &x = s.at(0), &w = s.at(1);
    const auto& space = transposed ? x : out;
    if (x.size() < 3 || w.size() != x.size() || space.size() != x.size()) throw std::out_of_range("convolution shapes");
    std::vector<int64_t> f = {2, x[0]};
    f.insert(f.end(), w.begin(), w.end());
    f.insert(f.end(), space.begin() + 2, space.end());
    return product(f);
  }
  if (op == ops::mm) return product({2, dim(0, 0), dim(0, 1), dim(1, 1)});
  if (op == ops::addmm) return product({2, dim(1, 0), dim(1, 1), dim(2, 1)});
  if (op == ops::bmm) return product({2, dim(0, 0), dim(0, 1), dim(0, 2), dim(1, 2)});
  if (op == ops::baddbmm) return product({2, dim(1, 0), dim(1, 1), dim(1, 2), dim(2, 2)});
  if (is_fused_attention(op)) {
    // q [b,h,s_q,d], k [b,h_k,s_k,d], v [b,h_k,s_k,d_v]; counted with q's heads.
    const auto &q = s.at(0), &k = s.at(1), &v = s.at(2);
    int64_t bh = product({q.at(0), q.at(1)}), sq = q.at(2), d = q.at(3), sk = k.at(2), dv = v.at(3);
    return add(product({2, bh, sq, d, sk}), product({2, bh, sq, sk, dv}));
  }
  return -1;
}

int64_t attention_tangent_score_elements(const AttentionTangentShape& a) {
  int64_t total = 0;
  for (int64_t i0 = 0; i0 < a.Lq; i0 += a.block_q) {
    int64_t bq = std::min(a.block_q, a.Lq - i0);
    // Causal (top left): key block [j0, j0 + bk) runs while j0 <= the block's last query.
    int64_t keys = a.causal ? std::min(a.Lk, ((i0 + bq - 1) / a.block_k + 1) * a.block_k) : a.Lk;
    accumulate(total, product({bq, keys}));
  }
  return total;
}

int64_t attention_tangent_matmul_flops(const AttentionTangentShape& a) {
  bool ds = a.dq || a.dk || a.dmask;
  if (!ds && !a.dv) return 0;
  // The score recompute once, the tangents' bmms once per tangent.
  int64_t per =
      add(a.D, product({a.K, add(product({a.D, int64_t(a.dq) + a.dk}), product({a.Dv, int64_t(ds) + a.dv}))}));
  return product({2, a.B, a.H, attention_tangent_score_elements(a), per});
}

int64_t attention_tangent_workspace_bytes(const AttentionTangentShape& a) {
  int64_t bq = std::min(a.block_q, a.Lq), bk = std::min(a.block_k, a.Lk);
  // Per key block: scores/P, dS (and one bmm result added to it), a mask block and the causal
  // mask; the key block's operands k, dk, v, dv in the accumulation type.
  // (With K tangents, those of dS, dk, dv, dq and the accumulators K times.)
  int64_t block = product({a.B, a.H, bq, bk, (1 + 2 * a.K) * a.acc_bytes + (a.mask ? a.acc_bytes : 0) + 1});
  int64_t keys = product({a.B, a.Hkv, bk, (1 + a.K) * (a.D + a.Dv) * a.acc_bytes});
  // Per query block: q, dq, out and the accumulator rows, the row sums, lse and its mask.
  int64_t rows = product({a.B, a.H, bq, ((1 + a.K) * (a.D + a.Dv) + 1 + 2 * a.K) * a.acc_bytes + 1});
  return add(add(block, keys), rows);
}

AttentionTangentShape attention_tangent_shape(const Node& n) {
  auto tensor = [&](size_t arg) -> const Value* {
    return n.arg(arg).kind == ArgKind::Tensor ? n.tensor_arg(arg) : nullptr;
  };
  const auto &q = tensor(0)->meta(), &k = tensor(1)->meta(), &v = tensor(2)->meta();
  if (q.sizes.size() != 4 || k.sizes.size() != 4 || v.sizes.size() != 4)
    throw std::out_of_range("attention_tangent shapes");
  AttentionTangentShape a;
  a.B = q.sizes[0], a.H = q.sizes[1], a.Lq = q.sizes[2], a.D = q.sizes[3];
  a.Hkv = k.sizes[1], a.Lk = k.sizes[2], a.Dv = v.sizes[3];
  a.dq = tensor(5), a.dk = tensor(6), a.dv = tensor(7), a.mask = tensor(8), a.dmask = tensor(9);
  a.causal = n.arg(10).value.toBool();
  if (n.is(ops::jvpc_attention_tangent_batched)) {  // the tangents and the result have K in front
    const auto& o = n.output(0)->meta().sizes;
    if (o.size() != 5) throw std::out_of_range("attention_tangent shapes");
    a.K = o[0];
  }
  a.block_q = n.arg(12).value.toInt(), a.block_k = n.arg(13).value.toInt();
  if (a.block_q <= 0 || a.block_k <= 0) throw std::out_of_range("attention_tangent block sizes");
  a.dtype_bytes = static_cast<int64_t>(c10::elementSize(q.dtype));
  a.acc_bytes = c10::isReducedFloatingType(q.dtype) ? 4 : a.dtype_bytes;
  return a;
}

const std::vector<std::string>& comparison_ops() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> v;
    for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge"})
      for (const char* overload : {"Scalar", "Tensor"}) v.push_back(std::string("aten::") + op + "." + overload);
    return v;
  }();
  return ops;
}

namespace {

// How an op's FLOPs scale: none (copies, factories), per output element (elementwise), per input
// element (reductions, softmax and its backward), per input element plus one rsqrt per row
// (normalizations), per output element times the order n of the matrix solved with (a solve
// with a factored matrix: n²·k per substitution for an n×k right-hand side).
enum class Kind { Copy, Elementwise, Reduction, Normalization, Solve };

struct Rule {
  Kind kind;
  int other = 1;  // other FLOPs per element
  int trans = 0;  // transcendentals per element
};

// One row per op family. Views (from their schema) cost nothing. An op in no row has no
// convention: it is counted as 1 FLOP per output element and reported as uncosted.
const std::unordered_map<std::string, Rule>& rules() {
  static const std::unordered_map<std::string, Rule> r = [] {
    std::unordered_map<std::string, Rule> m;
    for (Op op : {ops::clone,
                  ops::_to_copy,
                  ops::copy,
                  ops::contiguous,
                  ops::cat,
                  ops::stack,
                  ops::index_select,
                  ops::repeat,
                  ops::repeat_interleave_self_int,
                  ops::index_Tensor,
                  ops::tril,
                  ops::triu,
                  ops::fill_Scalar,
                  ops::zero,
                  ops::masked_fill_Scalar,
                  ops::flip,
                  ops::roll,
                  ops::gather,
                  ops::constant_pad_nd,
                  ops::scatter_src,
                  ops::scatter_value})
      m[op] = {Kind::Copy, 0, 0};
    for (Op op : {ops::ones, ops::zeros, ops::empty_memory_format, ops::full, ops::scalar_tensor, ops::empty_strided,
                  ops::arange, ops::arange_start, ops::ones_like, ops::zeros_like, ops::empty_like, ops::full_like,
                  ops::rand, ops::randn})
      m[op] = {Kind::Copy, 0, 0};
    for (Op op : {ops::exp,
                  ops::log,
                  ops::tanh,
                  ops::sigmoid,
                  ops::erf,
                  ops::sqrt,
                  ops::rsqrt,
                  ops::sin,
                  ops::cos,
                  ops::log1p,
                  ops::expm1,
                  ops::reciprocal,
                  ops::sinh,
                  ops::cosh,
                  ops::atan,
                  ops::log2,
                  ops::log10,
                  ops::pow_Tensor_Scalar,
                  ops::pow_Tensor_Tensor,
                  ops::pow_Scalar})
      m[op] = {Kind::Elementwise, 0, 1};
    // Elementwise arithmetic, selection and comparisons: 1 FLOP per output element.
    for (Op op : {ops::add_Tensor,
                  ops::add_Scalar,
                  ops::sub_Tensor,
                  ops::sub_Scalar,
                  ops::rsub_Tensor,
                  ops::rsub_Scalar,
                  ops::mul_Tensor,
                  ops::mul_Scalar,
                  ops::div_Tensor,
                  ops::div_Scalar,
                  ops::div_Tensor_mode,
                  ops::neg,
                  ops::abs,
                  ops::sign,
                  ops::sgn,
                  ops::relu,
                  ops::threshold,
                  ops::clamp,
                  ops::clamp_Tensor,
                  ops::clamp_min,
                  ops::clamp_min_Tensor,
                  ops::clamp_max,
                  ops::clamp_max_Tensor,
                  ops::maximum,
                  ops::minimum,
                  ops::where_self,
                  ops::where_ScalarSelf,
                  ops::where_ScalarOther,
                  ops::where_Scalar,
                  ops::masked_fill_Tensor,
                  ops::logical_not,
                  ops::logical_and,
                  ops::logical_or,
                  ops::bitwise_not,
                  ops::bitwise_and_Tensor,
                  ops::bitwise_or_Tensor,
                  ops::floor,
                  ops::ceil,
                  ops::round,
                  ops::trunc,
                  ops::frac,
                  ops::hardtanh,
                  ops::leaky_relu,
                  ops::remainder_Tensor,
                  ops::remainder_Scalar,
                  ops::fmod_Tensor,
                  ops::fmod_Scalar,
                  ops::nan_to_num,
                  ops::square})
      m[op] = {Kind::Elementwise, 1, 0};
    for (const std::string& op : comparison_ops()) m[op] = {Kind::Elementwise, 1, 0};
    for (Op op : {ops::addcmul, ops::addcdiv, ops::lerp_Scalar, ops::lerp_Tensor}) m[op] = {Kind::Elementwise, 2, 0};
    m[ops::gelu] = {Kind::Elementwise, 4, 1};           // x·½(1+erf(x/√2))
    m[ops::gelu_backward] = {Kind::Elementwise, 8, 2};  // ½(1+erf) + x·φ(x), times grad
    m[ops::silu] = {Kind::Elementwise, 2, 1};
    for (Op op : {ops::sum, ops::sum_dim_IntList, ops::mean, ops::mean_dim, ops::amax, ops::amin, ops::max, ops::min,
                  ops::var_correction, ops::std_correction, ops::norm_Scalar, ops::linalg_vector_norm, ops::prod,
                  ops::prod_dim_int, ops::cumsum, ops::cumprod})
      m[op] = {Kind::Reduction, 1, 0};
    for (Op op : {ops::logsumexp, ops::logcumsumexp}) m[op] = {Kind::Reduction, 3, 1};  // max, subtract, sum; exp
    for (Op op : {ops::_softmax, ops::_safe_softmax, ops::_log_softmax})
      m[op] = {Kind::Reduction, 4, 1};                         // max, subtract, sum, divide; exp
    m[ops::_softmax_backward_data] = {Kind::Reduction, 4, 0};  // y·(g − Σ g·y)
    for (Op op : {ops::native_layer_norm, ops::native_group_norm, ops::native_batch_norm,
                  ops::_native_batch_norm_legit_functional})
      m[op] = {Kind::Normalization, 8, 0};
    // Matrix-vector and dot products: FlopCounterMode has no rule for them, so they count as
    // reductions of their first operand, 2 per multiply-add as for the matmuls.
    m[ops::mv] = m[ops::dot] = {Kind::Reduction, 2, 0};
    // Solves with a factored matrix: one substitution (triangular), two (LU, Cholesky).
    m[ops::linalg_solve_triangular] = {Kind::Solve, 1, 0};
    m[ops::linalg_lu_solve] = m[ops::cholesky_solve] = {Kind::Solve, 2, 0};
    return m;
  }();
  return r;
}

}  // namespace

namespace {

NodeCost cost_of(const Node& n) {
  NodeCost c;
  const OpInfo& info = op_info(n.op());
  if (info.is_view) return c;
  const bool matmul = is_matmul(n.op());
  std::vector<std::vector<int64_t>> shapes;  // the matmul formulas' operands
  if (matmul)
    for (const Arg& a : n.args()) {
      if (a.kind == ArgKind::Tensor)
        shapes.push_back(n.input(static_cast<size_t>(a.operands[0]))->meta().sizes);
      else if (a.kind == ArgKind::None)
        shapes.emplace_back();
    }
  for (const Value* v : n.inputs()) accumulate(c.bytes, distinct_bytes(v->meta()));
  int64_t out_elems = 0;
  for (const Value* v : n.outputs()) {
    accumulate(c.bytes, v->meta().nbytes());
    accumulate(out_elems, v->meta().numel());
  }
  int64_t in_elems = n.inputs().empty() ? 0 : n.input(0)->meta().numel();
  int64_t mm = -1;
  if (n.is(ops::jvpc_attention_tangent) || n.is(ops::jvpc_attention_tangent_batched)) {
    try {
      AttentionTangentShape a = attention_tangent_shape(n);
      c.matmul_flops = attention_tangent_matmul_flops(a);
      // Per computed score element: scale, mask, subtract lse, exp; dS scale and mask, P⊙dS,
      // its row sum; the accumulations.
      int64_t scores = product({a.B, a.H, attention_tangent_score_elements(a)});
      c.other_flops = product({4 + 4 * a.K, scores});
      c.transcendentals = scores;
      c.workspace_bytes = attention_tangent_workspace_bytes(a);
      c.note = "the O(L) attention tangent: its bmms over the blocks it computes";
    } catch (const std::out_of_range&) {
      throw Error("node " + n.op() + ": operand shapes do not fit the operator");
    }
    return c;
  }
  try {
    bool transposed = n.is(ops::convolution) && n.arg(6).value.toBool();
    if (matmul) mm = matmul_flops_for(n.op(), shapes, n.output(0)->meta().sizes, transposed);
  } catch (const std::out_of_range&) {
    throw Error("node " + n.op() + ": operand shapes do not fit the matmul formula");
  }
  if (mm >= 0) {
    c.matmul_flops = mm;
    if (n.is(ops::_scaled_dot_product_flash_attention_for_cpu))
      c.note =
          "the CPU flash kernel, counted as its two bmms over the query heads (as torch 2.15's FlopCounterMode "
          "counts it; 2.11's has no rule for it)";
    else if (n.handle().has(kFusedAttention) && shapes.at(0).at(1) != shapes.at(1).at(1))
      c.note = "FlopCounterMode has no rule for grouped-query attention; counted as two bmms over the query heads";
    if (n.is(ops::addmm) || n.is(ops::baddbmm)) c.other_flops = out_elems;  // the addition
    return c;
  }
  if (std::optional<int64_t> work = scaled_work_flops(n)) {  // windows, factorizations, sorts, ...
    c.other_flops = *work;
    return c;
  }
  auto it = rules().find(n.op());
  c.uncosted = it == rules().end();
  Rule r = c.uncosted ? Rule{Kind::Elementwise, 1, 0} : it->second;
  switch (r.kind) {
    case Kind::Copy:
      break;
    case Kind::Elementwise:
      c.other_flops = product({r.other, out_elems});
      c.transcendentals = product({r.trans, out_elems});
      break;
    case Kind::Reduction:
      c.other_flops = product({r.other, in_elems});
      c.transcendentals = product({r.trans, in_elems});
      break;
    case Kind::Solve: {  // the matrix: operand 0, except cholesky_solve(B, L)
      const Value* matrix = n.is(ops::cholesky_solve) ? n.input(1) : n.input(0);
      c.other_flops = product({r.other, matrix->meta().sizes.back(), out_elems});
      break;
    }
    case Kind::Normalization: {
      c.other_flops = product({r.other, in_elems});
      c.transcendentals = n.outputs().size() > 2 ? n.output(2)->meta().numel() : 0;  // one rsqrt per row
      break;
    }
  }
  return c;
}

}  // namespace

NodeCost node_cost(const Node& n) {
  try {
    return cost_of(n);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind("node ", 0) == 0) throw;
    throw Error("node " + n.op() + ": " + msg);
  }
}

GraphCost graph_cost(const Graph& g) {
  GraphCost c;
  auto nodes = g.nodes();
  for (const Node* n : nodes) {
    NodeCost nc = node_cost(*n);
    c.nodes++;
    try {
      accumulate(c.matmul_flops, nc.matmul_flops);
      accumulate(c.other_flops, nc.other_flops);
      accumulate(c.transcendentals, nc.transcendentals);
      accumulate(c.bytes, nc.bytes);
    } catch (const Error& e) {
      throw Error(std::string("graph total: ") + e.what());
    }
    c.workspace_bytes = std::max(c.workspace_bytes, nc.workspace_bytes);
    c.ops[n->op()]++;
    if (nc.uncosted) c.uncosted_ops[n->op()]++;
  }
  // Residuals: constants, with shared storage counted once, aliases of caller inputs apart.
  std::unordered_set<const void*> seen;
  for (const Input& in : g.inputs()) {
    if (in.role != Role::Constant) continue;
    int64_t bytes = in.data.defined() ? static_cast<int64_t>(in.data.storage().nbytes()) : in.value->meta().nbytes();
    const void* key = in.data.defined() && in.data.has_storage() ? in.data.storage().unsafeGetStorageImpl()
                                                                 : static_cast<const void*>(in.value);
    if (!seen.insert(key).second) continue;
    accumulate(in.aliases.empty() ? c.residual_bytes : c.aliased_input_bytes, bytes);
  }
  c.peak_bytes = peak_intermediate_bytes(g);
  return c;
}

nlohmann::json to_json(const GraphCost& c) {
  return {{"nodes", c.nodes},
          {"matmul_flops", c.matmul_flops},
          {"other_flops", c.other_flops},
          {"transcendentals", c.transcendentals},
          {"bytes", c.bytes},
          {"residual_bytes", c.residual_bytes},
          {"aliased_input_bytes", c.aliased_input_bytes},
          {"peak_bytes", c.peak_bytes},
          {"workspace_bytes", c.workspace_bytes},
          {"ops", c.ops},
          {"uncosted_ops", c.uncosted_ops}};
}

}  // namespace jvpc
