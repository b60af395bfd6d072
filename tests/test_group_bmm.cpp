// group-bmm: bmms over repeated key/value heads read the unrepeated tensor; zero-blocks: bmms skip a
// concatenated tangent's zero blocks.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "compiler/cost/cost_model.h"
#include "examples/examples.h"
#include "runtime/executable.h"
#include "tests/pass_helpers.h"

namespace jvpc {
namespace {
using test::f32;

// repeat_interleave(x, r, dim=1) as LibTorch's math path traces it: [B, Hk, S, D] -> [B, Hk·r, S, D].
Value* repeat_heads(Builder& b, Value* x, int64_t r) {
  auto s = x->meta().sizes;
  Value* e = b.call("aten::expand", {b.call("aten::unsqueeze", {x, 2}), std::vector<int64_t>{s[0], s[1], r, s[2], s[3]}});
  Value* c = b.call("aten::clone", {e, c10::MemoryFormat::Contiguous});
  return b.call("aten::view", {c, std::vector<int64_t>{s[0], s[1] * r, s[2], s[3]}});
}

std::vector<at::Tensor> run(const Graph& g, const std::vector<at::Tensor>& in) {
  return Executable(g.clone()).run(in);
}

// a [2·3·2, 5, 4] times the transposed, scaled, repeated k ([2, 3, 7, 4] over 2 heads each).
struct Qk {
  Graph g;
  Value *a, *k;
  Qk() {
    a = g.add_input("a", f32({12, 5, 4}), Role::Primal);
    k = g.add_input("dk", f32({2, 3, 7, 4}), Role::Tangent);
    Builder b(g);
    Value* kt = b.call("aten::mul.Scalar", {b.call("aten::transpose.int", {repeat_heads(b, k, 2), -2, -1}), 0.5});
    g.add_output(b.call("aten::bmm", {a, b.call("aten::view", {kt, std::vector<int64_t>{12, 4, 7}})}));
  }
};

TEST(GroupBmm, ReadsTheUnrepeatedTensorWithTheSameResultAndFlops) {
  Qk q;
  std::vector<at::Tensor> in = {at::randn({12, 5, 4}), at::randn({2, 3, 7, 4})};
  at::Tensor before = run(q.g, in)[0];
  int64_t flops = graph_cost(q.g).matmul_flops;
  EXPECT_TRUE(group_bmm(q.g));
  verify(q.g);
  EXPECT_EQ(test::count_op(q.g, "aten::clone"), 0) << to_text(q.g);
  EXPECT_EQ(test::count_op(q.g, "aten::expand"), 0);
  EXPECT_EQ(graph_cost(q.g).matmul_flops, flops);
  const Node* bmm = nullptr;
  for (const Node* n : q.g.nodes())
    if (n->op() == "aten::bmm") bmm = n;
  ASSERT_NE(bmm, nullptr);
  EXPECT_EQ(bmm->input(0)->meta().sizes, (std::vector<int64_t>{6, 10, 4}));  // two heads' rows stacked
  EXPECT_EQ(bmm->input(1)->meta().sizes, (std::vector<int64_t>{6, 4, 7}));   // one matrix per group
  EXPECT_TRUE(run(q.g, in)[0].allclose(before, 1e-5, 1e-6));
}

TEST(GroupBmm, LeavesALeftOperandThatCannotStackItsRows) {
  // Read a through a transpose: its [12, 5, 4] has rows that no view stacks per group.
  Graph g;
  Value* at_ = g.add_input("at", f32({12, 4, 5}), Role::Primal);
  Value* k = g.add_input("dk", f32({2, 3, 7, 4}), Role::Tangent);
  Builder b(g);
  Value* a = b.call("aten::transpose.int", {at_, 1, 2});
  Value* kt = b.call("aten::transpose.int", {repeat_heads(b, k, 2), -2, -1});
  g.add_output(b.call("aten::bmm", {a, b.call("aten::view", {kt, std::vector<int64_t>{12, 4, 7}})}));
  EXPECT_FALSE(group_bmm(g));
}

// Does group-bmm rewrite bmm(a, view(clone(expand(unsqueeze(x, dim), expanded)), [n, k, m]))?
bool rewrites(std::vector<int64_t> a_sizes, std::vector<int64_t> x_sizes, int64_t dim, std::vector<int64_t> expanded) {
  Graph g;
  Value* a = g.add_input("a", f32(a_sizes), Role::Primal);
  Value* x = g.add_input("x", f32(x_sizes), Role::Tangent);
  Builder b(g);
  Value* e = b.call("aten::expand", {b.call("aten::unsqueeze", {x, dim}), expanded});
  Value* c = b.call("aten::clone", {e, c10::MemoryFormat::Contiguous});
  int64_t n = a_sizes[0], k = expanded[expanded.size() - 2], m = expanded.back();
  g.add_output(b.call("aten::bmm", {a, b.call("aten::view", {c, std::vector<int64_t>{n, k, m}})}));
  return group_bmm(g);
}

TEST(GroupBmm, RewritesRepeatsOfHeadsAlone) {
  EXPECT_TRUE(rewrites({12, 5, 7}, {2, 3, 7, 4}, 2, {2, 3, 2, 7, 4}));  // [B, Hk, S, D], each head twice
  EXPECT_TRUE(rewrites({12, 5, 7}, {2, 3, 7, 4}, -3, {2, 3, 2, 7, 4}));
  EXPECT_FALSE(rewrites({4, 5, 7}, {2, 7, 3}, 0, {2, 2, 7, 3}));         // a new leading dim, not heads
  EXPECT_FALSE(rewrites({8, 5, 7}, {1, 2, 7, 3}, 2, {2, 2, 2, 7, 3}));   // the batch is broadcast too
}

TEST(SimplifyViews, AnAddOfTwoViewsIsAViewOfTheAdd) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 6, 3}), Role::Primal);
  Value* y = g.add_input("y", f32({2, 6, 3}), Role::Primal);
  Builder b(g);
  std::vector<int64_t> s = {4, 3, 3};
  g.add_output(b.call("aten::add.Tensor", {b.call("aten::view", {x, s}), b.call("aten::view", {y, s}), 2.0}));
  std::vector<at::Tensor> in = {at::randn({2, 6, 3}), at::randn({2, 6, 3})};
  at::Tensor before = run(g, in)[0];
  EXPECT_TRUE(simplify_views(g));
  verify(g);
  const Node* out = g.outputs()[0]->producer();
  ASSERT_EQ(out->op(), "aten::view") << to_text(g);
  EXPECT_EQ(out->input(0)->producer()->op(), "aten::add.Tensor");
  EXPECT_EQ(out->input(0)->meta().sizes, (std::vector<int64_t>{2, 6, 3}));
  EXPECT_TRUE(run(g, in)[0].equal(before));
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// A decoding step over a KV cache: the tangents of cat([past, new]) are cat([zeros, dnew]); the
// matmuls skip the zero blocks (found by a probe: two cache-sized zero blocks made and
// multiplied per call).
TEST(ZeroBlocks, ADecodingStepSkipsTheCachesZeroTangent) {
  at::Tensor past_k = at::randn({1, 2, 64, 8}, at::kDouble), past_v = at::randn({1, 2, 64, 8}, at::kDouble);
  TensorFn fn = [past_k, past_v](const std::vector<at::Tensor>& x) {
    examples::BackendScope math(examples::Backend::Math);
    return std::vector<at::Tensor>{
        at::scaled_dot_product_attention(x[0], at::cat({past_k, x[1]}, 2), at::cat({past_v, x[2]}, 2))};
  };
  std::vector<TraceInput> in = {{"q", at::randn({1, 2, 1, 8}, at::kDouble)}, {"k", at::randn({1, 2, 1, 8}, at::kDouble)},
                                {"v", at::randn({1, 2, 1, 8}, at::kDouble)}};
  std::vector<at::Tensor> t = {at::randn({1, 2, 1, 8}, at::kDouble), at::randn({1, 2, 1, 8}, at::kDouble),
                               at::randn({1, 2, 1, 8}, at::kDouble)};
  Linearized lin = linearize(fn, in);
  LinearizeOptions without;
  without.disabled_passes = {"zero-blocks"};
  Linearized dense = linearize(fn, in, without);
  EXPECT_EQ(dense.report.tangent.matmul_flops, 8320);
  EXPECT_EQ(lin.report.tangent.matmul_flops, 4224) << to_text(*lin.tangent_graph);
  for (const Node* n : lin.tangent_graph->nodes())
    if (n->op() == "aten::zeros") {
      EXPECT_LE(n->output()->meta().numel(), 2 * 64) << "a cache-sized zero block";
    }
  std::vector<at::Tensor> ref = forward_ad_jvp(fn, {in[0].value, in[1].value, in[2].value}, {t[0], t[1], t[2]});
  EXPECT_LT(test::rel_error(lin.jvp(t)[0], ref[0]), 1e-12);
}

