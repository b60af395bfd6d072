// The safety contracts of the loadable ops (op_contracts.h): one row per family of ops.
#include "ir/op_contracts.h"
#include "ir/checked_math.h"
#include "ir/op.h"

#include "ir/ops.h"

#include <ATen/ATen.h>
#include <c10/core/Contiguity.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

namespace {

using W = Workspace;

constexpr int64_t kMaxBytes = std::numeric_limits<int64_t>::max();

// arange, arange.start, arange.start_step: LibTorch computes the length in int64 where the
// result is integral, as (end - start + step - sign(step)) / step from the numbers truncated to
// int64, which traps (SIGFPE) where the truncated step is 0 (0.5) or the quotient overflows, and
// in double otherwise.
std::string arange_check(const Arg* start, const Arg* end, const Arg* step, const Arg& dtype) {
  auto value = [](const Arg* a, double dflt) { return a && a->number() ? *a->number() : dflt; };
  double s = value(start, 0), e = value(end, 0), st = value(step, 1);
  if (!std::isfinite(s) || !std::isfinite(e) || !std::isfinite(st)) return "start, end and step must be finite";
  if (st == 0) return "step must not be 0";
  if (std::fabs((e - s) / st) > 0x1p62) return "more than 2^62 elements";
  auto is_int = [](const Arg* a) { return !a || a->kind == ArgKind::Int; };
  bool integral = dtype.kind == ArgKind::ScalarType
                      ? c10::isIntegralType(static_cast<c10::ScalarType>(dtype.value.toInt()), /*includeBool=*/true)
                      : is_int(start) && is_int(end) && is_int(step);
  if (!integral) return "";
  auto truncated = [](double d) { return std::fabs(d) < 0x1p62 ? static_cast<int64_t>(d) : int64_t{0}; };
  int64_t si = truncated(s), ei = truncated(e), sti = truncated(st), r = 0;
  if (std::fabs(s) >= 0x1p62 || std::fabs(e) >= 0x1p62 || std::fabs(st) >= 0x1p62)
    return "start, end and step must be below 2^62 for an integral result";
  if (sti == 0) return "step must not be 0 as an integer (the result is integral)";
  if (__builtin_sub_overflow(ei, si, &r) || __builtin_add_overflow(r, sti, &r) ||
      __builtin_sub_overflow(r, sti > 0 ? 1 : -1, &r))
    return "start, end and step overflow 64-bit integers";
  return "";
}
std::string arange_end(const std::vector<Arg>& a, const std::vector<TensorMeta>&) {
  return arange_check(nullptr, &a.at(0), nullptr, a.at(1));
}
std::string arange_start(const std::vector<Arg>& a, const std::vector<TensorMeta>&) {
  return arange_check(&a.at(0), &a.at(1), nullptr, a.at(2));
}
std::string arange_start_step(const std::vector<Arg>& a, const std::vector<TensorMeta>&) {
  return arange_check(&a.at(0), &a.at(1), &a.at(2), a.at(3));
}

// reflection_pad{1,2,3}d, replication_pad{1,2,3}d: reflection_pad3d's Meta kernel reads 6
// entries of the padding list unchecked (a shorter list read past its end: SIGSEGV; found by the
// fuzzer); the others say so in LibTorch's words.
template <int k>
std::string padding_of(const std::vector<Arg>& a, const std::vector<TensorMeta>&) {
  if (a.at(1).kind != ArgKind::Ints || a.at(1).value.toIntVector().size() != 2 * k)
    return "padding size is expected to be " + std::to_string(2 * k);
  return "";
}

// avg_pool2d/3d, max_pool2d/3d_with_indices and their backward: the kernels, Meta kernels
// included, narrow windows, strides, paddings and dilations to int, and one past its range throws
// a std::runtime_error rather than a c10::Error (found by the fuzzer).
std::string window_ints(const std::vector<Arg>& a, const std::vector<TensorMeta>&) {
  for (const Arg& arg : a)
    if (arg.kind == ArgKind::Ints)
      for (int64_t v : arg.value.toIntVector())
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          return "window, stride, padding and dilation must fit in 32-bit integers";
  return "";
}

// _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
// include_last_offset, padding_idx) and its _forward_only twin, beyond what their shape rule
// checks (found by the fuzzer): indices of two dims in the max mode crash the CPU kernel
// (SIGSEGV), and so does one offset with include_last_offset (no bag: heap corruption).
std::string embedding_bag_arguments(const std::vector<Arg>& a, const std::vector<TensorMeta>& operands) {
  auto meta = [&](size_t i) -> const TensorMeta* {
    return a.at(i).kind == ArgKind::Tensor ? &operands.at(static_cast<size_t>(a[i].operands[0])) : nullptr;
  };
  const TensorMeta *indices = meta(1), *offsets = meta(2);
  bool max_mode = a.at(4).kind == ArgKind::Int && a[4].value.toInt() == 2;
  if (max_mode && indices && indices->sizes.size() != 1) return "indices must have 1 dim in mode 2 (max)";
  if (a.at(7).kind == ArgKind::Bool && a[7].value.toBool() && offsets && offsets->sizes.size() == 1 &&
      offsets->sizes[0] == 1)
    return "include_last_offset needs two offsets or more (one bag)";
  return "";
}

// random.from with no `to` into a floating-point tensor: LibTorch rounds `from` to the dtype by
// computing from + 1, and from = 2^63 - 1 overflows there into a loop that never ends (found by
// the fuzzer).
std::string random_from(const std::vector<Arg>& a, const std::vector<TensorMeta>&) {
  if (a.at(1).kind == ArgKind::Int && a[1].value.toInt() == std::numeric_limits<int64_t>::max())
    return "from must be below 2^63 - 1";
  return "";
}

const std::unordered_map<std::string, OpContract>& contracts() {
  static const std::unordered_map<std::string, OpContract> table = [] {
    std::unordered_map<std::string, OpContract> t;
    auto each = [&](std::initializer_list<Op> ops, const OpContract& c) {
      for (Op op : ops) t.emplace(op, c);
    };
    // Elementwise ops, comparisons and reductions built on TensorIterator: no index arguments,
    // and they read broadcast (stride-0) operands in place.
    each({ops::abs, ops::acos, ops::acosh, ops::add_Scalar, ops::add_Tensor, ops::addcdiv, ops::addcmul, ops::angle,
          ops::asin, ops::asinh, ops::atan, ops::atan2, ops::atanh, ops::bitwise_and_Tensor, ops::bitwise_not,
          ops::bitwise_or_Tensor, ops::ceil, ops::celu, ops::clamp, ops::clamp_Tensor, ops::clamp_max,
          ops::clamp_max_Tensor, ops::clamp_min, ops::clamp_min_Tensor, ops::copysign_Scalar, ops::copysign_Tensor,
          ops::cos, ops::cosh, ops::deg2rad, ops::digamma, ops::div_Scalar, ops::div_Tensor, ops::div_Tensor_mode,
          ops::elu, ops::elu_backward, ops::eq_Scalar, ops::eq_Tensor, ops::erf, ops::erfc, ops::erfinv, ops::exp,
          ops::exp2, ops::expm1, ops::floor, ops::fmax, ops::fmin, ops::fmod_Scalar, ops::fmod_Tensor, ops::frac,
          ops::frexp_Tensor, ops::ge_Scalar, ops::ge_Tensor, ops::gelu, ops::gelu_backward, ops::glu, ops::gt_Scalar,
          ops::gt_Tensor, ops::hardshrink, ops::hardshrink_backward, ops::hardsigmoid, ops::hardsigmoid_backward,
          ops::hardswish, ops::hardswish_backward, ops::hardtanh, ops::hardtanh_backward, ops::huber_loss_backward,
          ops::hypot, ops::i0, ops::ldexp_Tensor, ops::le_Scalar, ops::le_Tensor, ops::leaky_relu,
          ops::leaky_relu_backward, ops::lerp_Scalar, ops::lerp_Tensor, ops::lgamma, ops::log, ops::log10, ops::log1p,
          ops::log2, ops::log_sigmoid_backward, ops::log_sigmoid_forward, ops::logaddexp, ops::logaddexp2, ops::logit,
          ops::logit_backward, ops::lt_Scalar, ops::lt_Tensor, ops::masked_fill_Scalar, ops::masked_fill_Tensor,
          ops::maximum, ops::minimum, ops::mish, ops::mish_backward, ops::mul_Scalar, ops::mul_Tensor, ops::nan_to_num,
          ops::ne_Scalar, ops::ne_Tensor, ops::neg, ops::polygamma, ops::pow_Scalar, ops::pow_Tensor_Scalar,
          ops::pow_Tensor_Tensor, ops::_prelu_kernel, ops::rad2deg, ops::reciprocal, ops::relu, ops::remainder_Scalar,
          ops::remainder_Scalar_Tensor, ops::remainder_Tensor, ops::round, ops::rsqrt, ops::rsub_Scalar,
          ops::rsub_Tensor, ops::sgn, ops::sigmoid, ops::sign, ops::silu, ops::silu_backward, ops::sin, ops::sinh,
          ops::smooth_l1_loss_backward, ops::softplus, ops::softplus_backward, ops::softshrink,
          ops::softshrink_backward, ops::special_i1, ops::special_log_ndtr, ops::special_ndtri, ops::special_xlog1py,
          ops::special_xlog1py_other_scalar, ops::special_xlog1py_self_scalar, ops::sqrt, ops::sub_Scalar,
          ops::sub_Tensor, ops::tan, ops::tanh, ops::threshold, ops::trunc, ops::where_ScalarOther,
          ops::where_ScalarSelf, ops::where_self, ops::xlogy_Tensor,
          // reductions
          ops::amax, ops::amin, ops::max, ops::max_dim, ops::mean, ops::mean_dim, ops::min, ops::min_dim, ops::nansum,
          ops::norm_Scalar, ops::norm_ScalarOpt_dim, ops::linalg_vector_norm, ops::prod, ops::prod_dim_int,
          ops::std_correction, ops::std_mean_correction, ops::sum, ops::sum_dim_IntList, ops::var_correction,
          ops::var_mean_correction},
         {});
    // Random ops: elementwise draws into a tensor shaped as their first operand (TensorIterator),
    // whose parameters (probabilities, ranges) LibTorch checks; dropout is one draw and a product.
    each({ops::bernoulli, ops::bernoulli_p, ops::bernoulli_Tensor, ops::cauchy, ops::exponential, ops::geometric,
          ops::log_normal, ops::native_dropout, ops::normal_functional, ops::rand_like, ops::randn_like, ops::random,
          ops::random_from, ops::random_to, ops::uniform},
         {});
    // Factories and copies: their results are sized by their arguments and counted as outputs.
    // Uninitialized allocations are zeroed by the runtime (runtime/executable.h).
    each({ops::_conj_physical,
          ops::_to_copy,
          ops::alias_copy,
          ops::arange,
          ops::arange_start,
          ops::arange_start_step,
          ops::block_diag,
          ops::cat,
          ops::clone,
          ops::constant_pad_nd,
          ops::diag_embed,
          ops::diagonal_copy,
          ops::empty_memory_format,
          ops::empty_like,
          ops::empty_strided,
          ops::expand_copy,
          ops::eye,
          ops::eye_m,
          ops::fill_Scalar,
          ops::flip,
          ops::full,
          ops::full_like,
          ops::narrow_copy,
          ops::new_empty,
          ops::new_full,
          ops::new_ones,
          ops::new_zeros,
          ops::ones,
          ops::ones_like,
          ops::permute_copy,
          ops::repeat,
          ops::roll,
          ops::scalar_tensor,
          ops::select_copy_int,
          ops::slice_copy_Tensor,
          ops::stack,
          ops::transpose_copy_int,
          ops::zero,
          ops::zeros,
          ops::zeros_like},
         {});
    // Storage-relative: as_strided's offset is into the storage; copy and the scatters into
    // views clone self's whole storage.
    each({ops::as_strided, ops::copy, ops::diagonal_scatter, ops::select_scatter, ops::slice_scatter}, {{}, true});
    // Kernels that make their operands contiguous (matmuls, linear algebra, FFT, convolution,
    // pooling, resampling, normalization, softmax, padding, sorting, scans, shuffles, attention).
    each({ops::_fft_c2c,
          ops::_fft_c2r,
          ops::_fft_r2c,
          ops::_fused_rms_norm,
          ops::_linalg_det,
          ops::_linalg_eigh,
          ops::_linalg_slogdet,
          ops::_linalg_solve_ex,
          ops::_linalg_svd,
          ops::_log_softmax,
          ops::_safe_softmax,
          ops::_scaled_dot_product_cudnn_attention,
          ops::_scaled_dot_product_efficient_attention,
          ops::_scaled_dot_product_flash_attention,
          ops::_scaled_dot_product_flash_attention_for_cpu,
          ops::_softmax,
          ops::_softmax_backward_data,
          ops::adaptive_max_pool2d,
          ops::adaptive_max_pool3d,
          ops::addbmm,
          ops::addmm,
          ops::addmv,
          ops::addr,
          ops::affine_grid_generator,
          ops::baddbmm,
          ops::bmm,
          ops::cholesky,
          ops::cholesky_inverse,
          ops::cholesky_solve,
          ops::convolution,
          ops::cudnn_batch_norm,
          ops::cudnn_grid_sampler,
          ops::cummax,
          ops::cummin,
          ops::cumprod,
          ops::cumsum,
          ops::dot,
          ops::grid_sampler_2d,
          ops::grid_sampler_2d_backward,
          ops::grid_sampler_3d,
          ops::grid_sampler_3d_backward,
          ops::linalg_cholesky_ex,
          ops::linalg_cross,
          ops::linalg_inv_ex,
          ops::linalg_lstsq,
          ops::linalg_lu,
          ops::linalg_lu_factor_ex,
          ops::linalg_matrix_exp,
          ops::linalg_pinv_atol_rtol_tensor,
          ops::linalg_qr,
          ops::linalg_solve_triangular,
          ops::logcumsumexp,
          ops::masked_scatter,
          ops::masked_select,
          ops::max_pool2d_with_indices,
          ops::max_pool3d_with_indices,
          ops::mm,
          ops::mv,
          ops::native_batch_norm,
          ops::_native_batch_norm_legit_functional,
          ops::native_group_norm,
          ops::native_layer_norm,
          ops::pixel_shuffle,
          ops::pixel_unshuffle,
          ops::trace,
          ops::tril,
          ops::triu,
          ops::vdot,
          ops::jvpc_attention_tangent,
          ops::jvpc_attention_tangent_batched},
         {{}, false, W::DenseOperands});
    for (Op op : Op::all())  // pooling by averages, resampling and padding
      if (op.has(kSampleWise)) each({op}, {{}, false, W::DenseOperands});
    // Elementwise terms as large as the broadcast operands before a reduction, or a copy of the
    // input to sort or select in.
    each({ops::_cdist_forward, ops::_euclidean_dist, ops::binary_cross_entropy, ops::binary_cross_entropy_backward,
          ops::binary_cross_entropy_with_logits, ops::dist, ops::huber_loss, ops::kthvalue, ops::logsumexp, ops::median,
          ops::median_dim, ops::mode, ops::mse_loss, ops::nanmedian, ops::nanmedian_dim, ops::smooth_l1_loss, ops::sort,
          ops::sort_stable, ops::topk},
         {{}, false, W::BroadcastTerms});
    t.emplace(ops::mvlgamma, OpContract{{}, false, W::Mvlgamma});
    for (Op op : {ops::reflection_pad1d, ops::replication_pad1d}) t[op].arguments = padding_of<1>;
    for (Op op : {ops::reflection_pad2d, ops::replication_pad2d}) t[op].arguments = padding_of<2>;
    for (Op op : {ops::reflection_pad3d, ops::replication_pad3d}) t[op].arguments = padding_of<3>;
    t[ops::arange].arguments = arange_end;
    t[ops::arange_start].arguments = arange_start;
    t[ops::arange_start_step].arguments = arange_start_step;
    t.emplace(ops::_trilinear, OpContract{{}, false, W::Trilinear});

    // Index arguments.
    auto indexed = [&](std::initializer_list<Op> ops, std::vector<IndexArg> args) {
      for (Op op : ops) t.emplace(op, OpContract{args, false, W::DenseOperands});
    };
    indexed({ops::gather, ops::scatter_src, ops::scatter_value, ops::scatter_add, ops::scatter_reduce_two,
             ops::index_select, ops::index_add, ops::index_copy},
            {{"index", "self", IndexRange::Dim, "dim"}});
    indexed({ops::index_fill_int_Scalar, ops::index_fill_int_Tensor},
            {{"index", "self", IndexRange::Dim, "dim", /*wraps=*/true}});
    indexed({ops::index_Tensor, ops::index_put}, {{"indices", "self", IndexRange::IndexList}});
    indexed({ops::embedding}, {{"indices", "weight", IndexRange::Dim}});
    indexed({ops::_embedding_bag, ops::_embedding_bag_forward_only},
            {{"indices", "weight", IndexRange::Dim}, {"offsets", "indices", IndexRange::Offsets}});
    for (Op op : {ops::_embedding_bag, ops::_embedding_bag_forward_only}) t[op].arguments = embedding_bag_arguments;
    indexed({ops::max_pool2d_with_indices_backward}, {{"indices", "self", IndexRange::Plane, nullptr, false, 2}});
    indexed({ops::max_pool3d_with_indices_backward}, {{"indices", "self", IndexRange::Plane, nullptr, false, 3}});
    indexed({ops::lu_unpack}, {{"LU_pivots", "LU_data", IndexRange::Pivots}});
    indexed({ops::linalg_lu_solve}, {{"pivots", "LU", IndexRange::Pivots}});
    indexed({ops::nll_loss_forward, ops::nll_loss2d_forward}, {{"target", "self", IndexRange::Classes}});
    // Arguments, for ops whose row is above (t.at: a typo is an exception, not a new row).
    for (Op op : {ops::avg_pool2d, ops::avg_pool3d, ops::max_pool2d_with_indices, ops::max_pool3d_with_indices,
                  ops::max_pool2d_with_indices_backward, ops::max_pool3d_with_indices_backward})
      t.at(op).arguments = window_ints;
    t.at(ops::random_from).arguments = random_from;
    return t;
  }();
  return table;
}

// Views (by their schema: a return that aliases an input, unwritten) index nothing and allocate
// nothing, and LibTorch keeps them inside the tensor they view, all but as_strided (above).
const OpContract kView{};

int arg_index(const c10::FunctionSchema& s, const char* name) {
  auto i = s.argumentIndexWithName(name);
  if (!i) throw Error(std::string("contract names no argument '") + name + "' of " + s.name());
  return static_cast<int>(*i);
}

// [lo, hi] of an integer tensor, read to the host in one transfer; none when it is empty.
std::optional<std::pair<int64_t, int64_t>> extremes(const at::Tensor& t) {
  if (t.numel() == 0) return std::nullopt;
  auto [lo, hi] = at::aminmax(t);
  at::Tensor both = at::stack({lo.to(at::kLong), hi.to(at::kLong)}).cpu();
  return std::make_pair(both[0].item<int64_t>(), both[1].item<int64_t>());
}

// Indices this check reads: integers with data (a float or Meta tensor is the kernel's to refuse,
// or, at load time, a value not known yet).
bool readable_indices(const at::Tensor& t) {
  return !t.is_meta() && c10::isIntegralType(t.scalar_type(), /*includeBool=*/false);
}

const at::Tensor* tensor_at(const torch::jit::Stack& stack, int i) {
  const c10::IValue& v = stack.at(static_cast<size_t>(i));
  return v.isTensor() && v.toTensor().defined() ? &v.toTensor() : nullptr;
}

std::unordered_set<std::string>& hidden() {  // detail::WithoutContract
  static std::unordered_set<std::string> ops;
  return ops;
}

}  // namespace

