// Shape rules for kernels without a C++ Meta kernel in LibTorch 2.11: where, _safe_softmax and
// the math path of attention, reductions, losses, pooling, padding, im2col, embeddings,
// indexing, layer, group and batch norm, convolution, linear-algebra solvers and the fused
// attention kernels; and for native_group_norm, whose C++ fallback fails on channels-last inputs.
// One named function per op or family, registered in one table (shape_rules()).
//
// Where a sibling op with a Meta kernel computes the same output shape (a reduction's from sum
// or max.dim, an elementwise op's from add or sub), the rule runs it on Meta tensors, so that
// LibTorch's own checks and messages apply; LibTorch's shape-check helpers (Pool.h,
// im2col_shape_check.h, GridSamplerUtils.h) do the same for pooling and friends.
// The formulas left mirror the CPU kernels' allocations (sizes, dtype, and the layout where
// practical); the CUDA-only kernels' mirror torch/_meta_registrations.py of 2.11.
#include "ir/shape_rules.h"
#include "ir/checked_math.h"
#include "ir/op.h"

#include "ir/ops.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/GridSamplerUtils.h>
#include <ATen/native/Pool.h>
#include <ATen/native/im2col_shape_check.h>
#include <c10/core/ScalarTypeToTypeMeta.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <climits>
#include <numeric>

namespace jvpc::detail {

TensorMeta absent_return() {
  TensorMeta m;
  m.dtype = c10::ScalarType::Undefined;
  return m;
}

namespace {

/// A rule's view of its arguments: operands as Meta tensors, constants by kind.
struct Call {
  const std::vector<Arg>& a;
  const std::vector<TensorMeta>& in;

  const TensorMeta& meta(size_t i) const {
    if (i >= a.size() || a[i].kind != ArgKind::Tensor)
      throw Error("argument " + std::to_string(i) + " must be a tensor");
    return in.at(static_cast<size_t>(a[i].operands.at(0)));
  }
  at::Tensor t(size_t i) const { return on_meta(meta(i)); }
  bool given(size_t i) const { return a.at(i).kind != ArgKind::None; }
  std::optional<at::Tensor> opt(size_t i) const { return given(i) ? std::optional<at::Tensor>(t(i)) : std::nullopt; }
  int64_t i64(size_t i) const { return a.at(i).value.toInt(); }
  double f64(size_t i) const { return a.at(i).value.toDouble(); }
  bool flag(size_t i) const { return a.at(i).value.toBool(); }
  c10::Scalar scalar(size_t i) const { return a.at(i).value.toScalar(); }
  std::vector<int64_t> ints(size_t i) const { return a.at(i).value.toIntVector(); }
  std::optional<std::vector<int64_t>> opt_ints(size_t i) const {
    return given(i) ? std::optional<std::vector<int64_t>>(ints(i)) : std::nullopt;
  }
  std::optional<c10::ScalarType> dtype(size_t i) const {
    if (!given(i)) return std::nullopt;
    int64_t v = i64(i);
    if (v < 0 || v >= static_cast<int64_t>(c10::ScalarType::NumOptions))
      throw Error("argument " + std::to_string(i) + " is not a dtype");
    return static_cast<c10::ScalarType>(v);
  }
  /// The device of the results: operand 0's.
  c10::Device device() const { return in.empty() ? c10::Device(c10::kCPU) : in.at(0).device; }
  /// The metadata of a Meta tensor the rule made, on the results' device.
  TensorMeta out(const at::Tensor& meta) const {
    TensorMeta m = TensorMeta::of(meta);
    m.device = device();
    return m;
  }
  TensorMeta contiguous(std::vector<int64_t> sizes, c10::ScalarType dtype) const {
    return TensorMeta::contiguous(std::move(sizes), dtype, device());
  }
};

using Rule = std::vector<TensorMeta> (*)(const Call&);
using Metas = std::vector<TensorMeta>;

at::OptionalIntArrayRef opt_ref(const std::optional<std::vector<int64_t>>& v) {
  return v ? at::OptionalIntArrayRef(*v) : std::nullopt;
}

c10::ScalarType default_float() { return c10::typeMetaToScalarType(at::get_default_dtype()); }

/// An int argument that a LibTorch check helper takes as `int`.
int as_int(int64_t v, const char* what) {
  TORCH_CHECK(v >= INT_MIN && v <= INT_MAX, what, " out of range: ", v);
  return static_cast<int>(v);
}

/// The result of a loss of elementwise `loss` under `reduction` (1 mean, 2 sum; anything else
/// none), as apply_loss_reduction does it.
TensorMeta reduce_loss(const Call& c, const at::Tensor& loss, int64_t reduction) {
  return reduction == 1 || reduction == 2 ? c.contiguous({}, loss.scalar_type()) : c.out(loss);
}

// --- Reductions -------------------------------------------------------------------------------

// std/var.correction(self, dim, correction, keepdim): sum's sizes; complex operands give real results.
Metas std_var(const Call& c) {
  at::Tensor x = c.t(0);
  TORCH_CHECK(at::isFloatingType(x.scalar_type()) || at::isComplexType(x.scalar_type()),
              "std and var only support floating point and complex dtypes");
  at::Tensor r = at::sum(x, opt_ref(c.opt_ints(1)), c.flag(3), x.scalar_type());
  return {c.contiguous(r.sizes().vec(), c10::toRealValueType(x.scalar_type()))};
}

// std_mean/var_mean.correction: (std or var, mean), the mean in the operand's dtype.
Metas std_var_mean(const Call& c) {
  Metas out = std_var(c);
  out.push_back(c.contiguous(out[0].sizes, c.meta(0).dtype));
  return out;
}

// nansum(self, dim, keepdim, dtype): sum's sizes and dtype (integers sum to int64).
Metas nansum(const Call& c) {
  at::Tensor x = c.t(0);
  TORCH_CHECK(!at::isComplexType(x.scalar_type()), "nansum does not support complex inputs");
  return {c.out(at::sum(x, opt_ref(c.opt_ints(1)), c.flag(2), c.dtype(3)))};
}

// prod(self, dtype): a 0-dim result of sum's dtype.
Metas prod(const Call& c) { return {c.out(at::sum(c.t(0), std::nullopt, false, c.dtype(1)))}; }

// logsumexp(self, dim, keepdim): sum's sizes; integer operands give the default float dtype.
Metas logsumexp(const Call& c) {
  at::Tensor x = c.t(0);
  auto dims = c.ints(1);
  TORCH_CHECK(!dims.empty() || x.dim() == 0, "logsumexp: dim must not be empty for a tensor of ", x.dim(), " dims");
  at::Tensor r = at::sum(x, dims, c.flag(2), x.scalar_type());
  auto dtype = at::isIntegralType(x.scalar_type(), /*includeBool=*/true) ? default_float() : x.scalar_type();
  return {c.contiguous(r.sizes().vec(), dtype)};
}

// median(self), nanmedian(self): 0-dim of self's dtype (NaN for an empty self).
Metas full_median(const Call& c) { return {c.contiguous({}, c.meta(0).dtype)}; }

// max(self), min(self): amax over all dims (which refuses an empty operand, as max does).
Metas full_extremum(const Call& c) { return {c.out(at::amax(c.t(0), {}, false))}; }

// trace(self): 0-dim; integers sum to int64.
Metas trace(const Call& c) {
  at::Tensor x = c.t(0);
  TORCH_CHECK(x.dim() == 2, "trace: expected a matrix, but got tensor with dim ", x.dim());
  auto dtype = at::isIntegralType(x.scalar_type(), /*includeBool=*/true) ? c10::kLong : x.scalar_type();
  return {c.contiguous({}, dtype)};
}

// (values, indices) of a reduction along one dim (median.dim, nanmedian.dim, mode: dim and
// keepdim are arguments 1 and 2): max.dim's.
Metas values_indices_at(const Call& c, size_t dim_arg) {
  auto [values, indices] = at::max(c.t(0), c.i64(dim_arg), c.flag(dim_arg + 1));
  return {c.out(values), c.out(indices)};
}
Metas values_indices(const Call& c) { return values_indices_at(c, 1); }

// cummax/cummin(self, dim): (values, indices) of self's sizes, contiguous; the indices int64.
Metas cumulative_extremum(const Call& c) {
  at::Tensor x = c.t(0);
  c10::maybe_wrap_dim(c.i64(1), x.dim());
  return {c.contiguous(x.sizes().vec(), x.scalar_type()), c.contiguous(x.sizes().vec(), c10::kLong)};
}

// kthvalue(self, k, dim, keepdim): max.dim's, with k in range.
Metas kthvalue(const Call& c) {
  at::Tensor x = c.t(0);
  int64_t dim = c10::maybe_wrap_dim(c.i64(2), x.dim()), k = c.i64(1);
  int64_t size = x.dim() == 0 ? 1 : x.size(dim);
  TORCH_CHECK(k >= 1 && k <= size, "kthvalue(): selected number k out of range for dimension ", dim);
  return values_indices_at(c, 2);
}

// --- Elementwise ------------------------------------------------------------------------------

/// A result of operand i's sizes, dtype and dense layout (empty_like, preserve format).
TensorMeta like_operand(const Call& c, size_t i) { return c.out(at::empty_like(c.t(i), at::MemoryFormat::Preserve)); }

void check_floating(const at::Tensor& x, const char* op) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": expected a floating-point input, got ", x.scalar_type());
}