// A cat along bmm's left operand: its rows (the result's rows) or the contracted dim (a slice of
// the right operand); along the batch it is left alone.
TEST(ZeroBlocks, BlocksOfTheLeftOperand) {
  for (int64_t dim : {1, 2, 0}) {
    Graph g;
    std::vector<int64_t> part = {2, 3, 4}, zeros = {2, 3, 4};
    part[static_cast<size_t>(dim)] = 1;
    zeros[static_cast<size_t>(dim)] -= 1;
    Value* t = g.add_input("dx", f32(part), Role::Tangent);
    Value* w = g.add_input("w", f32({2, 4, 5}), Role::Primal, true);
    Builder b(g);
    Value* z = b.call("aten::zeros", {zeros, c10::kFloat, std::nullopt, c10::Device(c10::kCPU)});
    g.add_output(b.call("aten::bmm", {b.call("aten::cat", {std::vector<Value*>{z, t}, dim}), w}));
    std::vector<at::Tensor> in = {at::randn(part), at::randn({2, 4, 5})};
    at::Tensor before = run(g, in)[0];
    EXPECT_EQ(zero_blocks(g), dim != 0) << dim;
    verify(g);
    EXPECT_LT(test::rel_error(run(g, in)[0], before), 1e-6) << to_text(g);
    EXPECT_EQ(test::count_op(g, "aten::bmm"), 1);
  }
}

}  // namespace
}  // namespace jvpc
