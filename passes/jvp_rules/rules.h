// JVP rules: for each ATen op, how to build the tangent of its outputs from the tangents of its
// inputs, as IR. A table keyed by op name, filled by one file per op family (elementwise,
// reductions, linalg, views, normalization, attention, random), in the manner of JAX's primitive_jvps.
//
// A rule sees the primal node and its operands' tangents, where nullptr is a symbolic zero:
// no work is ever emitted for a zero. It returns one tangent per node output (nullptr for
// zero; fewer entries mean the rest are zero). The JVP pass makes each tangent match its
// primal output's shape and dtype. Rules write derivative factors as primal expressions
// (t * f'(x) with f'(x) built from primal values), so that fold computes them once.
#pragma once

#include "ir/builder.h"
#include "ir/op.h"
#include "passes/op_table.h"

#include <functional>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

namespace jvpc::jvp_rules {

class Ctx;
/// One argument's term of a tangent (JAX's per-argument jvp rules): given that argument's
/// non-zero tangent t, the part of the output's tangent linear in t.
using Term = std::function<Value*(Ctx& c, Value* t)>;
/// The same for an op with several outputs: the parts of all outputs' tangents (nullptr: none;
/// fewer entries: the rest none).
using Terms = std::function<std::vector<Value*>(Ctx& c, Value* t)>;

class Ctx {
 public:
  Ctx(Builder& b, const Node& n, std::vector<Value*> operand_tangents)
      : b(b), n(n), tangents_(std::move(operand_tangents)) {}

  /// b: the builder that emits the tangent's nodes.
  Builder& b;
  /// n: the primal node whose outputs' tangents the rule builds.
  const Node& n;

  /// x(arg): the primal tensor passed for schema argument `arg`.
  Value* x(size_t arg) const { return n.tensor_arg(arg); }
  /// t(arg): the tangent of x(arg), or nullptr for a zero tangent.
  Value* t(size_t arg) const;
  /// The tangent of operand `i` (in Node::inputs() order).
  Value* operand_tangent(size_t i) const { return tangents_.at(i); }
  Value* out(size_t i = 0) const { return n.output(i); }
  /// c(arg): the value of the constant (non-tensor) schema argument `arg`: an int, a float, a list.
  const c10::IValue& c(size_t arg) const { return n.arg(arg).value; }
  /// a(arg): schema argument `arg` as the primal node holds it (tensor or constant), to pass to another op.
  BArg a(size_t arg) const { return BArg::of_arg(n.arg(arg), &n); }

  Value* call(const std::string& op, std::vector<BArg> args) { return b.call(op, std::move(args)); }
  /// a + b, where either may be a zero (nullptr).
  Value* add(Value* a, Value* b);
  /// a * s, skipping s == 1; zero stays zero.
  Value* scale(Value* a, double s);
  /// t * factor (elementwise, broadcasting); zero stays zero.
  Value* mul(Value* t, Value* factor);
  /// a − b, where either may be a zero (nullptr): b alone is scaled by −1.
  Value* sub(Value* a, Value* b);
  /// t(arg), or a materialized zero shaped like x(arg) where the tangent is zero.
  Value* t_or_zeros(size_t arg) { return t(arg) ? t(arg) : zeros_like(x(arg)); }
  /// a·b over the last two dims (jvp_rules::matmul); zero where either is zero.
  Value* matmul(Value* a, Value* b);
  /// Σ v over `dims` (sum.dim_IntList); zero stays zero.
  Value* sum(Value* v, std::vector<int64_t> dims, bool keepdim = false) {
    return v ? call(ops::sum_dim_IntList, {v, std::move(dims), keepdim}) : nullptr;
  }
  /// v with a dim of size 1 inserted at `dim`; zero stays zero.
  Value* unsqueeze(Value* v, int64_t dim) { return v ? call(ops::unsqueeze, {v, dim}) : nullptr; }
  /// v viewed as `sizes` (reshape, copying where it must); zero stays zero.
  Value* reshape(Value* v, const std::vector<int64_t>& sizes) { return v ? jvpc::reshape(b, v, sizes) : nullptr; }
  /// v as `dtype` (_to_copy), v itself where it has that dtype already; zero stays zero.
  Value* cast(Value* v, c10::ScalarType dtype) {
    return !v || v->meta().dtype == dtype ? v : call(ops::_to_copy, {v, dtype});
  }
  /// where(cond, a, b) for tangents a and b, either of which may be a zero (nullptr; both: nullptr).
  Value* where(Value* cond, Value* a, Value* b);
  /// Σ terms[i](*this, t(i)) over the arguments i whose tangent is non-zero, in argument order
  /// (an empty term: argument i has no tangent); nullptr where all are zero.
  Value* per_arg(const std::vector<Term>& terms);
  /// The node's op with argument `arg` replaced by its tangent (its first output): the term of
  /// an argument the op is linear in; nullptr for a zero tangent.
  Value* linear_in(size_t arg) { return t(arg) ? reapply(arg, t(arg)).at(0) : nullptr; }