// frexp.Tensor(self): (mantissa, exponent) laid out as self, the exponent int32; floating only.
Metas frexp(const Call& c) {
  at::Tensor x = c.t(0);
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "torch.frexp() only supports floating-point dtypes");
  return {like_operand(c, 0), c.out(at::empty_like(x, x.options().dtype(c10::kInt), at::MemoryFormat::Preserve))};
}

// max_pool3d_with_indices_backward(grad_output, self, ...): laid out as self.
Metas like_operand_1(const Call& c) { return {like_operand(c, 1)}; }

// hardswish(self): floating point only.
Metas hardswish(const Call& c) {
  check_floating(c.t(0), "hardswish");
  return {like_operand(c, 0)};
}

// nan_to_num(self, nan, posinf, neginf): any dtype.
Metas nan_to_num(const Call& c) { return {like_operand(c, 0)}; }

// hardtanh(self, min_val, max_val): the operand's dtype (no promotion by the bounds).
Metas hardtanh(const Call& c) {
  TORCH_CHECK(c.meta(0).dtype != c10::kBool, "Bool inputs not supported for hardtanh");
  return {like_operand(c, 0)};
}

// log_sigmoid_forward(self) -> (output, buffer), contiguous: the CPU kernel fills a buffer of
// the operand's shape, the CUDA one returns it empty.
Metas log_sigmoid_forward(const Call& c) {
  const TensorMeta& x = c.meta(0);
  check_floating(c.t(0), "log_sigmoid");
  TensorMeta buffer = c.contiguous(c.device().is_cpu() ? x.sizes : std::vector<int64_t>{0}, x.dtype);
  return {c.contiguous(x.sizes, x.dtype), buffer};
}

// logit(self, eps): sigmoid's (a unary float op: integers give the default float dtype).
Metas logit(const Call& c) { return {c.out(at::sigmoid(c.t(0)))}; }

// logcumsumexp(self, dim): contiguous, of the operand's shape.
Metas logcumsumexp(const Call& c) {
  at::Tensor x = c.t(0);
  c10::maybe_wrap_dim(c.i64(1), x.dim());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()) || at::isComplexType(x.scalar_type()),
              "logcumsumexp: expected a floating-point or complex input, got ", x.scalar_type());
  return {c.contiguous(x.sizes().vec(), x.scalar_type())};
}

// _prelu_kernel(self, weight): mul's broadcast and layout; both of one dtype.
Metas prelu_kernel(const Call& c) {
  at::Tensor x = c.t(0), w = c.t(1);
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "Found dtype ", w.scalar_type(), " but expected ", x.scalar_type());
  return {c.out(at::mul(x, w))};
}

// rsub.Tensor(self, other, alpha) = sub(other, self, alpha).
Metas rsub(const Call& c) { return {c.out(at::sub(c.t(1), c.t(0), c.scalar(2)))}; }

// remainder.Scalar_Tensor(self, other): remainder of the scalar as a wrapped number.
Metas remainder_scalar_tensor(const Call& c) {
  at::Tensor s = c10::scalar_to_tensor(c.scalar(0), c10::Device(c10::kMeta));
  s.unsafeGetTensorImpl()->set_wrapped_number(true);
  return {c.out(at::remainder(s, c.t(1)))};
}

// channel_shuffle(self, groups): the operand's shape in its suggested memory format.
Metas channel_shuffle(const Call& c) {
  at::Tensor x = c.t(0);
  int64_t groups = c.i64(1);
  TORCH_CHECK(groups > 0, "Number of groups to divide channels in must be positive. Value of groups:", groups);
  TORCH_CHECK(x.dim() > 2, "channel_shuffle expects input to have at least 3 dimensions, but got input with sizes ",
              x.sizes());
  TORCH_CHECK(x.size(1) % groups == 0, "Number of channels must be divisible by groups. Got ", x.size(1),
              " channels and ", groups, " groups.");
  return {c.out(at::empty(x.sizes(), x.options().memory_format(x.suggest_memory_format())))};
}

// --- Losses -----------------------------------------------------------------------------------

// binary_cross_entropy(self, target, weight, reduction): target and weight broadcast into the
// input's shape.
Metas binary_cross_entropy(const Call& c) {
  at::Tensor x = c.t(0), y = c.t(1);
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), "Found dtype ", y.scalar_type(), " but expected ", x.scalar_type());
  at::Tensor loss = at::empty_like(x);
  loss.add_(y);
  if (auto w = c.opt(2)) loss.mul_(*w);
  return {reduce_loss(c, loss, c.i64(3))};
}

// binary_cross_entropy_with_logits(self, target, weight, pos_weight, reduction): the composite
// kernel's own steps, log_sigmoid (which has no Meta kernel) replaced by a tensor like the input.
Metas binary_cross_entropy_with_logits(const Call& c) {
  at::Tensor x = c.t(0), y = c.t(1);
  check_floating(x, "binary_cross_entropy_with_logits");
  at::Tensor log_sigmoid = at::empty_like(x);
  if (auto pos_weight = c.opt(3)) log_sigmoid.mul_((*pos_weight - 1).mul(y).add_(1));
  at::Tensor loss = (1 - y).mul_(x).sub_(log_sigmoid);
  if (auto w = c.opt(2)) loss.mul_(*w);
  return {reduce_loss(c, loss, c.i64(4))};
}

// huber_loss(self, target, reduction, delta): sub's broadcast and layout, in the input's dtype.
Metas huber_loss(const Call& c) {
  at::Tensor x = c.t(0), y = c.t(1);
  TORCH_CHECK(c.f64(3) > 0, "huber_loss does not support non-positive values for delta.");
  at::Tensor loss = at::sub(x, y);
  if (c.i64(2) == 1 || c.i64(2) == 2) return {c.contiguous({}, x.scalar_type())};
  TensorMeta m = c.out(loss);
  m.dtype = x.scalar_type();
  return {m};
}

// nll_loss2d_forward(self [N,C,H,W], target [N,H,W], weight, reduction, ignore_index) ->
// (output: [N,H,W] without reduction, else 0-dim; total_weight: 0-dim).
Metas nll_loss2d_forward(const Call& c) {
  at::Tensor x = c.t(0), target = c.t(1);
  auto w = c.opt(2);
  TORCH_CHECK(target.dim() == 3,
              "only batches of spatial targets supported (3D tensors) but got targets of dimension: ", target.dim());
  TORCH_CHECK(x.dim() == 4,
              "only batches of spatial inputs supported (4D tensors), but got input of dimension: ", x.dim());
  TORCH_CHECK(!w || w->numel() == x.size(1), "weight tensor should be defined either for all or no classes");
  TORCH_CHECK(x.size(0) == target.size(0) && x.size(2) == target.size(1) && x.size(3) == target.size(2),
              "input and target batch or spatial sizes don't match: target ", target.sizes(), ", input ", x.sizes());
  TensorMeta output = c.i64(3) == 0 ? c.contiguous({x.size(0), x.size(2), x.size(3)}, x.scalar_type())
                                    : c.contiguous({}, x.scalar_type());
  return {output, c.contiguous({}, x.scalar_type())};
}

