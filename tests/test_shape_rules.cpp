// The shape rules of kernels without a C++ Meta kernel (ir/shape_rules.cpp), each
// checked against the CPU kernel: infer_outputs() on the arguments' metadata must give the
// sizes, dtypes and return counts (and, where the rule mirrors them, the strides) of the
// kernel's results on sample values.
#include "ir/builder.h"
#include "ir/ops.h"
#include "tests/helpers.h"

#include <limits>
#include <set>

namespace jvpc {
namespace {

using V = std::vector<c10::IValue>;

struct Sample {
  std::string op;
  V args;               // leading arguments; the rest take the schema's defaults
  bool strides = true;  // whether the rule mirrors the kernel's strides
};

V full_args(const OpInfo& info, V args) {
  const auto& schema = info.schema().arguments();
  for (size_t i = args.size(); i < schema.size(); ++i) {
    if (!schema[i].default_value()) throw std::runtime_error("argument " + schema[i].name() + " needs a value");
    args.push_back(*schema[i].default_value());
  }
  return args;
}

/// The Args and operand metadata of boxed arguments.
std::pair<std::vector<Arg>, std::vector<TensorMeta>> as_args(const OpInfo& info, const V& args) {
  std::vector<Arg> out;
  std::vector<TensorMeta> metas;
  for (size_t i = 0; i < args.size(); ++i)
    out.push_back(arg_from_ivalue(info.schema().arguments()[i], args[i], [&](const at::Tensor& t) {
      metas.push_back(TensorMeta::of(t));
      return static_cast<int>(metas.size() - 1);
    }));
  return {out, metas};
}

/// infer_outputs() on the metadata of `leading` and the defaults, the operands on `device`
/// where one is given.
std::vector<TensorMeta> infer(const std::string& op, const V& leading, std::vector<int>* counts = nullptr,
                              std::optional<c10::Device> device = std::nullopt) {
  const OpInfo& info = op_info(op);
  auto [args, metas] = as_args(info, full_args(info, leading));
  if (device)
    for (TensorMeta& m : metas) m.device = *device;
  return infer_outputs(info, args, metas, counts);
}

at::Tensor n(std::vector<int64_t> s) { return at::randn(s); }
at::Tensor r(std::vector<int64_t> s) { return at::rand(s); }
at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }
at::Tensor cl(const at::Tensor& t) {
  return t.contiguous(t.dim() == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast);
}
c10::List<std::optional<at::Tensor>> index_list(std::vector<std::optional<at::Tensor>> v) {
  c10::List<std::optional<at::Tensor>> l;
  for (auto& t : v) l.push_back(t);
  return l;
}
const c10::IValue kNone;
std::vector<int64_t> I(std::initializer_list<int64_t> v) { return v; }

std::vector<Sample> samples() {
  at::manual_seed(0);
  at::Tensor spd = at::eye(3) * 2 + 0.5;
  at::Tensor grid2 = r({2, 6, 7, 2}) * 2 - 1, grid3 = r({2, 2, 3, 4, 3}) * 2 - 1;
  at::Tensor q = n({2, 4, 5, 8}), k = n({2, 2, 7, 8}), v = n({2, 2, 7, 8});
  at::Tensor weight = r({10, 3}), idx = longs({1, 2, 3, 4}), offs = longs({0, 1});
  at::Tensor cx = at::randn({3, 4}, at::kComplexFloat);
  std::vector<Sample> all = {
      {"aten::_adaptive_avg_pool2d", {n({2, 3, 5, 7}), I({2, 3})}},
      {"aten::_adaptive_avg_pool2d", {n({3, 5, 7}), I({1, 1})}},
      {"aten::_adaptive_avg_pool2d", {cl(n({2, 3, 5, 7})), I({2, 2})}},
      {"aten::_adaptive_avg_pool3d", {n({2, 3, 4, 5, 6}), I({2, 2, 3})}},
      {"aten::_adaptive_avg_pool3d", {n({3, 4, 5, 6}), I({1, 2, 3})}},
      {"aten::_cdist_forward", {n({2, 1, 4, 3}), n({5, 3}), 2.0, kNone}},
      {"aten::_cdist_forward", {n({4, 3}), n({6, 3}), 1.0, int64_t{0}}},
      // _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset, padding_idx)
      {"aten::_embedding_bag", {weight, idx, offs, false, int64_t{0}}},
      {"aten::_embedding_bag", {weight, idx, offs, false, int64_t{1}}},
      {"aten::_embedding_bag", {weight, idx, offs, false, int64_t{2}}},
      {"aten::_embedding_bag", {weight, idx, longs({0, 1, 4}), false, int64_t{2}, false, kNone, true}},
      {"aten::_embedding_bag", {weight, idx, offs, false, int64_t{0}, false, kNone, false, int64_t{2}}},
      {"aten::_embedding_bag", {weight, idx, offs, false, int64_t{0}, false, r({4})}},
      {"aten::_embedding_bag", {weight.to(at::kDouble), idx, offs, false, int64_t{0}}},
      {"aten::_embedding_bag", {r({3, 10}).t(), idx, offs, false, int64_t{0}}},
      {"aten::_embedding_bag", {weight, idx.to(at::kInt), offs.to(at::kInt), false, int64_t{2}}},
      {"aten::_embedding_bag", {weight, longs({1, 2, 3, 4, 5, 6}).view({3, 2}), offs, false, int64_t{1}}},
      {"aten::_embedding_bag_forward_only", {weight, idx, offs, false, int64_t{0}}},
      {"aten::_embedding_bag_forward_only", {weight, idx, longs({0, 1, 3}), false, int64_t{1}, false, kNone, true}},
      {"aten::_embedding_bag_forward_only", {weight.to(at::kDouble), idx, offs, false, int64_t{2}}},
      {"aten::_prelu_kernel", {n({2, 3, 4}), n({3, 1})}},
      {"aten::_prelu_kernel", {n({4, 3}).t(), n({1})}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {q, k, v}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {q.to(at::kBFloat16), k.to(at::kBFloat16), v.to(at::kBFloat16), 0.0, true}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble)}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {q.transpose(1, 2).contiguous().transpose(1, 2), k, v, 0.0, false, n({5, 7})}},
      {"aten::addbmm", {r({3}), r({2, 4, 5}), r({2, 5, 3})}},
      {"aten::addbmm", {r({4, 3}), r({2, 4, 5}), r({2, 5, 3}), 0.5, 2.0}},
      {"aten::binary_cross_entropy", {r({3, 4}), r({3, 4})}},
      {"aten::binary_cross_entropy", {r({3, 4}), r({3, 4}), r({4}), int64_t{0}}},
      {"aten::binary_cross_entropy", {r({4, 3}).t(), r({4}), kNone, int64_t{0}}},
      {"aten::binary_cross_entropy", {r({3, 4}), r({3, 4}), kNone, int64_t{2}}},
      {"aten::binary_cross_entropy_with_logits", {n({3, 4}), r({3, 4})}},
      {"aten::binary_cross_entropy_with_logits", {n({3, 4}), r({3, 4}), r({4}), r({4}), int64_t{0}}},
      {"aten::binary_cross_entropy_with_logits", {n({4}), r({3, 4}), kNone, kNone, int64_t{0}}},
      {"aten::binary_cross_entropy_with_logits", {n({3, 4}), r({3, 4}).to(at::kDouble), kNone, kNone, int64_t{2}}},
      {"aten::channel_shuffle", {n({2, 4, 3, 3}), int64_t{2}}},
      {"aten::channel_shuffle", {cl(n({2, 4, 3, 3})), int64_t{2}}},
      {"aten::channel_shuffle", {n({2, 6, 3}), int64_t{3}}},
      {"aten::cholesky", {spd}},
      {"aten::cholesky", {spd.expand({2, 3, 3}).contiguous(), true}},
      {"aten::cholesky_inverse", {spd}},
      {"aten::cholesky_inverse", {spd.expand({2, 3, 3}).contiguous(), true}},
      {"aten::col2im", {r({2, 12, 6}), I({3, 4}), I({2, 2}), I({1, 1}), I({0, 0}), I({1, 1})}},
      {"aten::col2im", {r({12, 9}), I({4, 5}), I({2, 2}), I({1, 1}), I({1, 1}), I({2, 2})}},
      {"aten::embedding", {weight, longs({1, 2, 3, 4}).view({2, 2})}},
      {"aten::embedding", {weight, longs({1, 2, 3}).to(at::kInt), int64_t{1}}},
      {"aten::grid_sampler_2d", {r({2, 3, 4, 5}), grid2, int64_t{0}, int64_t{0}, false}},
      {"aten::grid_sampler_2d", {r({2, 3, 4, 5}), grid2, int64_t{2}, int64_t{1}, true}},
      {"aten::grid_sampler_3d", {r({2, 3, 4, 5, 6}), grid3, int64_t{0}, int64_t{0}, false}},
      {"aten::grid_sampler_3d", {r({2, 3, 4, 5, 6}), grid3, int64_t{1}, int64_t{2}, true}},
      {"aten::hardswish", {n({3, 4})}},
      {"aten::hardswish", {n({4, 3}).t()}},
      {"aten::hardtanh", {n({4, 3}).t(), -0.5, 0.5}},
      {"aten::hardtanh", {longs({-2, 0, 2}), -1.5, 1.5}},
      {"aten::huber_loss", {n({3, 4}), n({4})}},
      {"aten::huber_loss", {n({4}), n({3, 4}), int64_t{0}, 0.5}},
      {"aten::huber_loss", {n({4, 3}).t(), n({3, 4}).to(at::kDouble), int64_t{0}}},
      {"aten::huber_loss", {n({3, 4}), n({3, 4}), int64_t{2}}},
      {"aten::im2col", {r({2, 3, 3, 4}), I({2, 2}), I({1, 1}), I({0, 0}), I({1, 1})}},
      {"aten::im2col", {r({3, 5, 6}), I({3, 2}), I({1, 2}), I({1, 0}), I({2, 1})}},
      {"aten::index.Tensor", {n({3, 4, 5}), index_list({std::nullopt, longs({0, 2})})}},
      {"aten::index.Tensor", {n({3, 4, 5}), index_list({longs({0, 2}).view({2, 1}), std::nullopt, longs({1, 3, 4})})}},
      // All-true masks: the bound the rule gives is then the result's shape.
      {"aten::index.Tensor", {n({3, 4, 5}), index_list({std::nullopt, at::ones({4, 5}, at::kBool)})}},
      {"aten::index.Tensor", {n({3, 4, 5}), index_list({at::ones({3}, at::kBool), longs({1})})}},
      {"aten::cummax", {n({3, 4}), int64_t{1}}},
      {"aten::cummin", {n({4, 3}).t(), int64_t{-1}}},
      {"aten::frexp.Tensor", {n({3, 4})}},
      {"aten::frexp.Tensor", {n({4, 3}).t()}},
      {"aten::vdot", {n({5}), n({5})}},
      {"aten::median", {n({3, 4})}},
      {"aten::nanmedian", {n({0})}},
      {"aten::max_pool3d_with_indices_backward",
       {n({1, 2, 1, 2, 2}), n({1, 2, 2, 4, 4}), I({2, 2, 2}), I({2, 2, 2}), I({0, 0, 0}), I({1, 1, 1}), false,
        std::get<1>(at::max_pool3d_with_indices(n({1, 2, 2, 4, 4}), {2, 2, 2}, {2, 2, 2}))}},
      {"aten::max_pool3d_with_indices_backward",  // channels-last: the gradient is laid out as self
       {n({1, 2, 1, 2, 2}), cl(n({1, 2, 2, 4, 4})), I({2, 2, 2}), I({2, 2, 2}), I({0, 0, 0}), I({1, 1, 1}), false,
        std::get<1>(at::max_pool3d_with_indices(cl(n({1, 2, 2, 4, 4})), {2, 2, 2}, {2, 2, 2}))}},
      {"aten::index_select", {n({3, 4}), int64_t{1}, longs({0, 2, 2})}},
      {"aten::index_select", {n({}), int64_t{0}, longs({0})}},  // 0-dim: indexed as 1-dim, stays 0-dim
      {"aten::kthvalue", {n({3, 4}), int64_t{2}, int64_t{1}, true}},
      {"aten::kthvalue", {n({3, 4}), int64_t{3}}},
      {"aten::kthvalue", {n({}), int64_t{1}, int64_t{0}}},
      {"aten::log_sigmoid_forward", {n({3, 4})}},
      {"aten::log_sigmoid_forward", {n({4, 3}).t()}},
      {"aten::logcumsumexp", {n({3, 4}), int64_t{0}}},
      {"aten::logcumsumexp", {n({4, 3}).t(), int64_t{-1}}},
      {"aten::logit", {r({3, 4})}},
      {"aten::logit", {longs({0, 1}), 0.1}},
      {"aten::logsumexp", {n({3, 4}), I({1})}},
      {"aten::logsumexp", {n({2, 3, 4}), I({0, 2}), true}},
      {"aten::logsumexp", {longs({1, 2, 3}), I({0})}},
      {"aten::masked_select", {n({3, 1}), at::ones({4}, at::kBool)}},
      {"aten::max", {n({3, 4})}},
      {"aten::max", {at::ones({2}, at::kBool)}},
      {"aten::min", {longs({3, 1, 2})}},
      {"aten::max_pool3d_with_indices", {n({2, 3, 4, 5, 6}), I({2, 2, 2})}},
      {"aten::max_pool3d_with_indices", {n({3, 4, 5, 6}), I({2}), I({1}), I({1}), I({1}), true}},
      {"aten::max_pool3d_with_indices",
       {cl(n({2, 3, 4, 5, 6})), I({2, 2, 3}), I({2, 1, 2}), I({1, 0, 1}), I({1, 2, 1})}},
      {"aten::median.dim", {n({3, 4}), int64_t{1}, true}},
      {"aten::median.dim", {n({3, 4}), int64_t{0}}},
      {"aten::nanmedian.dim", {n({3, 4}), int64_t{-1}}},
      {"aten::mode", {n({3, 4})}},
      {"aten::mode", {n({3, 4}), int64_t{0}, true}},
      {"aten::nan_to_num", {n({4, 3}).t()}},
      {"aten::nan_to_num", {longs({1, 2}), 0.0}},
      {"aten::nansum", {n({3, 4})}},
      {"aten::nansum", {n({3, 4}), I({1}), true}},
      {"aten::nansum", {longs({1, 2}), kNone, false, at::kDouble}},
      {"aten::nansum", {at::ones({2, 2}, at::kInt), I({0})}},
      // native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
      {"aten::native_batch_norm", {n({2, 3, 4, 5}), r({3}), r({3}), r({3}), r({3}), true, 0.1, 1e-5}},
      {"aten::native_batch_norm", {n({2, 3, 4, 5}), r({3}), r({3}), r({3}), r({3}), false, 0.1, 1e-5}},
      {"aten::native_batch_norm", {cl(n({2, 3, 4, 5})), kNone, kNone, kNone, kNone, true, 0.1, 1e-5}},
      {"aten::native_batch_norm", {n({4, 3}), kNone, kNone, kNone, kNone, true, 0.1, 1e-5}},
      {"aten::native_batch_norm", {n({2, 3, 4}).to(at::kBFloat16), r({3}), r({3}), r({3}), r({3}), false, 0.1, 1e-5}},
      {"aten::native_batch_norm", {n({2, 3, 4}).to(at::kBFloat16), kNone, kNone, kNone, kNone, true, 0.1, 1e-5}},
      {"aten::nll_loss2d_forward",
       {r({2, 3, 4, 5}), at::zeros({2, 4, 5}, at::kLong), kNone, int64_t{0}, int64_t{-100}}},
      {"aten::nll_loss2d_forward",
       {r({2, 3, 4, 5}), at::ones({2, 4, 5}, at::kLong), r({3}), int64_t{1}, int64_t{-100}}},
      {"aten::prod", {n({3, 4})}},
      {"aten::prod", {at::ones({3}, at::kBool)}},
      {"aten::prod", {longs({1, 2}), at::kFloat}},
      {"aten::reflection_pad2d", {n({2, 3, 4, 5}), I({1, 2, 3, 0})}},
      {"aten::reflection_pad2d", {n({3, 4, 5}), I({1, 1, 1, 1})}},
      {"aten::reflection_pad2d", {cl(n({2, 3, 4, 5})), I({-1, -1, 2, 2})}},
      {"aten::remainder.Scalar_Tensor", {2.5, longs({1, 2, 3})}},
      {"aten::remainder.Scalar_Tensor", {int64_t{3}, longs({1, 2})}},
      {"aten::remainder.Scalar_Tensor", {int64_t{2}, r({4, 3}).t() + 1}},
      {"aten::rsub.Tensor", {n({3, 4}), n({4}), 2.0}},
      {"aten::rsub.Tensor", {longs({1, 2}), n({3, 1})}},
      {"aten::std.correction", {n({3, 4})}},
      {"aten::std.correction", {n({3, 4}), I({1}), 0.0, true}},
      {"aten::std.correction", {cx, I({0})}},
      {"aten::var.correction", {n({2, 3, 4}), I({0, 2})}},
      {"aten::var.correction", {cx}},
      {"aten::std_mean.correction", {n({3, 4}), I({1})}},
      {"aten::std_mean.correction", {cx, kNone, int64_t{0}, true}},
      {"aten::var_mean.correction", {cx, I({1})}},
      {"aten::var_mean.correction", {n({3, 4})}},
      {"aten::trace", {n({3, 4})}},
      {"aten::trace", {at::ones({2, 2}, at::kInt)}},
      {"aten::where.Scalar", {at::rand({3, 4}) > 0.5, 0.0, -std::numeric_limits<double>::infinity()}},
      {"aten::where.Scalar", {at::ones({2, 1}, at::kBool), int64_t{1}, int64_t{0}}},
  };
  std::vector<Sample> present;  // the ops of this LibTorch (test::has_op)
  for (Sample& s : all)
    if (test::has_op(s.op)) present.push_back(std::move(s));
  return present;
}

