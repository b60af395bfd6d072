// Batching rules of elementwise ops: broadcasting carries the K axis. A batched operand is
// padded with size-1 dims after K up to the output's rank; an unbatched one (a residual, a
// mask) broadcasts against it as it is, so it is read once per call, never expanded K times.
#include "passes/batch_rules/rules.h"
#include "ir/op.h"

namespace jvpc::batch_rules {

namespace {

// _softmax_backward_data(g, y, dim, dtype) = y·(g − Σ_dim g·y): written out, so that y (a
// residual) broadcasts against the K tangents rather than being expanded for the kernel.
std::vector<Value*> softmax_backward(Ctx& c) {
  int64_t rank = c.rank(0), dim = Ctx::dim(c.c(2).toInt(), rank);
  c10::ScalarType dtype = static_cast<c10::ScalarType>(c.c(3).toInt());
  Value* g = c.batched(0) ? c.pad_to(c.x(0), rank) : c.broadcast(c.x(0));
  Value* y = c.batched(1) ? c.pad_to(c.x(1), rank) : c.x(1);
  Value* gy = c.call(ops::mul_Tensor, {g, y});
  Value* s = c.call(ops::sum_dim_IntList, {gy, std::vector<int64_t>{dim}, true});
  Value* r = c.call(ops::addcmul, {gy, y, s, -1.0});  // gy − y·s in one pass
  if (r->meta().dtype != dtype) r = c.call(ops::_to_copy, {r, dtype});
  return {r};
}

// masked_fill.Tensor(self, mask, value): a batched 0-dim value is a per-tangent scalar, which the
// kernel does not take: where(mask, value, self) with the value padded.
std::vector<Value*> masked_fill_tensor(Ctx& c) {
  if (!c.batched(2)) return pointwise()(c);
  int64_t rank = static_cast<int64_t>(c.n.output(0)->meta().sizes.size());
  Value* self = c.batched(0) ? c.pad_to(c.x(0), rank) : c.x(0);
  Value* value = c.pad_to(c.x(2), rank);
  if (value->meta().dtype != self->meta().dtype) value = c.call(ops::_to_copy, {value, self->meta().dtype});
  Value* r = c.call(ops::where_self, {c.x(1), value, self});
  if (r->meta().sizes.front() != c.K || r->meta().sizes.size() != static_cast<size_t>(rank) + 1)
    r = c.call(ops::expand, {r, [&] {
                               std::vector<int64_t> s = c.n.output(0)->meta().sizes;
                               s.insert(s.begin(), c.K);
                               return s;
                             }()});
  return {r};
}

}  // namespace

void register_elementwise(Registry& r) {
  for (Op op : {
           // arithmetic
           ops::add_Tensor,
           ops::sub_Tensor,
           ops::mul_Tensor,
           ops::div_Tensor,
           ops::div_Tensor_mode,
           ops::add_Scalar,
           ops::sub_Scalar,
           ops::mul_Scalar,
           ops::div_Scalar,
           ops::rsub_Scalar,
           ops::rsub_Tensor,
           ops::neg,
           ops::addcmul,
           ops::addcdiv,
           ops::lerp_Scalar,
           ops::lerp_Tensor,
           ops::true_divide_Tensor,
           ops::square,
           ops::reciprocal,
           ops::pow_Tensor_Scalar,
           ops::pow_Tensor_Tensor,
           ops::pow_Scalar,
           // selection by masks and conversions
           ops::where_self,
           ops::where_ScalarOther,
           ops::where_ScalarSelf,
           ops::where_Scalar,
           ops::masked_fill_Scalar,
           ops::_to_copy,
           ops::clone,
           ops::alias_copy,
           ops::copy,
           ops::type_as,
           ops::clamp,
           ops::clamp_min,
           ops::clamp_max,
           ops::fill_Scalar,
           ops::zero,
           ops::zeros_like,
           ops::ones_like,
           ops::full_like,
           ops::empty_like,
           ops::fill_Tensor,
           // unary math (on tangents only where a rule applies it to one: linear ones, sign-like)
           ops::abs,
           ops::sgn,
           ops::sign,
           ops::exp,
           ops::log,
           ops::sin,
           ops::cos,
           ops::tanh,
           ops::sigmoid,
           ops::sqrt,
           ops::rsqrt,
           ops::sinh,
           ops::cosh,
           // complex parts (elementwise on the complex values)
           ops::conj,
           ops::_conj,
           ops::conj_physical,
           ops::_conj_physical,
           ops::resolve_conj,
           ops::resolve_neg,
           ops::_neg_view,
           ops::real,
           ops::imag,
           ops::complex,
           ops::polar,
           ops::angle,
           // backward kernels of activations (grad, self or result, ...): elementwise in each
           ops::threshold_backward,
           ops::elu_backward,
           ops::leaky_relu_backward,
           ops::hardtanh_backward,
           ops::log_sigmoid_backward,
           ops::gelu_backward,
           ops::silu_backward,
           ops::sigmoid_backward,
           ops::tanh_backward,
           ops::binary_cross_entropy_backward,
           ops::hardsigmoid_backward,
           ops::hardswish_backward,
           ops::softplus_backward,
           ops::mish_backward,
           ops::softshrink_backward,
           ops::hardshrink_backward,
       })
    r.add(op, pointwise());
  // view_as_real / view_as_complex act on the last dim (added or removed), K stays leading.
  r.add(ops::view_as_real, same_op());
  r.add(ops::view_as_complex, same_op());
  r.add(ops::_softmax_backward_data, softmax_backward);
  r.add(ops::masked_fill_Tensor, masked_fill_tensor);
}

}  // namespace jvpc::batch_rules