// --- Linear algebra ---------------------------------------------------------------------------

// addbmm(self, batch1, batch2, beta, alpha): [n, p], bmm's checks; self broadcasts to it.
Metas addbmm(const Call& c) {
  at::Tensor self = c.t(0), b1 = c.t(1), b2 = c.t(2);
  at::bmm(b1, b2);
  std::vector<int64_t> sizes = {b1.size(1), b2.size(2)};
  self.expand(sizes);
  TORCH_CHECK(self.scalar_type() == b1.scalar_type(), "self and batch1 must have the same dtype, but got ",
              self.scalar_type(), " and ", b1.scalar_type());
  return {c.contiguous(sizes, self.scalar_type())};
}

// cholesky(self, upper), cholesky_inverse(self, upper): linalg_cholesky_ex's factor (square
// matrices, batched column-major).
Metas cholesky(const Call& c) {
  auto [factor, info] = at::linalg_cholesky_ex(c.t(0), c.flag(1), false);
  return {c.out(factor)};
}

// _cdist_forward(x1 [..., r1, m], x2 [..., r2, m], p, compute_mode): [broadcast batch, r1, r2].
Metas cdist_forward(const Call& c) {
  at::Tensor x1 = c.t(0), x2 = c.t(1);
  TORCH_CHECK(x1.dim() >= 2, "cdist only supports at least 2D tensors, X1 got: ", x1.dim(), "D");
  TORCH_CHECK(x2.dim() >= 2, "cdist only supports at least 2D tensors, X2 got: ", x2.dim(), "D");
  TORCH_CHECK(x1.size(-1) == x2.size(-1), "X1 and X2 must have the same number of columns. X1: ", x1.size(-1),
              " X2: ", x2.size(-1));
  TORCH_CHECK(at::isFloatingType(x1.scalar_type()),
              "cdist only supports floating-point dtypes, X1 got: ", x1.scalar_type());
  TORCH_CHECK(x1.scalar_type() == x2.scalar_type(), "cdist: X1 and X2 must have the same dtype, got ", x1.scalar_type(),
              " and ", x2.scalar_type());
  TORCH_CHECK(c.f64(2) >= 0, "cdist only supports non-negative p values");
  TORCH_CHECK(!c.given(3) || (c.i64(3) >= 0 && c.i64(3) <= 2), "possible modes: None, 0, 1, 2, but was: ", c.i64(3));
  auto sizes = at::infer_size(x1.sizes().slice(0, x1.dim() - 2), x2.sizes().slice(0, x2.dim() - 2));
  sizes.push_back(x1.size(-2));
  sizes.push_back(x2.size(-2));
  return {c.contiguous(sizes, x1.scalar_type())};
}

// --- Pooling, padding, im2col -----------------------------------------------------------------

// _adaptive_avg_pool{2,3}d(self, output_size): the leading dims and output_size; the 2-d
// kernel keeps the operand's memory format, the 3-d one is contiguous.
template <int kDims>
Metas adaptive_avg_pool(const Call& c) {
  at::Tensor x = c.t(0);
  auto size = c.ints(1);
  const char* name = kDims == 2 ? "adaptive_avg_pool2d" : "adaptive_avg_pool3d";
  TORCH_CHECK(size.size() == kDims, name, ": output_size must be ", kDims);
  for (int64_t s : size)
    TORCH_CHECK(s >= 0, name, ": elements of output_size must be greater than or equal to 0, got ", s);
  TORCH_CHECK(x.dim() == kDims + 1 || x.dim() == kDims + 2, name, "(): Expected ", kDims + 1, "D or ", kDims + 2,
              "D tensor, but got ", x.sizes());
  for (int64_t i = 1; i < x.dim(); ++i)
    TORCH_CHECK(x.size(i) > 0, name,
                "(): Expected input to have non-zero size for non-batch dimensions, but input has sizes ", x.sizes(),
                " with dimension ", i, " being empty");
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end() - kDims);
  sizes.insert(sizes.end(), size.begin(), size.end());
  auto format = kDims == 2 ? x.suggest_memory_format() : at::MemoryFormat::Contiguous;
  return {c.out(at::empty(sizes, x.options().memory_format(format)))};
}

// max_pool3d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode) -> (out,
// indices): Pool.h's output shape and checks; a 5-d operand's memory format is kept.
Metas max_pool3d_with_indices(const Call& c) {
  at::Tensor x = c.t(0);
  auto k = c.ints(1), s = c.ints(2), p = c.ints(3), d = c.ints(4);
  bool ceil_mode = c.flag(5);
  TORCH_CHECK(k.size() == 1 || k.size() == 3,
              "max_pool3d: kernel_size must either be a single int, or a tuple of three ints");
  TORCH_CHECK(s.empty() || s.size() == 1 || s.size() == 3,
              "max_pool3d: stride must either be omitted, a single int, or a tuple of three ints");
  TORCH_CHECK(p.size() == 1 || p.size() == 3,
              "max_pool3d: padding must either be a single int, or a tuple of three ints");
  TORCH_CHECK(d.size() == 1 || d.size() == 3,
              "max_pool3d: dilation must be either a single int, or a tuple of three ints");
  TORCH_CHECK(x.dim() == 4 || x.dim() == 5, "non-empty 4D or 5D (batch mode) tensor expected for input");
  if (s.empty()) s = k;
  auto pick = [](const std::vector<int64_t>& v, size_t i, const char* what) {
    return as_int(v.size() == 1 ? v[0] : v[i], what);
  };
  int kT = pick(k, 0, "kernel_size"), kH = pick(k, 1, "kernel_size"), kW = pick(k, 2, "kernel_size");
  int dT = pick(s, 0, "stride"), dH = pick(s, 1, "stride"), dW = pick(s, 2, "stride");
  int pT = pick(p, 0, "padding"), pH = pick(p, 1, "padding"), pW = pick(p, 2, "padding");
  int lT = pick(d, 0, "dilation"), lH = pick(d, 1, "dilation"), lW = pick(d, 2, "dilation");
  int64_t slices = x.size(-4), it = x.size(-3), ih = x.size(-2), iw = x.size(-1);
  TORCH_CHECK(kT > 0 && kH > 0 && kW > 0 && dT > 0 && dH > 0 && dW > 0 && lT > 0 && lH > 0 && lW > 0,
              "max_pool3d: kernel size, stride and dilation must be positive");
  int64_t ot = at::native::pooling_output_shape<int64_t>(it, kT, pT, dT, lT, ceil_mode);
  int64_t oh = at::native::pooling_output_shape<int64_t>(ih, kH, pH, dH, lH, ceil_mode);
  int64_t ow = at::native::pooling_output_shape<int64_t>(iw, kW, pW, dW, lW, ceil_mode);
  at::native::pool3d_shape_check(x, slices, kT, kH, kW, dT, dH, dW, pT, pH, pW, lT, lH, lW, it, ih, iw, ot, oh, ow,
                                 "max_pool3d_with_indices()");
  std::vector<int64_t> sizes = {slices, ot, oh, ow};
  if (x.dim() == 5) sizes.insert(sizes.begin(), x.size(0));
  auto format = x.dim() == 5 ? x.suggest_memory_format() : at::MemoryFormat::Contiguous;
  return {c.out(at::empty(sizes, x.options().memory_format(format))),
          c.out(at::empty(sizes, x.options().dtype(c10::kLong).memory_format(format)))};
}

