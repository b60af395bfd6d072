// The safety contracts of the loadable ops (op_contracts.h): one row per family of ops.
#include "ir/op_contracts.h"

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
    auto each = [&](std::initializer_list<const char*> ops, const OpContract& c) {
      for (const char* op : ops) t.emplace(op, c);
    };
    // Elementwise ops, comparisons and reductions built on TensorIterator: no index arguments,
    // and they read broadcast (stride-0) operands in place.
    each({"aten::abs", "aten::acos", "aten::acosh", "aten::add.Scalar", "aten::add.Tensor", "aten::addcdiv",
          "aten::addcmul", "aten::angle", "aten::asin", "aten::asinh", "aten::atan", "aten::atan2", "aten::atanh",
          "aten::bitwise_and.Tensor", "aten::bitwise_not", "aten::bitwise_or.Tensor", "aten::ceil", "aten::celu", "aten::clamp",
          "aten::clamp.Tensor", "aten::clamp_max", "aten::clamp_max.Tensor", "aten::clamp_min",
          "aten::clamp_min.Tensor", "aten::copysign.Scalar", "aten::copysign.Tensor", "aten::cos", "aten::cosh",
          "aten::deg2rad", "aten::digamma", "aten::div.Scalar", "aten::div.Tensor", "aten::div.Tensor_mode",
          "aten::elu", "aten::elu_backward", "aten::eq.Scalar", "aten::eq.Tensor", "aten::erf", "aten::erfc",
          "aten::erfinv", "aten::exp", "aten::exp2", "aten::expm1", "aten::floor", "aten::fmax", "aten::fmin",
          "aten::fmod.Scalar", "aten::fmod.Tensor", "aten::frac", "aten::frexp.Tensor", "aten::ge.Scalar",
          "aten::ge.Tensor", "aten::gelu", "aten::gelu_backward", "aten::glu", "aten::gt.Scalar", "aten::gt.Tensor",
          "aten::hardshrink", "aten::hardshrink_backward", "aten::hardsigmoid", "aten::hardsigmoid_backward",
          "aten::hardswish", "aten::hardswish_backward", "aten::hardtanh", "aten::hardtanh_backward",
          "aten::huber_loss_backward", "aten::hypot", "aten::i0", "aten::ldexp.Tensor", "aten::le.Scalar",
          "aten::le.Tensor", "aten::leaky_relu", "aten::leaky_relu_backward", "aten::lerp.Scalar", "aten::lerp.Tensor",
          "aten::lgamma", "aten::log", "aten::log10", "aten::log1p", "aten::log2", "aten::log_sigmoid_backward",
          "aten::log_sigmoid_forward", "aten::logaddexp", "aten::logaddexp2", "aten::logit", "aten::logit_backward",
          "aten::lt.Scalar", "aten::lt.Tensor", "aten::masked_fill.Scalar", "aten::masked_fill.Tensor", "aten::maximum",
          "aten::minimum", "aten::mish", "aten::mish_backward", "aten::mul.Scalar", "aten::mul.Tensor",
          "aten::nan_to_num", "aten::ne.Scalar", "aten::ne.Tensor", "aten::neg", "aten::polygamma", "aten::pow.Scalar",
          "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", "aten::_prelu_kernel", "aten::rad2deg",
          "aten::reciprocal", "aten::relu", "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor",
          "aten::remainder.Tensor", "aten::round", "aten::rsqrt", "aten::rsub.Scalar", "aten::rsub.Tensor", "aten::sgn",
          "aten::sigmoid", "aten::sign", "aten::silu", "aten::silu_backward", "aten::sin", "aten::sinh",
          "aten::smooth_l1_loss_backward", "aten::softplus", "aten::softplus_backward", "aten::softshrink",
          "aten::softshrink_backward", "aten::special_i1", "aten::special_log_ndtr", "aten::special_ndtri",
          "aten::special_xlog1py", "aten::special_xlog1py.other_scalar", "aten::special_xlog1py.self_scalar",
          "aten::sqrt", "aten::sub.Scalar", "aten::sub.Tensor", "aten::tan", "aten::tanh", "aten::threshold",
          "aten::trunc", "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::where.self", "aten::xlogy.Tensor",
          // reductions
          "aten::amax", "aten::amin", "aten::max", "aten::max.dim", "aten::mean", "aten::mean.dim", "aten::min",
          "aten::min.dim", "aten::nansum", "aten::norm.Scalar", "aten::norm.ScalarOpt_dim", "aten::linalg_vector_norm",
          "aten::prod", "aten::prod.dim_int", "aten::std.correction", "aten::std_mean.correction", "aten::sum",
          "aten::sum.dim_IntList", "aten::var.correction", "aten::var_mean.correction"},
         {});
    // Random ops: elementwise draws into a tensor shaped as their first operand (TensorIterator),
    // whose parameters (probabilities, ranges) LibTorch checks; dropout is one draw and a product.
    each({"aten::bernoulli", "aten::bernoulli.p", "aten::bernoulli.Tensor", "aten::cauchy", "aten::exponential",
          "aten::geometric", "aten::log_normal", "aten::native_dropout", "aten::normal.functional", "aten::rand_like",
          "aten::randn_like", "aten::random", "aten::random.from", "aten::random.to", "aten::uniform"},
         {});
    // Factories and copies: their results are sized by their arguments and counted as outputs.
    // Uninitialized allocations are zeroed by the runtime (runtime/executable.h).
    each({"aten::_conj_physical",
          "aten::_to_copy",
          "aten::alias_copy",
          "aten::arange",
          "aten::arange.start",
          "aten::arange.start_step",
          "aten::block_diag",
          "aten::cat",
          "aten::clone",
          "aten::constant_pad_nd",
          "aten::diag_embed",
          "aten::diagonal_copy",
          "aten::empty.memory_format",
          "aten::empty_like",
          "aten::empty_strided",
          "aten::expand_copy",
          "aten::eye",
          "aten::eye.m",
          "aten::fill.Scalar",
          "aten::flip",
          "aten::full",
          "aten::full_like",
          "aten::narrow_copy",
          "aten::new_empty",
          "aten::new_full",
          "aten::new_ones",
          "aten::new_zeros",
          "aten::ones",
          "aten::ones_like",
          "aten::permute_copy",
          "aten::repeat",
          "aten::roll",
          "aten::scalar_tensor",
          "aten::select_copy.int",
          "aten::slice_copy.Tensor",
          "aten::stack",
          "aten::transpose_copy.int",
          "aten::zero",
          "aten::zeros",
          "aten::zeros_like"},
         {});
    // Storage-relative: as_strided's offset is into the storage; copy and the scatters into
    // views clone self's whole storage.
    each({"aten::as_strided", "aten::copy", "aten::diagonal_scatter", "aten::select_scatter", "aten::slice_scatter"},
         {{}, true});
    // Kernels that make their operands contiguous (matmuls, linear algebra, FFT, convolution,
    // pooling, resampling, normalization, softmax, padding, sorting, scans, shuffles, attention).
    each({"aten::_adaptive_avg_pool2d",
          "aten::_adaptive_avg_pool3d",
          "aten::_fft_c2c",
          "aten::_fft_c2r",
          "aten::_fft_r2c",
          "aten::_fused_rms_norm",
          "aten::_linalg_det",
          "aten::_linalg_eigh",
          "aten::_linalg_slogdet",
          "aten::_linalg_solve_ex",
          "aten::_linalg_svd",
          "aten::_log_softmax",
          "aten::_safe_softmax",
          "aten::_scaled_dot_product_cudnn_attention",
          "aten::_scaled_dot_product_efficient_attention",
          "aten::_scaled_dot_product_flash_attention",
          "aten::_scaled_dot_product_flash_attention_for_cpu",
          "aten::_softmax",
          "aten::_softmax_backward_data",
          "aten::_upsample_bicubic2d_aa",
          "aten::_upsample_bilinear2d_aa",
          "aten::_upsample_nearest_exact1d",
          "aten::_upsample_nearest_exact2d",
          "aten::_upsample_nearest_exact3d",
          "aten::adaptive_max_pool2d",
          "aten::adaptive_max_pool3d",
          "aten::addbmm",
          "aten::addmm",
          "aten::addmv",
          "aten::addr",
          "aten::affine_grid_generator",
          "aten::avg_pool2d",
          "aten::avg_pool3d",
          "aten::baddbmm",
          "aten::bmm",
          "aten::channel_shuffle",
          "aten::cholesky",
          "aten::cholesky_inverse",
          "aten::cholesky_solve",
          "aten::col2im",
          "aten::convolution",
          "aten::cudnn_batch_norm",
          "aten::cudnn_grid_sampler",
          "aten::cummax",
          "aten::cummin",
          "aten::cumprod",
          "aten::cumsum",
          "aten::dot",
          "aten::grid_sampler_2d",
          "aten::grid_sampler_2d_backward",
          "aten::grid_sampler_3d",
          "aten::grid_sampler_3d_backward",
          "aten::im2col",
          "aten::linalg_cholesky_ex",
          "aten::linalg_cross",
          "aten::linalg_inv_ex",
          "aten::linalg_lstsq",
          "aten::linalg_lu",
          "aten::linalg_lu_factor_ex",
          "aten::linalg_matrix_exp",
          "aten::linalg_pinv.atol_rtol_tensor",
          "aten::linalg_qr",
          "aten::linalg_solve_triangular",
          "aten::logcumsumexp",
          "aten::masked_scatter",
          "aten::masked_select",
          "aten::max_pool2d_with_indices",
          "aten::max_pool3d_with_indices",
          "aten::mm",
          "aten::mv",
          "aten::native_batch_norm",
          "aten::_native_batch_norm_legit_functional",
          "aten::native_group_norm",
          "aten::native_layer_norm",
          "aten::pixel_shuffle",
          "aten::pixel_unshuffle",
          "aten::reflection_pad1d",
          "aten::reflection_pad2d",
          "aten::reflection_pad3d",
          "aten::replication_pad1d",
          "aten::replication_pad2d",
          "aten::replication_pad3d",
          "aten::trace",
          "aten::tril",
          "aten::triu",
          "aten::upsample_bicubic2d",
          "aten::upsample_bilinear2d",
          "aten::upsample_linear1d",
          "aten::upsample_nearest1d",
          "aten::upsample_nearest2d",
          "aten::upsample_nearest3d",
          "aten::upsample_trilinear3d",
          "aten::vdot",
          "jvpc::attention_tangent",
          "jvpc::attention_tangent.batched"},
         {{}, false, W::DenseOperands});
    // Elementwise terms as large as the broadcast operands before a reduction, or a copy of the
    // input to sort or select in.
    each({"aten::_cdist_forward", "aten::_euclidean_dist", "aten::binary_cross_entropy",
          "aten::binary_cross_entropy_backward", "aten::binary_cross_entropy_with_logits", "aten::dist",
          "aten::huber_loss", "aten::kthvalue", "aten::logsumexp", "aten::median", "aten::median.dim", "aten::mode",
          "aten::mse_loss", "aten::nanmedian", "aten::nanmedian.dim", "aten::smooth_l1_loss", "aten::sort",
          "aten::sort.stable", "aten::topk"},
         {{}, false, W::BroadcastTerms});
    t.emplace("aten::mvlgamma", OpContract{{}, false, W::Mvlgamma});
    for (const char* op : {"aten::reflection_pad1d", "aten::replication_pad1d"}) t[op].arguments = padding_of<1>;
    for (const char* op : {"aten::reflection_pad2d", "aten::replication_pad2d"}) t[op].arguments = padding_of<2>;
    for (const char* op : {"aten::reflection_pad3d", "aten::replication_pad3d"}) t[op].arguments = padding_of<3>;
    t["aten::arange"].arguments = arange_end;
    t["aten::arange.start"].arguments = arange_start;
    t["aten::arange.start_step"].arguments = arange_start_step;
    t.emplace("aten::_trilinear", OpContract{{}, false, W::Trilinear});

    // Index arguments.
    auto indexed = [&](std::initializer_list<const char*> ops, std::vector<IndexArg> args) {
      for (const char* op : ops) t.emplace(op, OpContract{args, false, W::DenseOperands});
    };
    indexed({"aten::gather", "aten::scatter.src", "aten::scatter.value", "aten::scatter_add",
             "aten::scatter_reduce.two", "aten::index_select", "aten::index_add", "aten::index_copy"},
            {{"index", "self", IndexRange::Dim, "dim"}});
    indexed({"aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor"},
            {{"index", "self", IndexRange::Dim, "dim", /*wraps=*/true}});
    indexed({"aten::index.Tensor", "aten::index_put"}, {{"indices", "self", IndexRange::IndexList}});
    indexed({"aten::embedding"}, {{"indices", "weight", IndexRange::Dim}});
    indexed({"aten::_embedding_bag", "aten::_embedding_bag_forward_only"},
            {{"indices", "weight", IndexRange::Dim}, {"offsets", "indices", IndexRange::Offsets}});
    for (const char* op : {"aten::_embedding_bag", "aten::_embedding_bag_forward_only"})
      t[op].arguments = embedding_bag_arguments;
    indexed({"aten::max_pool2d_with_indices_backward"}, {{"indices", "self", IndexRange::Plane, nullptr, false, 2}});
    indexed({"aten::max_pool3d_with_indices_backward"}, {{"indices", "self", IndexRange::Plane, nullptr, false, 3}});
    indexed({"aten::lu_unpack"}, {{"LU_pivots", "LU_data", IndexRange::Pivots}});
    indexed({"aten::linalg_lu_solve"}, {{"pivots", "LU", IndexRange::Pivots}});
    indexed({"aten::nll_loss_forward", "aten::nll_loss2d_forward"}, {{"target", "self", IndexRange::Classes}});
    // Arguments, for ops whose row is above (t.at: a typo is an exception, not a new row).
    for (const char* op : {"aten::avg_pool2d", "aten::avg_pool3d", "aten::max_pool2d_with_indices",
                           "aten::max_pool3d_with_indices", "aten::max_pool2d_with_indices_backward",
                           "aten::max_pool3d_with_indices_backward"})
      t.at(op).arguments = window_ints;
    t.at("aten::random.from").arguments = random_from;
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
          throw Error(where() + ": argument '" + a.index + "' holds a class out of range [0, " + std::to_string(classes) +
                      ") that is not its ignore_index");
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
  auto add = [](int64_t a, int64_t b) { return a > kMaxBytes - b ? kMaxBytes : a + b; };
  auto mul = [](int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? kMaxBytes : r;
  };
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
