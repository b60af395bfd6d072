// Compile time: shape inference memoized per signature (ir/shape_memo.h), and the cache
// of linearize's optimized graphs (compiler/api/linearize_cache.h).
#include "compiler/api/linearize_cache.h"
#include "ir/ops.h"
#include "ir/shape_memo.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace jvpc {
namespace {

std::vector<TensorMeta> bmm_of(const TensorMeta& a, const TensorMeta& b) {
  return infer_outputs(op_info("aten::bmm"), {Arg::tensor(0), Arg::tensor(1)}, {a, b});
}

TEST(ShapeMemo, AnswersARepeatedSignatureWithoutInferringAgain) {
  TensorMeta a = TensorMeta::contiguous({3, 5, 7}, c10::kFloat, c10::kCPU);
  TensorMeta b = TensorMeta::contiguous({3, 7, 2}, c10::kFloat, c10::kCPU);
  bmm_of(a, b);
  const ShapeInferenceStats before = shape_inference_stats();
  auto out = bmm_of(a, b);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].sizes, (std::vector<int64_t>{3, 5, 2}));
  EXPECT_EQ(shape_inference_stats().calls, before.calls + 1);
  EXPECT_EQ(shape_inference_stats().computed, before.computed);  // from the memo
  TensorMeta bt = b;
  bt.strides = {14, 1, 7};  // another layout: another signature
  bmm_of(a, bt);
  EXPECT_EQ(shape_inference_stats().computed, before.computed + 1);
}

TEST(ShapeMemo, DoesNotMemoizeErrors) {
  TensorMeta a = TensorMeta::contiguous({3, 5, 7}, c10::kFloat, c10::kCPU);
  TensorMeta bad = TensorMeta::contiguous({3, 6, 2}, c10::kFloat, c10::kCPU);
  EXPECT_THROW(bmm_of(a, bad), Error);
  EXPECT_THROW(bmm_of(a, bad), Error);
}

// x ↦ gelu(x W) · 0.5: the 0.5 is a wrapped number, new at every call.
struct Mlp {
  at::Tensor w = at::randn({8, 8}, at::kDouble);
  TensorFn fn() const {
    at::Tensor weight = w;
    return [weight](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{at::gelu(at::matmul(in[0], weight)) * at::scalar_tensor(0.5, at::kDouble)};
    };
  }
};

std::vector<at::Tensor> jvp_at(LinearizeCache& cache, const TensorFn& fn, const at::Tensor& x, const at::Tensor& t,
                               bool* hit) {
  int64_t hits = cache.hits();
  Linearized lin = cache.linearize(fn, {{"x", x}});
  *hit = cache.hits() > hits;
  return lin.jvp({t});
}

TEST(LinearizeCache, HitsOnTheSameTraceAndMatchesLinearize) {
  Mlp m;
  LinearizeCache cache;
  at::Tensor x = at::randn({4, 8}, at::kDouble), x2 = at::randn({4, 8}, at::kDouble);
  at::Tensor t = at::randn({4, 8}, at::kDouble);
  bool hit = true;
  jvp_at(cache, m.fn(), x, t, &hit);
  EXPECT_FALSE(hit);
  auto got = jvp_at(cache, m.fn(), x2, t, &hit);
  EXPECT_TRUE(hit);
  auto want = linearize(m.fn(), {{"x", x2}}).jvp({t});
  EXPECT_TRUE(at::allclose(got[0], want[0], 1e-12, 1e-12));
  m.w.mul_(0.5);  // in place: the same tensor, a hit at its new values
  got = jvp_at(cache, m.fn(), x2, t, &hit);
  EXPECT_TRUE(hit);
  EXPECT_TRUE(at::allclose(got[0], linearize(m.fn(), {{"x", x2}}).jvp({t})[0], 1e-12, 1e-12));
}

TEST(LinearizeCache, MissesOnAnotherShapeDtypeOrWeight) {
  Mlp m;
  LinearizeCache cache;
  at::Tensor x = at::randn({4, 8}, at::kDouble);
  bool hit = true;
  jvp_at(cache, m.fn(), x, x, &hit);
  at::Tensor x5 = at::randn({5, 8}, at::kDouble);
  jvp_at(cache, m.fn(), x5, x5, &hit);
  EXPECT_FALSE(hit);
  Mlp other;  // another weight, other values
  jvp_at(cache, other.fn(), x, x, &hit);
  EXPECT_FALSE(hit);
  m.w = m.w.to(at::kFloat);
  at::Tensor xf = x.to(at::kFloat);
  jvp_at(cache, m.fn(), xf, xf, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(cache.size(), 4u);
  EXPECT_EQ(cache.misses(), 4);
}

}  // namespace
}  // namespace jvpc