// reflection_pad2d(self, padding [l, r, t, b]): each pad less than its dim; a 4-d operand's
// memory format is kept. The padding's length is its contract's to check (op_contracts.cpp).
Metas reflection_pad2d(const Call& c) {
  at::Tensor x = c.t(0);
  auto pad = c.ints(1);
  bool batched = x.dim() == 4, valid = batched || x.dim() == 3;
  for (int64_t d = batched ? 1 : 0; valid && d < x.dim(); ++d) valid = x.size(d) != 0;  // an empty batch only
  TORCH_CHECK(valid,
              "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero "
              "dimensions for input, but got: ",
              x.sizes());
  int64_t dim_h = x.dim() - 2, dim_w = x.dim() - 1, ih = x.size(dim_h), iw = x.size(dim_w);
  TORCH_CHECK(pad[0] < iw && pad[1] < iw,
              "Argument #4: Padding size should be less than the corresponding input dimension, but got: padding (",
              pad[0], ", ", pad[1], ") at dimension ", dim_w, " of input ", x.sizes());
  TORCH_CHECK(pad[2] < ih && pad[3] < ih,
              "Argument #6: Padding size should be less than the corresponding input dimension, but got: padding (",
              pad[2], ", ", pad[3], ") at dimension ", dim_h, " of input ", x.sizes());
  int64_t oh = ih + pad[2] + pad[3], ow = iw + pad[0] + pad[1];
  TORCH_CHECK(oh >= 1 && ow >= 1, "input (H: ", ih, ", W: ", iw, ") is too small. Calculated output H: ", oh,
              " W: ", ow);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[dim_h] = oh;
  sizes[dim_w] = ow;
  auto format = x.dim() == 4 ? x.suggest_memory_format() : at::MemoryFormat::Contiguous;
  return {c.out(at::empty(sizes, x.options().memory_format(format)))};
}

/// A pair argument of im2col/col2im, each entry in int range (as the kernels' loops take them).
std::array<int64_t, 2> pair(const Call& c, size_t i, const char* name) {
  auto v = c.ints(i);
  TORCH_CHECK(v.size() == 2, "It is expected ", name, " equals to 2, but got size ", v.size());
  return {as_int(v[0], name), as_int(v[1], name)};
}

int64_t checked_mul(int64_t a, int64_t b) {
  std::optional<int64_t> r = checked::mul(a, b);
  TORCH_CHECK(r.has_value(), "size overflows int64");
  return *r;
}

// im2col(self [N?, C, H, W], kernel_size, dilation, padding, stride) -> [N?, C*kH*kW, L].
Metas im2col(const Call& c) {
  at::Tensor x = c.t(0);
  auto [kh, kw] = pair(c, 1, "kernel_size");
  auto [dh, dw] = pair(c, 2, "dilation");
  auto [ph, pw] = pair(c, 3, "padding");
  auto [sh, sw] = pair(c, 4, "stride");
  at::native::im2col_shape_check(x, at::Tensor(), kh, kw, dh, dw, ph, pw, sh, sw);
  bool batched = x.dim() == 4;
  int64_t ch = x.size(-3), ih = x.size(-2), iw = x.size(-1);
  int64_t oh = (ih + 2 * ph - (dh * (kh - 1) + 1)) / sh + 1, ow = (iw + 2 * pw - (dw * (kw - 1) + 1)) / sw + 1;
  std::vector<int64_t> sizes = {checked_mul(checked_mul(ch, kh), kw), checked_mul(oh, ow)};
  if (batched) sizes.insert(sizes.begin(), x.size(0));
  return {c.contiguous(sizes, x.scalar_type())};
}

// col2im(self [N?, C*kH*kW, L], output_size, kernel_size, dilation, padding, stride) -> [N?, C, oH, oW].
Metas col2im(const Call& c) {
  at::Tensor x = c.t(0);
  auto [oh, ow] = pair(c, 1, "output_size");
  auto [kh, kw] = pair(c, 2, "kernel_size");
  auto [dh, dw] = pair(c, 3, "dilation");
  auto [ph, pw] = pair(c, 4, "padding");
  auto [sh, sw] = pair(c, 5, "stride");
  at::native::col2im_shape_check(x, at::Tensor(), oh, ow, kh, kw, dh, dw, ph, pw, sh, sw);
  bool batched = x.dim() == 3;
  std::vector<int64_t> sizes = {x.size(-2) / (kh * kw), oh, ow};
  if (batched) sizes.insert(sizes.begin(), x.size(0));
  return {c.contiguous(sizes, x.scalar_type())};
}

// grid_sampler_{2,3}d(input [N,C,spatial], grid [N,out spatial,k], ...) and
// cudnn_grid_sampler(input, grid): [N, C, out spatial], contiguous, GridSamplerUtils.h's checks.
template <int kDims>
Metas grid_sampler(const Call& c) {
  at::Tensor x = c.t(0), grid = c.t(1);
  TORCH_CHECK(x.dim() >= 1 && grid.dim() >= 1, "grid_sampler(): expected ", kDims + 2, "D input and grid");
  at::native::check_grid_sampler_common(x, grid);
  if (kDims == 2)
    at::native::check_grid_sampler_2d(x, grid);
  else
    at::native::check_grid_sampler_3d(x, grid, c.i64(2));
  TORCH_CHECK(x.scalar_type() == grid.scalar_type(), "expected scalar type ", x.scalar_type(), " but found ",
              grid.scalar_type());
  std::vector<int64_t> sizes = {x.size(0), x.size(1)};
  for (int i = 1; i <= kDims; ++i) sizes.push_back(grid.size(i));
  return {c.contiguous(sizes, x.scalar_type())};
}

// --- Embeddings and indexing ------------------------------------------------------------------

bool is_index_dtype(c10::ScalarType t) { return t == c10::kLong || t == c10::kInt; }

// embedding(weight [n, D], indices, ...): indices' sizes + [D], contiguous.
Metas embedding(const Call& c) {
  at::Tensor w = c.t(0), idx = c.t(1);
  TORCH_CHECK(w.dim() == 2, "'weight' must be 2-D");
  TORCH_CHECK(is_index_dtype(idx.scalar_type()), "embedding(): Expected dtype int64 or int32 for indices, got ",
              idx.scalar_type());
  std::vector<int64_t> sizes = idx.sizes().vec();
  sizes.push_back(w.size(1));
  return {c.contiguous(sizes, w.scalar_type())};
}

// _embedding_bag[_forward_only](weight, indices, offsets, scale_grad_by_freq, mode, sparse,
// per_sample_weights, include_last_offset, padding_idx) -> (output [bags, D], offset2bag,
// bag_size, max_indices). On the CPU offset2bag is empty on the fast path of a sum, and the
// index outputs take the offsets' dtype; elsewhere the indices'.
Metas embedding_bag(const Call& c) {
  at::Tensor w = c.t(0), idx = c.t(1), offsets = c.t(2);
  int64_t mode = c.i64(4), padding_idx = c.i64(8);
  auto psw = c.opt(6);
  TORCH_CHECK(is_index_dtype(idx.scalar_type()), "expected indices to be long or int, got ", idx.scalar_type());
  TORCH_CHECK(is_index_dtype(offsets.scalar_type()), "expected offsets to be long or int, got ", offsets.scalar_type());
  TORCH_CHECK(at::isFloatingType(w.scalar_type()), "expected weight to be floating point type, got ", w.scalar_type());
  TORCH_CHECK(w.dim() == 2, "embedding_bag: weight must be 2-D, got ", w.dim(), "-D");
  TORCH_CHECK(idx.dim() == 1 || idx.dim() == 2, "input has to be a 1D or 2D Tensor, but got Tensor of dimension ",
              idx.dim());
  TORCH_CHECK(offsets.dim() == 1, "offsets has to be a 1D Tensor, but got Tensor of dimension ", offsets.dim());
  TORCH_CHECK(mode >= 0 && mode <= 2, "embedding_bag: mode must be 0 (sum), 1 (mean) or 2 (max), got ", mode);
  int64_t bags = offsets.size(0);
  if (c.flag(7)) {
    TORCH_CHECK(bags >= 1, "include_last_offset: numBags should be at least 1");
    --bags;
  }
  if (psw) {
    TORCH_CHECK(mode == 0, "embedding_bag: per_sample_weights only supported with mode='sum'");
    TORCH_CHECK(psw->dim() == 1, "expected per_sample_weights to be 1D tensor, got ", psw->dim(), "D");
    TORCH_CHECK(psw->numel() == idx.numel(), "expected per_sample_weights.numel() (", psw->numel(),
                ") to be the same as indices.numel() (", idx.numel(), ")");
  }
  int64_t d = w.size(1), n = idx.size(0);
  TensorMeta output = c.contiguous({bags, d}, w.scalar_type());
  if (!c.device().is_cpu()) {
    auto t = idx.scalar_type();
    return {output, c.contiguous({n}, t), c.contiguous({offsets.size(0)}, t),
            c.contiguous(mode == 2 ? std::vector<int64_t>{bags, d} : std::vector<int64_t>{0}, t)};
  }
  auto wt = w.scalar_type();
  bool fast = (wt == c10::kFloat || wt == c10::kHalf || wt == c10::kBFloat16) && w.stride(1) == 1 && padding_idx < 0 &&
              (!psw || psw->stride(0) == 1);
  auto t = offsets.scalar_type();
  return {output, c.contiguous({mode == 0 && fast ? 0 : n}, t), c.contiguous({bags}, t),
          c.contiguous(mode == 2 ? std::vector<int64_t>{bags, d} : std::vector<int64_t>{bags}, t)};
}

