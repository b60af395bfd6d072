// Batching rules of elementwise ops: broadcasting carries the K axis. A batched operand is
// padded with size-1 dims after K up to the output's rank; an unbatched one (a residual, a
// mask) broadcasts against it as it is, so it is read once per call, never expanded K times.
#include "passes/batch_rules/rules.h"

namespace jvpc::batch_rules {

namespace {

// _softmax_backward_data(g, y, dim, dtype) = y·(g − Σ_dim g·y): written out, so that y (a
// residual) broadcasts against the K tangents rather than being expanded for the kernel.
std::vector<Value*> softmax_backward(Ctx& c) {
  int64_t rank = c.rank(0), dim = Ctx::dim(c.c(2).toInt(), rank);
  c10::ScalarType dtype = static_cast<c10::ScalarType>(c.c(3).toInt());
  Value* g = c.batched(0) ? c.pad_to(c.x(0), rank) : c.broadcast(c.x(0));
  Value* y = c.batched(1) ? c.pad_to(c.x(1), rank) : c.x(1);
  Value* gy = c.call("aten::mul.Tensor", {g, y});
  Value* s = c.call("aten::sum.dim_IntList", {gy, std::vector<int64_t>{dim}, true});
  Value* r = c.call("aten::addcmul", {gy, y, s, -1.0});  // gy − y·s in one pass
  if (r->meta().dtype != dtype) r = c.call("aten::_to_copy", {r, dtype});
  return {r};
}

// masked_fill.Tensor(self, mask, value): a batched 0-dim value is a per-tangent scalar, which the
// kernel does not take: where(mask, value, self) with the value padded.
std::vector<Value*> masked_fill_tensor(Ctx& c) {
  if (!c.batched(2)) return pointwise()(c);
  int64_t rank = static_cast<int64_t>(c.n.output(0)->meta().sizes.size());
  Value* self = c.batched(0) ? c.pad_to(c.x(0), rank) : c.x(0);
  Value* value = c.pad_to(c.x(2), rank);
  if (value->meta().dtype != self->meta().dtype) value = c.call("aten::_to_copy", {value, self->meta().dtype});
  Value* r = c.call("aten::where.self", {c.x(1), value, self});
  if (r->meta().sizes.front() != c.K || r->meta().sizes.size() != static_cast<size_t>(rank) + 1)
    r = c.call("aten::expand", {r, [&] {
                                  std::vector<int64_t> s = c.n.output(0)->meta().sizes;
                                  s.insert(s.begin(), c.K);
                                  return s;
                                }()});
  return {r};
}

}  // namespace

void register_elementwise(Registry& r) {
  for (const char* op : {
           // arithmetic
           "aten::add.Tensor",
           "aten::sub.Tensor",
           "aten::mul.Tensor",
           "aten::div.Tensor",
           "aten::div.Tensor_mode",
           "aten::add.Scalar",
           "aten::sub.Scalar",
           "aten::mul.Scalar",
           "aten::div.Scalar",
           "aten::rsub.Scalar",
           "aten::rsub.Tensor",
           "aten::neg",
           "aten::addcmul",
           "aten::addcdiv",
           "aten::lerp.Scalar",
           "aten::lerp.Tensor",
           "aten::true_divide.Tensor",
           "aten::square",
           "aten::reciprocal",
           "aten::pow.Tensor_Scalar",
           "aten::pow.Tensor_Tensor",
           "aten::pow.Scalar",
           // selection by masks and conversions
           "aten::where.self",
           "aten::where.ScalarOther",
           "aten::where.ScalarSelf",
           "aten::where.Scalar",
           "aten::masked_fill.Scalar",
           "aten::_to_copy",
           "aten::clone",
           "aten::alias_copy",
           "aten::copy",
           "aten::type_as",
           "aten::clamp",
           "aten::clamp_min",
           "aten::clamp_max",
           "aten::fill.Scalar",
           "aten::zero",
           "aten::zeros_like",
           "aten::ones_like",
           "aten::full_like",
           "aten::empty_like",
           "aten::fill.Tensor",
           // unary math (on tangents only where a rule applies it to one: linear ones, sign-like)
           "aten::abs",
           "aten::sgn",
           "aten::sign",
           "aten::exp",
           "aten::log",
           "aten::sin",
           "aten::cos",
           "aten::tanh",
           "aten::sigmoid",
           "aten::sqrt",
           "aten::rsqrt",
           "aten::sinh",
           "aten::cosh",
           // complex parts (elementwise on the complex values)
           "aten::conj",
           "aten::_conj",
           "aten::conj_physical",
           "aten::_conj_physical",
           "aten::resolve_conj",
           "aten::resolve_neg",
           "aten::_neg_view",
           "aten::real",
           "aten::imag",
           "aten::complex",
           "aten::polar",
           "aten::angle",
           // backward kernels of activations (grad, self or result, ...): elementwise in each
           "aten::threshold_backward",
           "aten::elu_backward",
           "aten::leaky_relu_backward",
           "aten::hardtanh_backward",
           "aten::log_sigmoid_backward",
           "aten::gelu_backward",
           "aten::silu_backward",
           "aten::sigmoid_backward",
           "aten::tanh_backward",
           "aten::binary_cross_entropy_backward",
           "aten::hardsigmoid_backward",
           "aten::hardswish_backward",
           "aten::softplus_backward",
           "aten::mish_backward",
           "aten::softshrink_backward",
           "aten::hardshrink_backward",
       })
    r.add(op, pointwise());
  // view_as_real / view_as_complex act on the last dim (added or removed), K stays leading.
  r.add("aten::view_as_real", same_op());
  r.add("aten::view_as_complex", same_op());
  r.add("aten::_softmax_backward_data", softmax_backward);
  r.add("aten::masked_fill.Tensor", masked_fill_tensor);
}

}  // namespace jvpc::batch_rules