std::string describe(const Sample& s) {
  std::string out = s.op + "(";
  for (const auto& a : s.args) {
    if (a.isTensor())
      out += TensorMeta::of(a.toTensor()).str();
    else if (a.isTensorList() || a.isList())
      out += "[list]";
    else
      out += c10::toString(a.type());
    out += ", ";
  }
  return out + ")";
}

TEST(ShapeRules, MatchTheCpuKernelsOnSampleInputs) {
  for (const Sample& s : samples()) {
    SCOPED_TRACE(describe(s));
    const OpInfo& info = op_info(s.op);
    V args = full_args(info, s.args);
    torch::jit::Stack stack(args.begin(), args.end());
    info.handle.callBoxed(stack);
    std::vector<int> kernel_counts, rule_counts;
    std::vector<at::Tensor> results = unpack_returns(stack, 0, kernel_counts);
    std::vector<TensorMeta> inferred;
    ASSERT_NO_THROW(inferred = infer(s.op, s.args, &rule_counts));
    EXPECT_EQ(rule_counts, kernel_counts);
    ASSERT_EQ(inferred.size(), results.size());
    for (size_t i = 0; i < results.size(); ++i) {
      SCOPED_TRACE("output " + std::to_string(i));
      TensorMeta got = TensorMeta::of(results[i]);
      EXPECT_EQ(inferred[i].sizes, got.sizes);
      EXPECT_EQ(inferred[i].dtype, got.dtype);
      EXPECT_EQ(inferred[i].device, got.device);
      if (s.strides && got.numel() > 1) {
        EXPECT_EQ(inferred[i].strides, got.strides);
      }
    }
  }
}