// index.Tensor(self, indices): the Meta kernel's, where each boolean (or uint8) mask of k dims
// stands for k int64 indices of the mask's numel: an upper bound on the count of its true
// elements, which the result's shape depends on (value_dependent_shape).
Metas index_tensor(const Call& c) {
  at::Tensor x = c.t(0);
  const Arg& list = c.a.at(1);
  if (list.kind != ArgKind::OptTensorList && list.kind != ArgKind::TensorList)
    throw Error("indices must be a list of tensors");
  c10::List<std::optional<at::Tensor>> indices;
  int64_t dim = 0;
  for (int o : list.operands) {
    if (o < 0) {
      indices.push_back(std::nullopt);
      ++dim;
      continue;
    }
    at::Tensor i = on_meta(c.in.at(static_cast<size_t>(o)));
    if (i.scalar_type() != c10::kBool && i.scalar_type() != c10::kByte) {
      indices.push_back(i);
      ++dim;
      continue;
    }
    TORCH_CHECK(i.dim() > 0, "index: a 0-dim boolean index is not supported");
    for (int64_t k = 0; k < i.dim(); ++k)
      TORCH_CHECK(dim + k < x.dim() && i.size(k) == x.size(dim + k), "The shape of the mask ", i.sizes(), " at index ",
                  k, " does not match the shape of the indexed tensor ", x.sizes(), " at index ", dim + k);
    for (int64_t k = 0; k < i.dim(); ++k) indices.push_back(at::empty({i.numel()}, i.options().dtype(c10::kLong)));
    dim += i.dim();
  }
  return {c.out(at::index(x, indices))};
}

// masked_select(self, mask): 1-d, as long as the broadcast of self and mask (an upper bound on
// the count of true mask elements: value_dependent_shape).
Metas masked_select(const Call& c) {
  at::Tensor x = c.t(0), mask = c.t(1);
  TORCH_CHECK(mask.scalar_type() == c10::kBool, "masked_select: expected BoolTensor for mask");
  auto sizes = at::infer_size(x.sizes(), mask.sizes());
  return {c.contiguous({c.contiguous(sizes, x.scalar_type()).numel()}, x.scalar_type())};
}

// --- Normalization ----------------------------------------------------------------------------

/// Checks batch norm's operands; returns the channel count.
int64_t batch_norm_channels(const Call& c) {
  at::Tensor x = c.t(0);
  TORCH_CHECK(x.dim() >= 2, "batch_norm: expected an input of 2 or more dims, got ", x.dim());
  int64_t channels = x.size(1);
  const char* names[] = {"weight", "bias", "running_mean", "running_var"};
  for (size_t i = 1; i <= 4; ++i)
    if (auto t = c.opt(i))
      TORCH_CHECK(t->numel() == channels, names[i - 1], " should contain ", channels, " elements not ", t->numel());
  TORCH_CHECK(c.flag(5) || (c.given(3) && c.given(4)),
              "batch_norm: running_mean and running_var must be defined in evaluation mode");
  return channels;
}

// native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps) ->
// (out in the input's memory format, save_mean, save_invstd: [C] in training, else [0]). The
// statistics are float32 for a float16/bfloat16 input on CUDA, and on the CPU where a
// parameter is float32.
Metas native_batch_norm(const Call& c) {
  int64_t channels = batch_norm_channels(c);
  auto dtype = c.meta(0).dtype;
  bool mixed = false;
  for (size_t i = 1; i <= 4; ++i) mixed = mixed || (c.given(i) && c.meta(i).dtype == c10::kFloat);
  auto acc = c10::isReducedFloatingType(dtype) && (!c.device().is_cpu() || mixed) ? c10::kFloat : dtype;
  std::vector<int64_t> stat = {c.flag(5) ? channels : 0};
  at::Tensor x = c.t(0);
  return {c.out(at::empty_like(x, x.suggest_memory_format())), c.contiguous(stat, acc), c.contiguous(stat, acc)};
}

// cudnn_batch_norm(input, weight, ...) -> (out, save_mean, save_var, reserve): statistics in
// the weight's dtype, [C] in training, else [0]; the reserve (uint8) is [0] in evaluation and,
// in training, as cuDNN's workspace query says: bounded here by the input's element count
// (value_dependent_shape).
Metas cudnn_batch_norm(const Call& c) {
  int64_t channels = batch_norm_channels(c);
  bool training = c.flag(5);
  at::Tensor x = c.t(0);
  std::vector<int64_t> stat = {training ? channels : 0};
  auto wt = c.meta(1).dtype;
  return {c.out(at::empty_like(x, x.suggest_memory_format())), c.contiguous(stat, wt), c.contiguous(stat, wt),
          c.contiguous({training ? x.numel() : 0}, c10::kByte)};
}

// --- Attention --------------------------------------------------------------------------------

struct Qkv {
  at::Tensor q, k, v;
  int64_t b, h, sq, sk, dv;
};

/// Query [B,H,Sq,D], key [B,Hk,Sk,D], value [B,Hk,Sk,Dv].
Qkv attention_operands(const Call& c, const char* op) {
  Qkv a{c.t(0), c.t(1), c.t(2), 0, 0, 0, 0, 0};
  TORCH_CHECK(a.q.dim() == 4 && a.k.dim() == 4 && a.v.dim() == 4, op,
              ": query, key and value must be 4-D {B, H, T, D}");
  TORCH_CHECK(a.q.scalar_type() == a.k.scalar_type() && a.q.scalar_type() == a.v.scalar_type(), op,
              ": query, key and value must have the same dtype");
  TORCH_CHECK(a.k.size(0) == a.q.size(0) && a.v.size(0) == a.q.size(0), op,
              ": query, key and value must have the same batch size");
  TORCH_CHECK(a.k.size(2) == a.v.size(2), op, ": key and value must have the same sequence length");
  TORCH_CHECK(a.k.size(1) == a.v.size(1) && a.k.size(1) > 0 && a.q.size(1) % a.k.size(1) == 0, op,
              ": the key/value heads must be equal and divide the query heads");
  TORCH_CHECK(a.q.size(3) == a.k.size(3), op, ": query and key must have the same head size");
  a.b = a.q.size(0), a.h = a.q.size(1), a.sq = a.q.size(2), a.sk = a.k.size(2), a.dv = a.v.size(3);
  return a;
}

/// [B,H,Sq,Dv] laid out as [B,Sq,H,Dv] (flash and efficient attention).
at::Tensor bshd(const Qkv& a) { return at::empty({a.b, a.sq, a.h, a.dv}, a.q.options()).transpose(1, 2); }

