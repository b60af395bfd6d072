// group-bmm: bmms over repeated key/value heads read the unrepeated tensor.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "compiler/cost/cost_model.h"
#include "examples/examples.h"
#include "runtime/executable.h"
#include "tests/pass_helpers.h"

namespace jvpc {
namespace {
using test::f32;
using test::run;

// repeat_interleave(x, r, dim=1) as LibTorch's math path traces it: [B, Hk, S, D] -> [B, Hk·r, S, D].
Value* repeat_heads(Builder& b, Value* x, int64_t r) {
  auto s = x->meta().sizes;
  Value* e =
      b.call("aten::expand", {b.call("aten::unsqueeze", {x, 2}), std::vector<int64_t>{s[0], s[1], r, s[2], s[3]}});
  Value* c = b.call("aten::clone", {e, c10::MemoryFormat::Contiguous});
  return b.call("aten::view", {c, std::vector<int64_t>{s[0], s[1] * r, s[2], s[3]}});
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
  EXPECT_FALSE(rewrites({4, 5, 7}, {2, 7, 3}, 0, {2, 2, 7, 3}));        // a new leading dim, not heads
  EXPECT_FALSE(rewrites({8, 5, 7}, {1, 2, 7, 3}, 2, {2, 2, 2, 7, 3}));  // the batch is broadcast too
}

}  // namespace
}  // namespace jvpc