const OpContract* op_contract(const std::string& op) {
  if (!hidden().empty() && hidden().count(op)) return nullptr;
  auto it = contracts().find(op);
  if (it != contracts().end()) return &it->second;
  try {
    if (op_info(op).is_view) return &kView;
  } catch (const Error&) {}
  return nullptr;
}

std::vector<std::string> ops_with_written_contracts() {
  std::vector<std::string> ops;
  for (const auto& [op, c] : contracts()) ops.push_back(op);
  return ops;
}

detail::WithoutContract::WithoutContract(std::string op) : op_(std::move(op)) { hidden().insert(op_); }
detail::WithoutContract::~WithoutContract() { hidden().erase(op_); }

void check_arguments(const std::string& op, const std::vector<Arg>& args, const std::vector<TensorMeta>& operands) {
  auto it = contracts().find(op);
  if (it == contracts().end() || !it->second.arguments) return;
  std::string why = it->second.arguments(args, operands);
  if (!why.empty()) throw Error(op + ": " + why);
}

void check_index_arguments(c10::function_ref<std::string()> where, const Node& n, const torch::jit::Stack& stack) {
  const OpContract* c = op_contract(n.op());
  if (!c || c->indices.empty()) return;
  const c10::FunctionSchema& s = op_info(n.op()).schema();
  for (const IndexArg& a : c->indices) {
    int ii = arg_index(s, a.index), oi = arg_index(s, a.of);
    const at::Tensor* of = tensor_at(stack, oi);
    if (!of) continue;
    auto refuse = [&](const std::string& what, int64_t lo, int64_t hi) {
      throw Error(where() + ": " + what + " holds an index out of range [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + ")");
    };
    auto check = [&](const std::string& what, const at::Tensor& idx, int64_t lo, int64_t hi) {
      if (!readable_indices(idx)) return;
      auto e = extremes(idx);
      if (e && (e->first < lo || e->second >= hi)) refuse(what, lo, hi);
    };
    if (a.range == IndexRange::IndexList) {
      const c10::IValue& list = stack.at(static_cast<size_t>(ii));
      if (!list.isList()) continue;
      int64_t d = 0;
      auto items = list.toListRef();
      for (size_t k = 0; k < items.size(); ++k) {
        const c10::IValue& item = items[k];
        if (!item.isTensor() || !item.toTensor().defined()) {
          ++d;
          continue;
        }
        const at::Tensor& idx = item.toTensor();
        if (idx.scalar_type() == at::kBool || idx.scalar_type() == at::kByte) {  // a mask: its dims
          d += idx.dim();
          continue;
        }
        if (d >= of->dim()) return;  // too many indices: the kernel refuses them
        int64_t size = of->size(d);
        check("argument '" + std::string(a.index) + "' entry " + std::to_string(k), idx, -size, size);
        ++d;
      }
      continue;
    }
    const at::Tensor* idx = tensor_at(stack, ii);
    if (!idx) continue;
    std::string what = std::string("argument '") + a.index + "'";
    switch (a.range) {
      case IndexRange::Dim: {
        int64_t rank = std::max<int64_t>(of->dim(), 1);
        int64_t dim = a.dim ? stack.at(static_cast<size_t>(arg_index(s, a.dim))).toInt() : 0;
        if (dim < -rank || dim >= rank) continue;  // the kernel refuses it
        if (dim < 0) dim += rank;
        int64_t size = of->dim() == 0 ? 1 : of->size(dim);
        check(what, *idx, a.wraps ? -size : 0, size);
        break;
      }
      case IndexRange::Plane: {
        if (of->dim() < a.trailing) continue;  // the kernel refuses it
        int64_t plane = 1;
        for (int64_t d = of->dim() - a.trailing; d < of->dim(); ++d) plane *= of->size(d);
        check(what, *idx, 0, plane);
        break;
      }
      case IndexRange::Offsets: {
        int64_t n_indices = of->numel();
        check(what, *idx, 0, n_indices + 1);
        if (readable_indices(*idx) && idx->numel() > 0 && idx->reshape({-1})[0].item<int64_t>() != 0)
          throw Error(where() + ": " + what + " must start at 0");
        if (readable_indices(*idx) && idx->dim() == 1 && idx->numel() > 1 &&
            !at::all(idx->slice(0, 1) >= idx->slice(0, 0, -1)).item<bool>())
          throw Error(where() + ": " + what + " decrease (offsets into the indices must not)");
        break;
      }
      case IndexRange::Pivots: {
        if (of->dim() < 2) continue;  // the kernel refuses it
        check(what, *idx, 1, of->size(-2) + 1);
        break;
      }
      case IndexRange::Classes: {
        int64_t classes = of->dim() == 1 ? of->size(0) : of->dim() > 1 ? of->size(1) : 1;
        int64_t ignore = stack.at(static_cast<size_t>(arg_index(s, "ignore_index"))).toInt();
        if (!readable_indices(*idx)) continue;
        auto e = extremes(idx->masked_fill(*idx == ignore, 0));
        if (e && (e->first < 0 || e->second >= classes))
          throw Error(where() + ": argument '" + a.index + "' holds a class out of range [0, " +
                      std::to_string(classes) + ") that is not its ignore_index");
        break;
      }
      case IndexRange::IndexList:
        break;
    }
  }
}