// Every op of the list a graph file may use whose C++ Meta kernel is missing has a sample above,
// and none of them throws NoShapeRule any more.
TEST(ShapeRules, CoverEveryOpWithoutACppMetaKernel) {
  const std::vector<std::string> ops = {"aten::_adaptive_avg_pool2d",
                                        "aten::_adaptive_avg_pool3d",
                                        "aten::_cdist_forward",
                                        "aten::_embedding_bag",
                                        "aten::_embedding_bag_forward_only",
                                        "aten::_prelu_kernel",
                                        "aten::_scaled_dot_product_flash_attention_for_cpu",
                                        "aten::addbmm",
                                        "aten::binary_cross_entropy",
                                        "aten::binary_cross_entropy_with_logits",
                                        "aten::channel_shuffle",
                                        "aten::cholesky",
                                        "aten::cholesky_inverse",
                                        "aten::col2im",
                                        "aten::cummax",
                                        "aten::cummin",
                                        "aten::embedding",
                                        "aten::frexp.Tensor",
                                        "aten::grid_sampler_2d",
                                        "aten::grid_sampler_3d",
                                        "aten::hardswish",
                                        "aten::hardtanh",
                                        "aten::huber_loss",
                                        "aten::im2col",
                                        "aten::index.Tensor",
                                        "aten::kthvalue",
                                        "aten::log_sigmoid_forward",
                                        "aten::logcumsumexp",
                                        "aten::logit",
                                        "aten::logsumexp",
                                        "aten::masked_select",
                                        "aten::max_pool3d_with_indices_backward",
                                        "aten::max",
                                        "aten::max_pool3d_with_indices",
                                        "aten::median",
                                        "aten::median.dim",
                                        "aten::min",
                                        "aten::mode",
                                        "aten::nan_to_num",
                                        "aten::nanmedian",
                                        "aten::nanmedian.dim",
                                        "aten::nansum",
                                        "aten::native_batch_norm",
                                        "aten::nll_loss2d_forward",
                                        "aten::prod",
                                        "aten::reflection_pad2d",
                                        "aten::remainder.Scalar_Tensor",
                                        "aten::rsub.Tensor",
                                        "aten::std.correction",
                                        "aten::std_mean.correction",
                                        "aten::trace",
                                        "aten::var.correction",
                                        "aten::var_mean.correction",
                                        "aten::vdot"};
  std::set<std::string> sampled;
  for (const Sample& s : samples()) sampled.insert(s.op);
  for (const std::string& op : ops) {
    if (!test::has_op(op)) continue;
    SCOPED_TRACE(op);
    EXPECT_TRUE(sampled.count(op));
    for (const Sample& s : samples())
      if (s.op == op) {
        EXPECT_NO_THROW(infer(s.op, s.args));
      }
  }
}