// _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, attn_mask, scale)
// -> (output laid out like the query, logsumexp [B,H,Sq] laid out as [B,Sq,H]: float64 for
// float64 operands, else float32).
Metas flash_attention_cpu(const Call& c) {
  Qkv a = attention_operands(c, "scaled_dot_product_attention_flash_attention");
  TORCH_CHECK(a.dv == a.q.size(3),
              "scaled_dot_product_attention_flash_attention: Q/K/V should have the same head size");
  auto acc = a.q.scalar_type() == c10::kDouble ? c10::kDouble : c10::kFloat;
  return {c.out(at::empty_like(a.q, at::MemoryFormat::Preserve)),
          c.out(at::empty({a.b, a.sq, a.h}, a.q.options().dtype(acc)).transpose(1, 2))};
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// _scaled_dot_product_flash_attention (CUDA) -> (output, logsumexp float32 [B,H,Sq], cum_seq_q,
// cum_seq_k (undefined), max_q, max_k (ints), rng_state uint64 [2], unused uint64 [], debug_attn_mask).
Metas flash_attention(const Call& c) {
  Qkv a = attention_operands(c, "_scaled_dot_product_flash_attention");
  std::vector<int64_t> debug = {0};
  if (c.flag(5)) debug = {a.b, a.h, round_up(a.sq, 128), round_up(a.sk, 128)};
  return {c.out(bshd(a)),
          c.contiguous({a.b, a.h, a.sq}, c10::kFloat),
          absent_return(),
          absent_return(),
          absent_return(),
          absent_return(),
          c.contiguous({2}, c10::kUInt64),
          c.contiguous({}, c10::kUInt64),
          c.contiguous(debug, a.q.scalar_type())};
}

// _scaled_dot_product_efficient_attention (CUDA) -> (output, log_sumexp float32 [B,H,Sq rounded
// up to 32, or 0 without compute_log_sumexp], philox_seed, philox_offset int64 []).
Metas efficient_attention(const Call& c) {
  Qkv a = attention_operands(c, "_scaled_dot_product_efficient_attention");
  int64_t lse = c.flag(4) ? round_up(a.sq, 32) : 0;
  return {c.out(bshd(a)), c.contiguous({a.b, a.h, lse}, c10::kFloat), c.contiguous({}, c10::kLong),
          c.contiguous({}, c10::kLong)};
}

// _scaled_dot_product_cudnn_attention (CUDA) -> (output [B,H,Sq,Dv] laid out in the query's
// dim order, logsumexp float32 [B,H,Sq,1], cum_seq_q, cum_seq_k (undefined), max_q, max_k (ints),
// philox_seed, philox_offset int64 [], debug_attn_mask (undefined)).
Metas cudnn_attention(const Call& c) {
  Qkv a = attention_operands(c, "_scaled_dot_product_cudnn_attention");
  std::vector<int64_t> shape = {a.b, a.h, a.sq, a.dv};
  at::Tensor out;
  if (a.q.sizes().vec() == shape) {
    out = at::empty_like(a.q, at::MemoryFormat::Preserve);
  } else {
    std::vector<int64_t> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return a.q.stride(i) > a.q.stride(j); });
    std::vector<int64_t> permuted, back(4);
    for (size_t i = 0; i < 4; ++i) {
      permuted.push_back(shape[static_cast<size_t>(order[i])]);
      back[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
    }
    out = at::empty(permuted, a.q.options()).permute(back);
  }
  return {c.out(out),
          c.contiguous({a.b, a.h, a.sq, 1}, c10::kFloat),
          absent_return(),
          absent_return(),
          absent_return(),
          absent_return(),
          c.contiguous({}, c10::kLong),
          c.contiguous({}, c10::kLong),
          absent_return()};
}

// --- Selection, softmax, layouts, normalization, convolution, linear algebra -----------------

// These build their results on the device of the operand they follow (`like`, `on_device_of`),
// which is operand 0's for most of them.

/// A contiguous result with `sizes` and `dtype` on m's device.
TensorMeta like(const TensorMeta& m, std::vector<int64_t> sizes, c10::ScalarType dtype) {
  return TensorMeta::contiguous(std::move(sizes), dtype, m.device);
}

/// The metadata of a Meta tensor a shape rule made, on the device of `like`.
TensorMeta on_device_of(const at::Tensor& meta, const TensorMeta& like) {
  TensorMeta m = TensorMeta::of(meta);
  m.device = like.device;
  return m;
}

/// An elementwise result laid out like `x` where x is dense, as TensorIterator and empty_like
/// (preserve format) do it.
TensorMeta preserving_layout(const TensorMeta& x) {
  return on_device_of(at::empty_like(on_meta(x), at::MemoryFormat::Preserve), x);
}

/// A result of x's shape in x's suggested memory format (contiguous or channels-last).
TensorMeta preserving_format(const TensorMeta& x) {
  at::Tensor meta = on_meta(x);
  return on_device_of(at::empty(x.sizes, meta.options().memory_format(meta.suggest_memory_format())), x);
}

// where.self(condition, self, other): the broadcast shape. Type promotion as the kernel does it:
// a 0-dim operand does not widen a dimensioned one.
Metas where_self(const Call& c) {
  const auto &cond = c.meta(0), &x = c.meta(1), &y = c.meta(2);
  auto sizes = at::infer_size(at::infer_size(cond.sizes, x.sizes), y.sizes);
  return {like(x, sizes, at::result_type(on_meta(x), on_meta(y)))};
}

// where with one scalar branch (the tangent of a where with one differentiable branch).
Metas where_scalar_other(const Call& c) {
  const auto &cond = c.meta(0), &x = c.meta(1);
  return {like(x, at::infer_size(cond.sizes, x.sizes), at::result_type(on_meta(x), c.scalar(2)))};
}

Metas where_scalar(const Call& c) {
  const auto& cond = c.meta(0);
  return {like(cond, cond.sizes, at::result_type(c.scalar(1), c.scalar(2)))};
}

Metas where_scalar_self(const Call& c) {
  const auto &cond = c.meta(0), &y = c.meta(2);
  return {like(y, at::infer_size(cond.sizes, y.sizes), at::result_type(on_meta(y), c.scalar(1)))};
}

// The math path of attention (the reference for graph files with fused kernels): its composite
// runs _safe_softmax, which has no Meta kernel.
Metas attention_math(const Call& c) {
  const auto &q = c.meta(0), &k = c.meta(1), &v = c.meta(2);
  if (q.sizes.size() < 2 || k.sizes.size() < 2 || v.sizes.size() < 2) throw Error("query, key and value need 2 dims");
  auto out = q.sizes, attn = q.sizes;
  out.back() = v.sizes.back();
  attn.back() = k.sizes[k.sizes.size() - 2];
  return {like(q, out, q.dtype), like(q, attn, q.dtype)};
}

Metas safe_softmax(const Call& c) {
  const auto& x = c.meta(0);
  auto dt = c.a.size() > 2 && c.a[2].kind == ArgKind::ScalarType ? static_cast<c10::ScalarType>(c.a[2].value.toInt())
                                                                 : x.dtype;
  return {like(x, x.sizes, dt)};
}

// flip keeps the input's layout where it is dense (empty_like, preserve format).
Metas flip(const Call& c) {
  const auto& x = c.meta(0);
  for (int64_t d : c.ints(1)) c10::maybe_wrap_dim(d, static_cast<int64_t>(x.sizes.size()));
  return {preserving_layout(x)};
}

// roll's result is contiguous.
Metas roll(const Call& c) {
  const auto& x = c.meta(0);
  auto shifts = c.ints(1), dims = c.ints(2);
  if (dims.empty() ? shifts.size() != 1 : shifts.size() != dims.size())
    throw Error("shifts and dims must have the same length (or one shift and no dims)");
  for (int64_t d : dims) c10::maybe_wrap_dim(d, static_cast<int64_t>(x.sizes.size()));
  return {like(x, x.sizes, x.dtype)};
}

Metas index_select(const Call& c) {
  const auto& x = c.meta(0);
  const auto& idx = c.meta(2);
  auto sizes = x.sizes;
  int64_t dim = c10::maybe_wrap_dim(c.i64(1), static_cast<int64_t>(sizes.size()));
  // A 0-dim input is indexed as one of one element, and stays 0-dim.
  if (sizes.empty()) {
    if (idx.numel() != 1) throw Error("index_select(): index to a 0-dim tensor can have only 1 value");
    return {like(x, sizes, x.dtype)};
  }
  sizes.at(static_cast<size_t>(dim)) = idx.numel();
  return {like(x, sizes, x.dtype)};
}

Metas dot(const Call& c) {
  const auto& x = c.meta(0);
  return {like(x, {}, x.dtype)};
}

Metas mv(const Call& c) {
  const auto& m = c.meta(0);
  if (m.sizes.size() != 2) throw Error("aten::mv: the matrix must be 2-D");
  return {like(m, {m.sizes[0]}, m.dtype)};
}

