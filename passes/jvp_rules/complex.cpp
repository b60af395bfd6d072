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
#include "ir/op.h"

namespace jvpc::jvp_rules {

namespace {

/// Σ over the last dim of view_as_real(t) ⊙ f: ⟨t, f⟩ per element, for a real factor f [..., 2].
Value* pair_dot(Ctx& c, Value* t, Value* f) { return c.sum(c.mul(c.call(ops::view_as_real, {t}), f), {-1}); }

/// (re, im) of z over |z|^power, 0 where z = 0, as a real [..., 2] factor.
Value* pairs_over_abs(Ctx& c, Value* z, double power) {
  Value* r = c.call(ops::abs, {z});
  Value* inv = c.masked_fill(c.recip(power == 1.0 ? r : c.square(r)), c.eq(r, 0), 0.0);
  return c.mul(c.call(ops::view_as_real, {c.call(ops::resolve_conj, {z})}), c.unsqueeze(inv, -1));
}

}  // namespace

void register_complex(Registry& r) {
  // FFTs: linear (over ℝ, for c2r, which reads a Hermitian half-spectrum).
  for (Op op : {ops::_fft_r2c, ops::_fft_c2r, ops::_fft_c2c}) r.add(op, linear_in(0));
  r.add(ops::view_as_real, linear_in(0));
  r.add(ops::view_as_complex, per_arg({[](Ctx& c, Value* t) {  // needs (re, im) pairs side by side
          if (!t->meta().is_contiguous()) t = c.call(ops::clone, {t, c10::MemoryFormat::Contiguous});
          return c.call(ops::view_as_complex, {t});
        }}));
  // conj, and the negation the imaginary part of a conjugate gets: views that set the conjugate
  // or negative bit. Tangents take them as copies, so that no tangent carries a bit
  // (view_as_real refuses the conjugate one).
  for (Op op : {ops::_conj, ops::_conj_physical})
    r.add(op, per_arg({[](Ctx& c, Value* t) { return c.call(ops::_conj_physical, {t}); }}));
  r.add(ops::_neg_view, per_arg({[](Ctx& c, Value* t) { return c.neg(t); }}));
  r.add(ops::angle, per_arg({[](Ctx& c, Value* t) -> Value* {  // Im(conj(z)·dz)/|z|²; 0 for real x
          if (!c10::isComplexType(c.x(0)->meta().dtype)) return nullptr;
          Value* pairs = pairs_over_abs(c, c.x(0), 2.0);  // (re, im) → (−im, re): Im(conj(z)·dz) = re·dim − im·dre
          Value* rotated = c.call(
              ops::cat, {std::vector<Value*>{c.neg(narrow(c, pairs, -1, 1, 1)), narrow(c, pairs, -1, 0, 1)}, -1});
          return pair_dot(c, t, rotated);
        }}));

  // Which rules hold for complex tensors (see the banner).
  for (Op op :
       {// linear
        ops::view, ops::expand, ops::transpose_int, ops::t, ops::permute, ops::unsqueeze, ops::squeeze,
        ops::squeeze_dim, ops::squeeze_dims, ops::select_int, ops::slice_Tensor, ops::split_Tensor,
        ops::split_with_sizes, ops::unsafe_split_Tensor, ops::unsafe_split_with_sizes, ops::unbind_int, ops::alias,
        ops::diagonal_copy, ops::expand_copy, ops::permute_copy, ops::transpose_copy_int, ops::select_copy_int,
        ops::slice_copy_Tensor, ops::diagonal, ops::unfold, ops::index_select, ops::gather, ops::repeat, ops::flip,
        ops::roll, ops::index_Tensor, ops::cat, ops::stack, ops::constant_pad_nd, ops::clone, ops::_to_copy, ops::tril,
        ops::triu, ops::sum, ops::sum_dim_IntList, ops::mean, ops::mean_dim, ops::cumsum, ops::neg, ops::mul_Scalar,
        ops::div_Scalar, ops::add_Scalar, ops::sub_Scalar, ops::rsub_Scalar, ops::add_Tensor, ops::sub_Tensor,
        ops::rsub_Tensor, ops::where_self, ops::masked_fill_Scalar, ops::slice_scatter, ops::select_scatter,
        ops::index_put, ops::scatter_add, ops::index_add, ops::scatter_src, ops::copy, ops::detach, ops::zeros_like,
        ops::ones_like, ops::empty_like, ops::full_like, ops::_fft_r2c, ops::_fft_c2r, ops::_fft_c2c, ops::view_as_real,
        ops::view_as_complex, ops::_conj, ops::_conj_physical, ops::_neg_view,
        // bilinear
        ops::mul_Tensor, ops::mm, ops::bmm, ops::dot, ops::mv, ops::addmm, ops::baddbmm,
        // holomorphic
        ops::div_Tensor, ops::exp, ops::log, ops::reciprocal, ops::sqrt, ops::rsqrt, ops::sin, ops::cos, ops::tanh,
        ops::sinh, ops::cosh, ops::sigmoid, ops::pow_Tensor_Scalar,
        // the complex-aware rules: real results of complex operands
        ops::abs, ops::angle})
    r.allow_complex(op);
}

/// abs's rule, for real x (t·sgn(x)) and complex z (Re(conj(z)·dz)/|z|).
Value* abs_tangent(Ctx& c) {
  return c.per_arg({[](Ctx& c, Value* t) {
    if (!c10::isComplexType(c.x(0)->meta().dtype)) return c.mul(t, c.call(ops::sgn, {c.x(0)}));
    return pair_dot(c, t, pairs_over_abs(c, c.x(0), 1.0));
  }});
}

}  // namespace jvpc::jvp_rules
