// JVP rules for complex tensors, and which rules of the other families hold for them.
//
// A rule written for real tensors can be wrong for complex ones without failing: abs's
// t·sgn(x) is not d|z| = Re(conj(sgn z)·dz). So the JVP pass applies a rule to a node with a
// complex operand or result only where the table says it holds there (Registry::allow_complex):
// - linear ops (views, copies, sums, padding, cat, FFTs) and bilinear ones (products): the same
//   formula over ℂ, as tangents are ℝ-linear maps;
// - holomorphic functions (exp, log, sin, ..., division, integer powers), whose rules are
//   f'(z)·t with f' built from the complex primal values;
// - and the rules below, of the ops between real and complex: FFTs of real signals and their
//   inverses, views as real or complex pairs, conj, abs and angle:
//     d|z| = Re(conj(z)·dz) / |z|,   d angle(z) = Im(conj(z)·dz) / |z|²   (0 where z = 0)
// both as sums over the (re, im) pairs of view_as_real(dz) with a real factor fold computes.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

namespace {

/// Σ over the last dim of view_as_real(t) ⊙ f: ⟨t, f⟩ per element, for a real factor f [..., 2].
Value* pair_dot(Ctx& c, Value* t, Value* f) {
  if (!t) return nullptr;
  return c.call("aten::sum.dim_IntList", {c.mul(c.call("aten::view_as_real", {t}), f), std::vector<int64_t>{-1}});
}

/// (re, im) of z over |z|^power, 0 where z = 0, as a real [..., 2] factor.
Value* pairs_over_abs(Ctx& c, Value* z, double power) {
  Value* r = c.call("aten::abs", {z});
  Value* inv = c.call("aten::reciprocal", {power == 1.0 ? r : c.call("aten::mul.Tensor", {r, r})});
  inv = c.call("aten::masked_fill.Scalar", {inv, c.call("aten::eq.Scalar", {r, 0}), 0.0});
  return c.call("aten::mul.Tensor", {c.call("aten::view_as_real", {c.call("aten::resolve_conj", {z})}),
                                     c.call("aten::unsqueeze", {inv, -1})});
}

}  // namespace

void register_complex(Registry& r) {
  // FFTs: linear (over ℝ, for c2r, which reads a Hermitian half-spectrum).
  for (const char* op : {"aten::_fft_r2c", "aten::_fft_c2r", "aten::_fft_c2c"}) r.add(op, linear_in(0));
  r.add("aten::view_as_real", linear_in(0));
  r.add("aten::view_as_complex", [](Ctx& c) -> std::vector<Value*> {  // needs (re, im) pairs side by side
    Value* t = c.t(0);
    if (!t) return {};
    if (!t->meta().is_contiguous()) t = c.call("aten::clone", {t, c10::MemoryFormat::Contiguous});
    return {c.call("aten::view_as_complex", {t})};
  });
  // conj, and the negation the imaginary part of a conjugate gets: views that set the conjugate
  // or negative bit. Tangents take them as copies, so that no tangent carries a bit
  // (view_as_real refuses the conjugate one).
  for (const char* op : {"aten::_conj", "aten::_conj_physical"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      if (!c.t(0)) return {};
      return {c.call("aten::_conj_physical", {c.t(0)})};
    });
  r.add("aten::_neg_view", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    return {c.call("aten::neg", {c.t(0)})};
  });
  r.add("aten::angle", [](Ctx& c) -> std::vector<Value*> {  // Im(conj(z)·dz)/|z|²; 0 for real x
    if (!c.t(0) || !c10::isComplexType(c.x(0)->meta().dtype)) return {};
    Value* pairs = pairs_over_abs(c, c.x(0), 2.0);  // (re, im) → (−im, re): Im(conj(z)·dz) = re·dim − im·dre
    Value* rotated = c.call(
        "aten::cat",
        {std::vector<Value*>{c.call("aten::neg", {narrow(c, pairs, -1, 1, 1)}), narrow(c, pairs, -1, 0, 1)}, -1});
    return {pair_dot(c, c.t(0), rotated)};
  });

  // Which rules hold for complex tensors (see the banner).
  for (const char* op :
       {// linear
        "aten::view", "aten::expand", "aten::transpose.int", "aten::t", "aten::permute", "aten::unsqueeze",
        "aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::select.int", "aten::slice.Tensor",
        "aten::split.Tensor", "aten::split_with_sizes", "aten::unsafe_split.Tensor", "aten::unsafe_split_with_sizes",
        "aten::unbind.int", "aten::alias", "aten::diagonal_copy", "aten::expand_copy", "aten::permute_copy",
        "aten::transpose_copy.int", "aten::select_copy.int", "aten::slice_copy.Tensor", "aten::diagonal",
        "aten::unfold", "aten::index_select", "aten::gather", "aten::repeat", "aten::flip", "aten::roll",
        "aten::index.Tensor", "aten::cat", "aten::stack", "aten::constant_pad_nd", "aten::clone", "aten::_to_copy",
        "aten::tril", "aten::triu", "aten::sum", "aten::sum.dim_IntList", "aten::mean", "aten::mean.dim",
        "aten::cumsum", "aten::neg", "aten::mul.Scalar", "aten::div.Scalar", "aten::add.Scalar", "aten::sub.Scalar",
        "aten::rsub.Scalar", "aten::add.Tensor", "aten::sub.Tensor", "aten::rsub.Tensor", "aten::where.self",
        "aten::masked_fill.Scalar", "aten::slice_scatter", "aten::select_scatter", "aten::index_put",
        "aten::scatter_add", "aten::index_add", "aten::scatter.src", "aten::copy", "aten::detach", "aten::zeros_like",
        "aten::ones_like", "aten::empty_like", "aten::full_like", "aten::_fft_r2c", "aten::_fft_c2r", "aten::_fft_c2c",
        "aten::view_as_real", "aten::view_as_complex", "aten::_conj", "aten::_conj_physical", "aten::_neg_view",
        // bilinear
        "aten::mul.Tensor", "aten::mm", "aten::bmm", "aten::dot", "aten::mv", "aten::addmm", "aten::baddbmm",
        // holomorphic
        "aten::div.Tensor", "aten::exp", "aten::log", "aten::reciprocal", "aten::sqrt", "aten::rsqrt", "aten::sin",
        "aten::cos", "aten::tanh", "aten::sinh", "aten::cosh", "aten::sigmoid", "aten::pow.Tensor_Scalar",
        // the complex-aware rules: real results of complex operands
        "aten::abs", "aten::angle"})
    r.allow_complex(op);
}

/// abs's rule, for real x (t·sgn(x)) and complex z (Re(conj(z)·dz)/|z|).
Value* abs_tangent(Ctx& c) {
  if (!c10::isComplexType(c.x(0)->meta().dtype)) return c.mul(c.t(0), c.call("aten::sgn", {c.x(0)}));
  return pair_dot(c, c.t(0), pairs_over_abs(c, c.x(0), 1.0));
}

}  // namespace jvpc::jvp_rules