int64_t workspace_bytes(const Node& n) {
  const OpContract* c = op_contract(n.op());
  if (!c || c->workspace == Workspace::None) return 0;
  auto add = checked::add_saturating;  // kMaxBytes where it overflows
  auto mul = checked::mul_saturating;
  int64_t bytes = 0;
  // Operands a kernel makes dense: those with gaps, repeats (stride 0) or overlap.
  for (const Value* v : n.inputs()) {
    const TensorMeta& m = v->meta();
    if (m.numel() > 1 && !c10::_compute_non_overlapping_and_dense<int64_t>(m.sizes, m.strides))
      bytes = add(bytes, m.nbytes());
  }
  if (c->workspace == Workspace::BroadcastTerms) {
    // Two terms as large as the broadcast of the operands, in the widest operand type.
    int64_t numel = 1, item = 1;
    std::vector<int64_t> shape;
    for (const Value* v : n.inputs()) {
      const TensorMeta& m = v->meta();
      item = std::max<int64_t>(item, static_cast<int64_t>(c10::elementSize(m.dtype)));
      try {
        shape = at::infer_size(shape, m.sizes);
      } catch (const c10::Error&) {  // not broadcastable (cdist): the larger operand
        if (m.numel() > numel) shape = m.sizes;
      }
      numel = 1;
      for (int64_t s : shape) numel = mul(numel, s);
    }
    bytes = add(bytes, mul(mul(2, numel), item));
  }
  if (c->workspace == Workspace::Trilinear && n.inputs().size() == 3) {
    // _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim)
    std::vector<int64_t> shape;
    int64_t item = 1;
    for (size_t k = 0; k < 3; ++k) {
      const TensorMeta& m = n.input(k)->meta();
      item = std::max<int64_t>(item, static_cast<int64_t>(c10::elementSize(m.dtype)));
      std::vector<int64_t> sizes = m.sizes;
      std::vector<int64_t> expand = n.arg(3 + k).value.toIntVector();
      std::sort(expand.begin(), expand.end());
      for (int64_t d : expand)
        if (d >= 0 && d <= static_cast<int64_t>(sizes.size())) sizes.insert(sizes.begin() + d, 1);
      if (shape.size() < sizes.size()) shape.resize(sizes.size(), 1);
      for (size_t d = 0; d < sizes.size(); ++d) shape[d] = std::max(shape[d], sizes[d]);
    }
    int64_t numel = 1;
    for (int64_t s : shape) numel = mul(numel, s);
    bytes = add(bytes, mul(mul(2, numel), item));
  }
  if (c->workspace == Workspace::Mvlgamma && !n.inputs().empty()) {
    const TensorMeta& m = n.input(0)->meta();
    int64_t p = n.arg(1).value.toInt();
    bytes = add(bytes, mul(mul(2, m.nbytes()), std::max<int64_t>(p, 1)));
  }
  return bytes;
}

}  // namespace jvpc