  // Formula builders over (non-zero) values; an arithmetic `s` is a Scalar argument.
  template <class S>
  using IfScalar = std::enable_if_t<std::is_arithmetic_v<S>, Value*>;
  template <class S>
  IfScalar<S> add(Value* x, S s) {
    return call(ops::add_Scalar, {x, s});
  }
  template <class S>
  IfScalar<S> sub(Value* x, S s) {
    return call(ops::sub_Scalar, {x, s});
  }
  /// s − x
  template <class S>
  IfScalar<S> sub(S s, Value* x) {
    return call(ops::rsub_Scalar, {x, s});
  }
  template <class S>
  IfScalar<S> pow(Value* x, S s) {
    return call(ops::pow_Tensor_Scalar, {x, s});
  }
  Value* div(Value* a, Value* b) { return call(ops::div_Tensor, {a, b}); }
  Value* neg(Value* x) { return call(ops::neg, {x}); }
  /// x·x (mul.Tensor)
  Value* square(Value* x) { return call(ops::mul_Tensor, {x, x}); }
  Value* recip(Value* x) { return call(ops::reciprocal, {x}); }
  Value* exp(Value* x) { return call(ops::exp, {x}); }
  Value* rsqrt(Value* x) { return call(ops::rsqrt, {x}); }
  Value* sigmoid(Value* x) { return call(ops::sigmoid, {x}); }
  /// x with `value` where `mask` holds (masked_fill.Scalar)
  Value* masked_fill(Value* x, Value* mask, double value) { return call(ops::masked_fill_Scalar, {x, mask, value}); }
  /// x == s, a boolean mask (eq.Scalar)
  template <class S>
  IfScalar<S> eq(Value* x, S s) {
    return call(ops::eq_Scalar, {x, s});
  }

  /// A materialized zero tangent shaped like `v`: aten::zeros from metadata alone, so that it
  /// reads no primal value and fold leaves it to be made per call rather than held as a residual.
  Value* zeros_like(const Value* v);
  /// The node's op applied again with argument `arg` replaced by `v` (other arguments as in
  /// the primal node).
  std::vector<Value*> reapply(size_t arg, Value* v) { return reapply({{arg, v}}); }
  /// The same with several arguments replaced.
  std::vector<Value*> reapply(const std::vector<std::pair<size_t, Value*>>& replaced);

 private:
  std::vector<Value*> tangents_;
};

using Rule = std::function<std::vector<Value*>(Ctx&)>;

class Registry : public OpTable<Rule> {
 public:
  /// Marks op's rule as holding for complex operands and results too (complex.cpp says which).
  void allow_complex(const std::string& op);
  bool holds_for_complex(const std::string& op) const { return complex_.count(op) > 0; }
  std::vector<std::string> complex_ops() const;
  /// Marks op as met in traces only: graph files may not use it (passes/loadable_ops.cpp), as no
  /// safety contract is written for its arguments (the backward kernels, backward.cpp).
  void traced_only(const std::string& op) { traced_only_.insert(op); }
  bool is_traced_only(const std::string& op) const { return traced_only_.count(op) > 0; }