// native_layer_norm(x, normalized_shape, weight, bias, eps) -> (out, mean, rstd).
Metas native_layer_norm(const Call& c) {
  const auto& x = c.meta(0);
  auto normalized = c.ints(1);
  if (normalized.size() > x.sizes.size()) throw Error("normalized_shape has more dims than the input");
  auto stat = x.sizes;
  for (size_t i = stat.size() - normalized.size(); i < stat.size(); ++i) stat[i] = 1;
  // float16/bfloat16 statistics are float32 on CUDA; the CPU kernel keeps the input's dtype
  // unless the weight or bias is of another (float32) dtype.
  auto other_dtype = [&](size_t i) { return c.a.at(i).kind == ArgKind::Tensor && c.meta(i).dtype != x.dtype; };
  bool wide = c10::isReducedFloatingType(x.dtype) && (!x.device.is_cpu() || other_dtype(2) || other_dtype(3));
  auto acc = wide ? c10::kFloat : x.dtype;
  return {like(x, x.sizes, x.dtype), like(x, stat, acc), like(x, stat, acc)};
}

// native_group_norm(x, w, b, N, C, HxW, group, eps): its composite fallback views x, which fails
// for a channels-last x; the kernel keeps x's memory format. Statistics [N, group], in x's dtype
// unless a reduced-precision x meets float32 weights (as layer norm).
Metas native_group_norm(const Call& c) {
  const auto& x = c.meta(0);
  int64_t n = c.i64(3), ch = c.i64(4), hw = c.i64(5), g = c.i64(6);
  if (x.sizes.size() < 2 || x.sizes[0] != n || x.sizes[1] != ch || n * ch * hw != x.numel() || g < 1 || ch % g != 0)
    throw Error("N, C, HxW and group do not describe the input");
  for (size_t i : {size_t{1}, size_t{2}})
    if (c.a.at(i).kind == ArgKind::Tensor && c.meta(i).sizes != std::vector<int64_t>{ch})
      throw Error("weight and bias must have C elements");
  auto other_dtype = [&](size_t i) { return c.a.at(i).kind == ArgKind::Tensor && c.meta(i).dtype != x.dtype; };
  auto acc = c10::isReducedFloatingType(x.dtype) && (other_dtype(1) || other_dtype(2)) ? c10::kFloat : x.dtype;
  std::vector<int64_t> stat = {n, g};
  return {preserving_format(x), like(x, stat, acc), like(x, stat, acc)};
}

// convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups); a list of
// one entry applies to every spatial dim. The result is channels-last when x or w is (as mkldnn
// and cuDNN choose), else contiguous.
Metas convolution(const Call& c) {
  const auto &x = c.meta(0), &w = c.meta(1);
  if (x.sizes.size() < 3 || w.sizes.size() != x.sizes.size())
    throw Error("input and weight need the same rank, 3 or more");
  size_t space = x.sizes.size() - 2;
  auto at_dim = [&](size_t arg, size_t d) {
    auto v = c.ints(arg);
    if (v.size() != 1 && v.size() != space)
      throw Error("stride, padding and dilation need 1 or " + std::to_string(space) + " entries");
    return v.size() == 1 ? v[0] : v[d];
  };
  bool transposed = c.flag(6);
  int64_t groups = c.i64(8);
  if (groups < 1) throw Error("groups must be positive");
  // Sizes in 128 bits: extreme strides, paddings and dilations overflow 64 (found by the fuzzer).
  using Wide = __int128;
  auto size = [](Wide v) {
    if (v > std::numeric_limits<int64_t>::max()) throw Error("the output's size overflows 64 bits");
    return static_cast<int64_t>(v);
  };
  std::vector<int64_t> out = {x.sizes[0], transposed ? size(Wide(w.sizes[1]) * groups) : w.sizes[0]};
  for (size_t d = 0; d < space; ++d) {
    Wide in = x.sizes[d + 2], k = w.sizes[d + 2], s = at_dim(3, d), p = at_dim(4, d), dl = at_dim(5, d);
    if (s < 1 || dl < 1 || p < 0) throw Error("stride and dilation must be positive and padding not negative");
    if (!transposed && dl * (k - 1) + 1 > in + 2 * p) throw Error("the kernel is larger than the padded input");
    Wide o =
        transposed ? (in - 1) * s - 2 * p + dl * (k - 1) + at_dim(7, d) + 1 : (in + 2 * p - dl * (k - 1) - 1) / s + 1;
    if (o < 1) throw Error("the output would have no elements along spatial dim " + std::to_string(d));
    out.push_back(size(o));
  }
  auto format = on_meta(x).suggest_memory_format();
  if (format == at::MemoryFormat::Contiguous) format = on_meta(w).suggest_memory_format();
  return {on_device_of(at::empty(out, on_meta(x).options().memory_format(format)), x)};
}

// Elementwise kernels of one operand's shape and dtype (the backward kernels read a gradient of
// the operand's shape: relu, hardtanh_backward, hardswish_backward, log_sigmoid_backward,
// binary_cross_entropy_backward, _conj_physical): the result is laid out like operand 0, as
// TensorIterator does it for a dense operand.
Metas elementwise_like_self(const Call& c) { return {preserving_layout(c.meta(0))}; }

// _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training,
// momentum, eps): native_batch_norm's results, then the new running statistics, each laid out as
// the one given (its clone, updated).
Metas native_batch_norm_functional(const Call& c) {
  TORCH_CHECK(c.given(3) && c.given(4),
              "_native_batch_norm_legit_functional: running_mean and running_var are required");
  Metas out = native_batch_norm(c);
  out.push_back(preserving_layout(c.meta(3)));
  out.push_back(preserving_layout(c.meta(4)));
  return out;
}

// native_dropout(input, p, train): (output, mask), both laid out as input, the mask boolean.
Metas native_dropout(const Call& c) {
  TensorMeta mask = preserving_layout(c.meta(0));
  mask.dtype = c10::kBool;
  return {preserving_layout(c.meta(0)), mask};
}

// abs: elementwise, and real for a complex operand.
Metas abs_real(const Call& c) {
  TensorMeta out = preserving_layout(c.meta(0));
  out.dtype = c10::toRealValueType(out.dtype);
  return {out};
}

// Kernels that allocate their result contiguous, of operand 0's shape and dtype, whatever its
// layout (smooth_l1_loss_backward, huber_loss_backward, linalg_matrix_exp, index_add; index_add's
// C++ Meta kernel also fails on an empty index).
Metas contiguous_like_self(const Call& c) {
  const auto& x = c.meta(0);
  return {like(x, x.sizes, x.dtype)};
}

// A triangular or Cholesky solve: B's matrix shape over the broadcast batch of A and B, each
// matrix column-major (as LAPACK writes it). `matrix`: the operand that is A.
Metas solve(const Call& c, size_t matrix) {
  const auto &A = c.meta(matrix), &B = c.meta(1 - matrix);
  if (A.sizes.size() < 2 || B.sizes.size() < 2)
    throw Error("the matrix and the right-hand side must be matrices or batches of them");
  auto batch = at::infer_size(c10::IntArrayRef(A.sizes).slice(0, A.sizes.size() - 2),
                              c10::IntArrayRef(B.sizes).slice(0, B.sizes.size() - 2));
  std::vector<int64_t> transposed = batch;
  transposed.insert(transposed.end(), {B.sizes.end()[-1], B.sizes.end()[-2]});
  return {on_device_of(at::empty(transposed, on_meta(B).options()).mT(), B)};
}

// linalg_solve_triangular(A, B, ...).
Metas linalg_solve_triangular(const Call& c) { return solve(c, 0); }

// cholesky_solve(B, L, upper).
Metas cholesky_solve(const Call& c) { return solve(c, 1); }

// linalg_pinv(A, atol, rtol, hermitian): [.., n, m], contiguous (in C++ the Meta path is missing).
Metas linalg_pinv(const Call& c) {
  const auto& A = c.meta(0);
  if (A.sizes.size() < 2) throw Error("the input must be a matrix or a batch of them");
  std::vector<int64_t> sizes = A.sizes;
  std::swap(sizes.end()[-1], sizes.end()[-2]);
  return {like(A, sizes, A.dtype)};
}