// The CUDA-only kernels, on Meta operands of a CUDA graph's shapes.
TEST(ShapeRules, CudaOnlyKernelsFollowTheirCudaAllocations) {
  auto meta = [](std::vector<int64_t> s, c10::ScalarType t = at::kHalf) {
    return at::empty(s, at::TensorOptions().dtype(t).device(c10::kMeta));
  };
  at::Tensor q = meta({2, 4, 40, 16}), k = meta({2, 2, 56, 16}), v = meta({2, 2, 56, 8});
  const c10::Device cuda(c10::kCUDA, 0);
  auto str = [&](const std::vector<TensorMeta>& m) {
    std::string s;
    for (TensorMeta t : m) {
      EXPECT_EQ(t.device, cuda);
      t.device = c10::kCPU;
      s += t.str() + " ";
    }
    return s;
  };
  std::vector<int> counts;
  auto flash = infer("aten::_scaled_dot_product_flash_attention", {q, k, v}, &counts, cuda);
  EXPECT_EQ(str(flash), "f16[2,4,40,8] f32[2,4,40] UInt64[2] UInt64[] f16[0] ");
  EXPECT_EQ(counts, (std::vector<int>{1, 1, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(flash[0].strides, (std::vector<int64_t>{40 * 4 * 8, 8, 4 * 8, 1}));  // [B,Sq,H,Dv] transposed
  auto debug = infer("aten::_scaled_dot_product_flash_attention", {q, k, v, 0.1, false, true}, nullptr, cuda);
  EXPECT_EQ(debug.back().sizes, (std::vector<int64_t>{2, 4, 128, 128}));

  at::Tensor ke = meta({2, 4, 56, 16}), ve = meta({2, 4, 56, 8});
  auto efficient = infer("aten::_scaled_dot_product_efficient_attention", {q, ke, ve, kNone, true}, &counts, cuda);
  EXPECT_EQ(str(efficient), "f16[2,4,40,8] f32[2,4,64] i64[] i64[] ");
  EXPECT_EQ(counts, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(str(infer("aten::_scaled_dot_product_efficient_attention", {q, ke, ve, kNone, false}, nullptr, cuda)),
            "f16[2,4,40,8] f32[2,4,0] i64[] i64[] ");

  auto cudnn = infer("aten::_scaled_dot_product_cudnn_attention", {q, k, v, kNone, true}, &counts, cuda);
  EXPECT_EQ(str(cudnn), "f16[2,4,40,8] f32[2,4,40,1] i64[] i64[] ");
  EXPECT_EQ(counts, (std::vector<int>{1, 1, 0, 0, 0, 0, 1, 1, 0}));
  // The output follows the query's dim order: a [B,Sq,H,D] query gives a [B,Sq,H,Dv] layout.
  auto cudnn_bshd = infer("aten::_scaled_dot_product_cudnn_attention",
                          {meta({2, 40, 4, 16}).transpose(1, 2), k, v, kNone, true}, nullptr, cuda);
  EXPECT_EQ(cudnn_bshd[0].strides, (std::vector<int64_t>{40 * 4 * 8, 8, 4 * 8, 1}));

  // cudnn_batch_norm(input, weight, bias, running_mean, running_var, training, factor, eps)
  at::Tensor x = meta({2, 3, 4, 5}), w = meta({3}, at::kFloat);
  EXPECT_EQ(str(infer("aten::cudnn_batch_norm", {x, w, w, w, w, false, 0.1, 1e-5}, nullptr, cuda)),
            "f16[2,3,4,5] f32[0] f32[0] Byte[0] ");
  EXPECT_EQ(str(infer("aten::cudnn_batch_norm", {x, w, w, w, w, true, 0.1, 1e-5}, nullptr, cuda)),
            "f16[2,3,4,5] f32[3] f32[3] Byte[120] ");
  EXPECT_TRUE(value_dependent_shape("aten::cudnn_batch_norm", 3));

  EXPECT_EQ(str(infer("aten::cudnn_grid_sampler", {meta({2, 3, 4, 5}), meta({2, 6, 7, 2})}, nullptr, cuda)),
            "f16[2,3,6,7] ");
}

// Value-dependent shapes: masked_select and index.Tensor with a mask get an upper bound, and
// value_dependent_shape says so (for index.Tensor only with a mask).
TEST(ShapeRules, MaskedResultsAreBoundedAndMarkedValueDependent) {
  at::Tensor x = n({3, 4, 5}), mask = r({4, 5}) > 0.5;
  EXPECT_EQ(infer("aten::masked_select", {x, mask})[0].sizes, std::vector<int64_t>{60});
  EXPECT_LE(at::masked_select(x, mask).numel(), 60);
  EXPECT_TRUE(value_dependent_shape("aten::masked_select", 0));

  auto bound = infer("aten::index.Tensor", {x, index_list({std::nullopt, mask})})[0];
  EXPECT_EQ(bound.sizes, (std::vector<int64_t>{3, 20}));
  at::Tensor real = at::index(x, index_list({std::nullopt, mask}));
  EXPECT_EQ(real.size(0), 3);
  EXPECT_LE(real.size(1), 20);

  Graph g;
  Builder b(g);
  Value* xv = g.add_input("x", TensorMeta::of(x), Role::Primal);
  Value* mv = g.add_input("m", TensorMeta::of(mask), Role::Primal);
  Value* iv = g.add_input("i", TensorMeta::of(longs({0, 2})), Role::Primal);
  Node* masked = b.call("aten::index.Tensor", {xv, std::vector<Value*>{nullptr, mv}})->producer();
  Node* plain = b.call("aten::index.Tensor", {xv, std::vector<Value*>{nullptr, iv}})->producer();
  EXPECT_TRUE(value_dependent_shape(*masked, 0));
  EXPECT_FALSE(value_dependent_shape(*plain, 0));
  EXPECT_EQ(plain->outputs()[0]->meta().sizes, (std::vector<int64_t>{3, 2, 5}));
}

// Arguments a kernel refuses are a one-line jvpc::Error naming the op, never a crash or an
// allocation (the operands are Meta tensors, some of absurd sizes).
TEST(ShapeRules, BadArgumentsAreErrors) {
  auto meta = [](std::vector<int64_t> s, c10::ScalarType t = at::kFloat) {
    return at::empty(s, at::TensorOptions().dtype(t).device(c10::kMeta));
  };
  int64_t huge = int64_t{1} << 40;
  struct Bad {
    std::string op;
    V args;
    std::string fragment;
  };
  const std::vector<Bad> cases = {
      {"aten::kthvalue", {meta({3, 4}), int64_t{5}}, "selected number k out of range"},
      {"aten::max", {meta({0, 3})}, "Expected reduction dim to be specified"},
      {"aten::std.correction", {meta({3}, at::kInt)}, "std and var only support floating point and complex dtypes"},
      {"aten::logsumexp", {meta({3}), I({1})}, "Dimension out of range"},
      {"aten::nansum", {meta({3}, at::kComplexFloat)}, "nansum does not support complex inputs"},
      {"aten::trace", {meta({3})}, "expected a matrix"},
      {"aten::im2col",
       {meta({2, 3, 3, 4}), I({0, 2}), I({1, 1}), I({0, 0}), I({1, 1})},
       "kernel size should be greater than zero"},
      {"aten::im2col", {meta({2, 3, 3, 4}), I({2}), I({1, 1}), I({0, 0}), I({1, 1})}, "kernel_size equals to 2"},
      {"aten::col2im", {meta({2, 12, 7}), I({3, 4}), I({2, 2}), I({1, 1}), I({0, 0}), I({1, 1})}, "aten::col2im: "},
      {"aten::im2col",
       {meta({2, 3, 3, 4}), I({2, 2}), I({1, 1}), I({int64_t{1} << 62, 0}), I({1, 1})},
       "padding out of range"},
      {"aten::max_pool3d_with_indices", {meta({2, 3, 4, 5, 6}), I({2}), I({1}), I({2})}, "pad should be at most half"},
      {"aten::max_pool3d_with_indices",
       {meta({2, 3, 4, 5, 6}), I({int64_t{1} << 33})},
       "window, stride, padding and dilation must fit in 32-bit integers"},
      // convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups): sizes
      // past 64 bits (the fuzzer's UBSan report) and groups that are not positive
      {"aten::convolution",
       {meta({1, 1, 4}), meta({1, 1, 3}), kNone, I({1}), I({0}), I({int64_t{1} << 62}), false, I({0}), int64_t{1}},
       "the kernel is larger than the padded input"},
      {"aten::convolution",
       {meta({1, 1, 4}), meta({1, 1, 3}), kNone, I({int64_t{1} << 62}), I({int64_t{1} << 62}), I({int64_t{1} << 62}),
        true, I({0}), int64_t{1}},
       "the output's size overflows 64 bits"},
      {"aten::convolution",
       {meta({1, 1, 4}), meta({1, 1, 3}), kNone, I({1}), I({0}), I({1}), false, I({0}), int64_t{0}},
       "groups must be positive"},
      {"aten::max_pool3d_with_indices", {meta({3, 4}), I({2})}, "4D or 5D"},
      {"aten::reflection_pad2d", {meta({3, 4, 5}), I({5, 1, 1, 1})}, "Padding size should be less than"},
      {"aten::reflection_pad2d", {meta({3, 4, 5}), I({1, 1})}, "padding size is expected to be 4"},
      {"aten::_adaptive_avg_pool2d", {meta({2, 3, 4, 5}), I({2})}, "output_size must be 2"},
      {"aten::_adaptive_avg_pool3d", {meta({2, 3}), I({1, 1, 1})}, "Expected 4D or 5D tensor"},
      {"aten::grid_sampler_2d",
       {meta({2, 3, 4, 5}), meta({1, 6, 7, 2}), int64_t{0}, int64_t{0}, false},
       "same batch size"},
      {"aten::grid_sampler_3d",
       {meta({2, 3, 4, 5, 6}), meta({2, 2, 3, 4, 3}), int64_t{2}, int64_t{0}, false},
       "bicubic"},
      {"aten::grid_sampler_2d", {meta({}), meta({}), int64_t{0}, int64_t{0}, false}, "aten::grid_sampler_2d: "},
      {"aten::embedding", {meta({10}), meta({2}, at::kLong)}, "'weight' must be 2-D"},
      {"aten::embedding", {meta({10, 3}), meta({2})}, "Expected dtype int64 or int32"},
      {"aten::_embedding_bag",
       {meta({10, 3}), meta({4}, at::kLong), meta({2}, at::kLong), false, int64_t{1}, false, meta({4})},
       "per_sample_weights only supported with mode='sum'"},
      {"aten::_embedding_bag",
       {meta({10, 3}), meta({4}, at::kLong), meta({0}, at::kLong), false, int64_t{0}, false, kNone, true},
       "numBags should be at least 1"},
      {"aten::index.Tensor",
       {meta({3, 4}), index_list({meta({4}, at::kBool)})},
       "does not match the shape of the indexed tensor"},
      {"aten::index.Tensor", {meta({3, 4}), index_list({meta({}, at::kBool)})}, "0-dim boolean index"},
      {"aten::masked_select", {meta({3}), meta({3})}, "expected BoolTensor for mask"},
      {"aten::masked_select", {meta({huge}), meta({huge, 1}, at::kBool)}, "overflows"},
      {"aten::masked_select", {meta({3}), meta({4}, at::kBool)}, "must match the size"},
      {"aten::nll_loss2d_forward",
       {meta({2, 3, 4}), meta({2, 4, 5}, at::kLong), kNone, int64_t{1}, int64_t{-100}},
       "only batches of spatial inputs"},
      {"aten::native_batch_norm",
       {meta({2, 3, 4}), kNone, kNone, kNone, kNone, false, 0.1, 1e-5},
       "must be defined in evaluation mode"},
      {"aten::native_batch_norm",
       {meta({2, 3, 4}), meta({4}), kNone, kNone, kNone, true, 0.1, 1e-5},
       "weight should contain 3 elements"},
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {meta({4, 5, 8}), meta({4, 7, 8}), meta({4, 7, 8})},
       "must be 4-D"},
      {"aten::_scaled_dot_product_flash_attention_for_cpu",
       {meta({2, 4, 5, 8}), meta({2, 3, 7, 8}), meta({2, 3, 7, 8})},
       "divide the query heads"},
      {"aten::_scaled_dot_product_efficient_attention",
       {meta({2, 4, 5, 8}), meta({2, 4, 7, 8}), meta({2, 4, 6, 8}), kNone, true},
       "same sequence length"},
      {"aten::channel_shuffle", {meta({2, 4, 3}), int64_t{0}}, "must be positive"},
      {"aten::channel_shuffle", {meta({2, 4, 3}), int64_t{3}}, "divisible by groups"},
      {"aten::_cdist_forward", {meta({4, 3}), meta({5, 3}), -1.0, kNone}, "non-negative p"},
      {"aten::_cdist_forward", {meta({4, 3}), meta({5, 2}), 2.0, kNone}, "same number of columns"},
      {"aten::addbmm", {meta({3}), meta({2, 4, 5}), meta({2, 6, 3})}, "aten::addbmm: "},
      {"aten::cholesky", {meta({3, 4})}, "aten::cholesky: "},
      {"aten::huber_loss", {meta({3}), meta({3}), int64_t{1}, 0.0}, "non-positive values for delta"},
      {"aten::binary_cross_entropy", {meta({3}), meta({2, 3})}, "aten::binary_cross_entropy: "},
      {"aten::binary_cross_entropy_with_logits", {meta({3}), meta({4})}, "aten::binary_cross_entropy_with_logits: "},
      {"aten::_prelu_kernel", {meta({3}), meta({3}, at::kDouble)}, "Found dtype Double but expected Float"},
      {"aten::hardswish", {meta({3}, at::kLong)}, "expected a floating-point input"},
      {"aten::hardtanh", {meta({3}, at::kBool)}, "Bool inputs not supported"},
      {"aten::prod", {meta({3}), int64_t{999}}, "is not a dtype"},
  };
  for (const Bad& c : cases) {
    if (!test::has_op(c.op)) continue;
    SCOPED_TRACE(c.op);
    test::expect_error([&] { infer(c.op, c.args); }, c.fragment);
    try {
      infer(c.op, c.args);
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_EQ(msg.rfind(c.op + ": ", 0), 0u) << msg;
      EXPECT_EQ(dynamic_cast<const NoShapeRule*>(&e), nullptr) << msg;
    }
  }
}

}  // namespace
}  // namespace jvpc