 private:
  std::unordered_set<std::string> complex_;
  std::unordered_set<std::string> traced_only_;
};

/// All rules, built once.
const Registry& registry();

/// The tangents of n's outputs (nullptr for zero; empty where none is floating) from its
/// operands' tangents, by n's rule, each made to match its output's shape and dtype; emitted at
/// the graph's insertion point. Throws an Error naming the op where it has no rule.
std::vector<Value*> differentiate(Builder& b, const Node& n, std::vector<Value*> operand_tangents);
/// differentiate() for each of `nodes` in order that has a non-zero operand tangent: the operands'
/// tangents are looked up in `tangent` (absent: zero), and the outputs' recorded there; each
/// node's tangent nodes are emitted just after it.
void differentiate_in_order(Builder& b, const std::vector<Node*>& nodes,
                            std::unordered_map<const Value*, Value*>& tangent);

// Rule makers.
/// Linear in argument `arg`: the same op applied to its tangent (views, sums, copies).
Rule linear_in(size_t arg);
/// Linear in every tensor of a tensor-list argument (cat, stack); zeros fill absent tangents.
Rule linear_in_list(size_t arg);
/// The tangent as a sum of per-argument terms (Ctx::per_arg): terms[i] for argument i.
Rule per_arg(std::vector<Term> terms);
/// per_arg for several outputs: output k's tangent is Σ terms[i](c, t(i))[k].
Rule per_arg_outputs(std::vector<Terms> terms);
/// Bilinear in arguments 0 and 1: op(t0, x1) + op(x0, t1) (mm, bmm, mul).
Rule bilinear();
/// Elementwise in argument 0: t0 * f'(x0), with f'(x0) built by `derivative` from primals.
Rule unary(std::function<Value*(Ctx&)> derivative);
/// An op written as other ops: `build` emits the formula it computes from the node's operands
/// and returns the values standing for its schema's returns (those the node dropped, as
/// undefined, are skipped); the tangent is those ops' rules applied in
/// turn (the backward kernels, whose derivative is their formula's). The formula's primal nodes
/// serve the tangent alone; the node itself still computes the primal.
Rule composite(std::function<std::vector<Value*>(Ctx&)> build);
/// A tangent that is always zero (detach, factories, rounding, comparisons).
Rule zero();
/// Elementwise in argument 0, passing its tangent where the boolean `mask` holds and zero
/// elsewhere, a non-finite tangent included (relu, threshold, clamps): where(mask, t0, 0), as
/// LibTorch's threshold_backward and clamp_backward select.
Rule masked(std::function<Value*(Ctx&)> mask);

/// A Scalar argument (int, bool or float) as a double; `if_none` for None.
double scalar(const c10::IValue& v, double if_none = 0.0);

// reshape(c.b, v, sizes) (ir/builder.h; c.reshape) views v as sizes, copying first where its layout
// cannot be viewed so: a tangent may be laid out unlike its primal (a tangent input is
// contiguous, a primal may be a transposed weight).
/// a·b over the last two dims, batch dims broadcast (as at::matmul does, but in the kernels the
/// cost model counts: mm, or bmm over the flattened batch).
Value* matmul(Ctx& c, Value* a, Value* b);
/// v with its last two dims swapped (a view).
Value* mT(Ctx& c, Value* v);
/// `length` entries of v along `dim` from `start` (a view).
Value* narrow(Ctx& c, Value* v, int64_t dim, int64_t start, int64_t length);
/// A per-channel vector [C] viewed as [C, 1, ...], to broadcast against [N, C, ...] of `rank`
/// (a bias or a normalization's weight).
Value* per_channel(Ctx& c, Value* v, size_t rank);

// Reductions.
/// The dims a reduction's `dims` argument names, wrapped to [0, rank); None or [] means all.
std::vector<int64_t> reduced_dims(const Value* x, const c10::IValue& dims);
/// A reduction's result `r` with the reduced dims kept (size 1), so it broadcasts against `x`.
Value* keep_dims(Ctx& c, Value* r, const Value* x, const std::vector<int64_t>& dims);
/// The tangent of ‖x‖_p over `dims`, the node's output, given the (non-zero) tangent `t` of x:
/// Σ t·sgn(x)·(|x| / ‖x‖)^(p−1), 0 where the norm is 0 (and where x is, for p < 1); for
/// p = ±inf, the tangent of the extreme elements, averaged over ties; for p = 0 (a count), zero.
/// In the output's dtype: a `dtype` argument may widen it (a float16 norm would overflow).
Value* norm_tangent(Ctx& c, Value* x, Value* t, double p, const std::vector<int64_t>& dims, bool keepdim);
/// rstd·(t − mean(t) − x̂·mean(t·x̂)) over `dims` (keepdim shapes): the tangent of a
/// normalization x̂ = (x − μ)·rstd along x's tangent t (normalization.cpp), and, the map being
/// self-adjoint, x's gradient given x̂'s (the normalizations' backward kernels, backward.cpp).
/// `means`, where given, receives mean(t) and mean(t·x̂).
Value* normalized_tangent(Ctx& c, Value* t, Value* xhat, Value* rstd, const std::vector<int64_t>& dims,
                          std::pair<Value*, Value*>* means = nullptr);
/// float(hits) / Σ hits over `dims`, in the node's result dtype: each selected element's share
/// when ties split a tangent evenly (amax, max, the inf-norm).
Value* tie_shares(Ctx& c, Value* hits, const std::vector<int64_t>& dims);

// One registration function per family file.
void register_elementwise(Registry& r);
void register_activations(Registry& r);
void register_selection(Registry& r);
void register_reductions(Registry& r);
void register_linalg(Registry& r);
void register_views(Registry& r);
void register_normalization(Registry& r);
void register_attention(Registry& r);
void register_solvers(Registry& r);
void register_complex(Registry& r);
void register_recurrent(Registry& r);
void register_random(Registry& r);
void register_backward(Registry& r);

/// abs's tangent, real and complex (complex.cpp).
Value* abs_tangent(Ctx& c);

}  // namespace jvpc::jvp_rules