// linalg_lstsq(A, B, rcond, driver) -> (solution, residuals, rank, singular_values), as LAPACK
// leaves them: each solution column-major in a buffer of max(m, n) rows, narrowed to n.
// Residuals exist for m > n with a driver other than gelsy, and A of full rank, which this rule
// assumes; the graph's declared shape is trusted there (value_dependent_shape).
Metas linalg_lstsq(const Call& c) {
  const auto &A = c.meta(0), &B = c.meta(1);
  if (A.sizes.size() < 2) throw Error("the input must be a matrix or a batch of them");
  bool vector = B.sizes.size() + 1 == A.sizes.size();
  if (B.sizes.size() < (vector ? 1 : 2))
    throw Error("the right-hand side must be a vector, a matrix or a batch of them");
  int64_t m = A.sizes.end()[-2], n = A.sizes.back(), k = vector ? 1 : B.sizes.back();
  if ((vector ? B.sizes.back() : B.sizes.end()[-2]) != m) throw Error("A and B must have the same number of rows");
  auto batch = at::infer_size(c10::IntArrayRef(A.sizes).slice(0, A.sizes.size() - 2),
                              c10::IntArrayRef(B.sizes).slice(0, B.sizes.size() - (vector ? 1 : 2)));
  auto with = [&](std::vector<int64_t> tail) {
    std::vector<int64_t> s = batch;
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  };
  auto options = on_meta(A).options();
  at::Tensor X = vector ? at::empty(with({std::max(m, n)}), options).narrow(-1, 0, n)
                        : at::empty(with({k, std::max(m, n)}), options).mT().narrow(-2, 0, n);
  std::string driver =
      c.a.at(3).kind == ArgKind::None ? (A.device.is_cpu() ? "gelsy" : "gels") : c.a.at(3).value.toStringRef();
  bool residuals = m > n && driver != "gelsy", singular = driver == "gelsd" || driver == "gelss";
  return {on_device_of(X, A), like(A, residuals ? with({k}) : std::vector<int64_t>{0}, A.dtype),
          like(A, driver == "gels" ? std::vector<int64_t>{0} : batch, c10::kLong),
          like(A, singular ? with({std::min(m, n)}) : std::vector<int64_t>{0}, A.dtype)};
}

// grid_sampler_{2,3}d_backward(grad, input, grid, ..., output_mask): gradients of input and grid,
// contiguous.
Metas grid_sampler_backward(const Call& c) {
  const auto &x = c.meta(1), &grid = c.meta(2);
  return {like(x, x.sizes, x.dtype), like(grid, grid.sizes, grid.dtype)};
}

}  // namespace

namespace {

std::unordered_map<std::string, ShapeRule> make_shape_rules() {
  std::unordered_map<std::string, ShapeRule> rules;
  const std::pair<Op, Rule> table[] = {
      {ops::where_self, where_self},
      {ops::where_Scalar, where_scalar},
      {ops::where_ScalarOther, where_scalar_other},
      {ops::where_ScalarSelf, where_scalar_self},
      {ops::_scaled_dot_product_attention_math, attention_math},
      {ops::_safe_softmax, safe_softmax},
      {ops::flip, flip},
      {ops::roll, roll},
      {ops::index_select, index_select},
      {ops::dot, dot},
      {ops::vdot, dot},
      {ops::median, full_median},
      {ops::nanmedian, full_median},
      {ops::max_pool3d_with_indices_backward, like_operand_1},
      {ops::cummax, cumulative_extremum},
      {ops::cummin, cumulative_extremum},
      {ops::frexp_Tensor, frexp},
      {ops::native_dropout, native_dropout},
      {ops::_native_batch_norm_legit_functional, native_batch_norm_functional},
      {ops::mv, mv},
      {ops::native_layer_norm, native_layer_norm},
      {ops::native_group_norm, native_group_norm},
      {ops::convolution, convolution},
      {ops::relu, elementwise_like_self},
      {ops::abs, abs_real},
      {ops::hardtanh_backward, elementwise_like_self},
      {ops::hardswish_backward, elementwise_like_self},
      {ops::log_sigmoid_backward, elementwise_like_self},
      {ops::binary_cross_entropy_backward, elementwise_like_self},
      {ops::_conj_physical, elementwise_like_self},
      {ops::smooth_l1_loss_backward, contiguous_like_self},
      {ops::huber_loss_backward, contiguous_like_self},
      {ops::linalg_matrix_exp, contiguous_like_self},
      {ops::index_add, contiguous_like_self},
      {ops::linalg_solve_triangular, linalg_solve_triangular},
      {ops::cholesky_solve, cholesky_solve},
      {ops::linalg_pinv_atol_rtol_tensor, linalg_pinv},
      {ops::linalg_lstsq, linalg_lstsq},
      {ops::grid_sampler_2d_backward, grid_sampler_backward},
      {ops::grid_sampler_3d_backward, grid_sampler_backward},
      {ops::std_correction, std_var},
      {ops::var_correction, std_var},
      {ops::std_mean_correction, std_var_mean},
      {ops::var_mean_correction, std_var_mean},
      {ops::nansum, nansum},
      {ops::prod, prod},
      {ops::logsumexp, logsumexp},
      {ops::max, full_extremum},
      {ops::min, full_extremum},
      {ops::trace, trace},
      {ops::median_dim, values_indices},
      {ops::nanmedian_dim, values_indices},
      {ops::mode, values_indices},
      {ops::kthvalue, kthvalue},
      {ops::hardswish, hardswish},
      {ops::nan_to_num, nan_to_num},
      {ops::hardtanh, hardtanh},
      {ops::log_sigmoid_forward, log_sigmoid_forward},
      {ops::logit, logit},
      {ops::logcumsumexp, logcumsumexp},
      {ops::_prelu_kernel, prelu_kernel},
      {ops::rsub_Tensor, rsub},
      {ops::remainder_Scalar_Tensor, remainder_scalar_tensor},
      {ops::channel_shuffle, channel_shuffle},
      {ops::binary_cross_entropy, binary_cross_entropy},
      {ops::binary_cross_entropy_with_logits, binary_cross_entropy_with_logits},
      {ops::huber_loss, huber_loss},
      {ops::nll_loss2d_forward, nll_loss2d_forward},
      {ops::addbmm, addbmm},
      {ops::cholesky, cholesky},
      {ops::cholesky_inverse, cholesky},
      {ops::_cdist_forward, cdist_forward},
      {ops::_adaptive_avg_pool2d, adaptive_avg_pool<2>},
      {ops::_adaptive_avg_pool3d, adaptive_avg_pool<3>},
      {ops::max_pool3d_with_indices, max_pool3d_with_indices},
      {ops::reflection_pad2d, reflection_pad2d},
      {ops::im2col, im2col},
      {ops::col2im, col2im},
      {ops::grid_sampler_2d, grid_sampler<2>},
      {ops::grid_sampler_3d, grid_sampler<3>},
      {ops::cudnn_grid_sampler, grid_sampler<2>},
      {ops::embedding, embedding},
      {ops::_embedding_bag, embedding_bag},
      {ops::_embedding_bag_forward_only, embedding_bag},
      {ops::index_Tensor, index_tensor},
      {ops::masked_select, masked_select},
      {ops::native_batch_norm, native_batch_norm},
      {ops::cudnn_batch_norm, cudnn_batch_norm},
      {ops::_scaled_dot_product_flash_attention_for_cpu, flash_attention_cpu},
      {ops::_scaled_dot_product_flash_attention, flash_attention},
      {ops::_scaled_dot_product_efficient_attention, efficient_attention},
      {ops::_scaled_dot_product_cudnn_attention, cudnn_attention},
  };
  for (const auto& [name, rule] : table) {
    bool added = rules
                     .emplace(name,
                              [rule = rule](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
                                return rule(Call{a, in});
                              })
                     .second;
    TORCH_INTERNAL_ASSERT(added, name, " has two shape rules");
  }
  return rules;
}

}  // namespace

const std::unordered_map<std::string, ShapeRule>& shape_rules() {
  static const std::unordered_map<std::string, ShapeRule> rules = make_shape_rules();
  return rules;
}

}  // namespace jvpc::detail
