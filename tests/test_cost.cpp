// The cost model: FlopCounterMode's matmul formulas, exact totals, residual and peak memory,
// and a cross-check against the kernels that actually run.
#include "ir/cost/cost_model.h"
#include "ir/cost/kernel_watch.h"
#include "ir/builder.h"
#include "ir/printer.h"
#include "compiler/trace/tracer.h"
#include "runtime/executable.h"
#include "tests/helpers.h"
#include "tests/profiler.h"

namespace jvpc {
namespace {

using test::f32;

TEST(Cost, SeedSdpaCostsExactlyTheForwardMatmulFlops) {
  auto ex = test::make_example({"sdpa"});
  Trace t = trace(ex.fn(), ex.inputs);
  GraphCost c = graph_cost(*t.graph);
  EXPECT_EQ(c.matmul_flops, 20971520);
  EXPECT_EQ(c.ops.at("aten::bmm"), 2);
}

TEST(Cost, MatmulFormulasAreFlopCounterModes) {
  EXPECT_EQ(matmul_flops_for("aten::mm", {{3, 5}, {5, 7}}), 2 * 3 * 5 * 7);
  EXPECT_EQ(matmul_flops_for("aten::addmm", {{7}, {3, 5}, {5, 7}}), 2 * 3 * 5 * 7);
  EXPECT_EQ(matmul_flops_for("aten::bmm", {{2, 3, 5}, {2, 5, 7}}), 2 * 2 * 3 * 5 * 7);
  EXPECT_EQ(matmul_flops_for("aten::baddbmm", {{2, 3, 7}, {2, 3, 5}, {2, 5, 7}}), 2 * 2 * 3 * 5 * 7);
  // Fused attention: two bmms, q·kᵀ and p·v; the mask is ignored.
  EXPECT_EQ(matmul_flops_for("aten::_scaled_dot_product_efficient_attention",
                             {{1, 5, 128, 64}, {1, 5, 128, 64}, {1, 5, 128, 64}, {}}),
            20971520);
  EXPECT_EQ(matmul_flops_for("aten::exp", {{4}}), -1);
  // Convolutions (input, weight, bias; output shape; transposed), as FlopCounterMode counted them
  // for torch.nn.functional.conv*d with these arguments (torch 2.11).
  EXPECT_EQ(matmul_flops_for("aten::convolution", {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}}, {2, 4, 8, 8}),
            27648);  // padding 1
  EXPECT_EQ(matmul_flops_for("aten::convolution", {{2, 3, 8, 8}, {4, 3, 3, 3}, {}}, {2, 4, 2, 2}),
            1728);  // stride 2, dilation 2
  EXPECT_EQ(matmul_flops_for("aten::convolution", {{2, 4, 9, 9}, {6, 2, 3, 3}, {}}, {2, 6, 9, 9}), 34992);  // groups 2
  EXPECT_EQ(matmul_flops_for("aten::convolution", {{2, 3, 8, 8}, {3, 5, 3, 3}, {}}, {2, 5, 16, 16}, true), 34560);
  EXPECT_EQ(matmul_flops_for("aten::convolution", {{2, 3, 10}, {5, 3, 3}, {}}, {2, 5, 8}), 1440);
  EXPECT_EQ(matmul_flops_for("aten::convolution", {{1, 2, 5, 6, 7}, {3, 2, 2, 3, 3}, {}}, {1, 3, 6, 6, 7}), 54432);
}

// The convolutions above, run: the traced graph's cost and the kernels that ran agree with
// FlopCounterMode's counts.
TEST(Cost, ConvolutionsAreCountedAsFlopCounterModeCountsThem) {
  struct Case {
    std::function<at::Tensor(const std::vector<at::Tensor>&)> f;
    std::vector<std::vector<int64_t>> shapes;
    int64_t flops;
  };
  std::vector<Case> cases = {
      {[](auto& x) { return at::conv2d(x[0], x[1], x[2], 1, 1); }, {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}}, 27648},
      {[](auto& x) {
         using I = at::IntArrayRef;
         return at::conv2d(x[0], x[1], std::nullopt, I{2}, I{0}, I{2});
       },
       {{2, 3, 8, 8}, {4, 3, 3, 3}},
       1728},
      {[](auto& x) { return at::conv2d(x[0], x[1], {}, 1, 1, 1, 2); }, {{2, 4, 9, 9}, {6, 2, 3, 3}}, 34992},
      {[](auto& x) { return at::conv_transpose2d(x[0], x[1], {}, 2, 1, 1); }, {{2, 3, 8, 8}, {3, 5, 3, 3}}, 34560},
      {[](auto& x) { return at::conv1d(x[0], x[1]); }, {{2, 3, 10}, {5, 3, 3}}, 1440},
      {[](auto& x) { return at::conv3d(x[0], x[1], {}, 1, 1); }, {{1, 2, 5, 6, 7}, {3, 2, 2, 3, 3}}, 54432},
  };
  for (const Case& c : cases) {
    std::vector<TraceInput> in;
    for (const auto& s : c.shapes) in.push_back({"x" + std::to_string(in.size()), at::randn(s)});
    TensorFn fn = [f = c.f](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{f(x)}; };
    Trace t = trace(fn, in);
    EXPECT_EQ(graph_cost(*t.graph).matmul_flops, c.flops) << to_text(*t.graph);
    std::vector<at::Tensor> values;
    for (const auto& i : in) values.push_back(i.value);
    KernelWatch watch;
    Executable(t.graph->clone()).run(values);
    EXPECT_EQ(watch.matmul_flops(), c.flops) << to_text(*t.graph);
  }
}

TEST(Cost, CpuFlashKernelIsCountedAsItsBmmsAndSaysSo) {
  auto ex = test::make_example({"sdpa", "--backend", "flash"});
  Trace t = trace(ex.fn(), ex.inputs);
  GraphCost c = graph_cost(*t.graph);
  EXPECT_EQ(c.matmul_flops, 20971520);
  for (const Node* n : t.graph->nodes())
    if (n->op() == "aten::_scaled_dot_product_flash_attention_for_cpu") {
      EXPECT_NE(node_cost(*n).note, nullptr);
    }
}

TEST(Cost, OtherFlopsFollowTheConvention) {
  Graph g;
  Value* x = g.add_input("x", f32({8, 16}), Role::Primal);
  Builder b(g);
  Value* e = b.call("aten::exp", {x});
  Value* s = b.call("aten::_softmax", {e, -1, false});
  Value* r = b.call("aten::sum.dim_IntList", {s, std::vector<int64_t>{-1}, true});
  Value* v = b.call("aten::view", {r, std::vector<int64_t>{8}});
  g.add_output(b.call("aten::mul.Scalar", {v, 2.0}));
  auto nodes = g.nodes();
  EXPECT_EQ(node_cost(*nodes[0]).transcendentals, 128);  // exp: one per element
  EXPECT_EQ(node_cost(*nodes[0]).other_flops, 0);
  EXPECT_EQ(node_cost(*nodes[1]).other_flops, 4 * 128);  // softmax: max, subtract, sum, divide
  EXPECT_EQ(node_cost(*nodes[1]).transcendentals, 128);
  EXPECT_EQ(node_cost(*nodes[2]).other_flops, 128);  // reduction: one per input element
  EXPECT_EQ(node_cost(*nodes[3]).bytes, 0);          // views move nothing
  EXPECT_EQ(node_cost(*nodes[4]).other_flops, 8);    // elementwise: one per output element
  EXPECT_EQ(node_cost(*nodes[4]).bytes, 8 * 4 * 2);
  // mv and dot (no FlopCounterMode rule): 2 per multiply-add, in other FLOPs; flip copies.
  Value* w = g.add_input("w", f32({16}), Role::Primal);
  Value* mv = b.call("aten::mv", {x, w});
  Value* dot = b.call("aten::dot", {w, w});
  Value* flip = b.call("aten::flip", {x, std::vector<int64_t>{0}});
  EXPECT_EQ(node_cost(*mv->producer()).other_flops, 2 * 8 * 16);
  EXPECT_EQ(node_cost(*mv->producer()).matmul_flops, 0);
  EXPECT_EQ(node_cost(*dot->producer()).other_flops, 2 * 16);
  EXPECT_EQ(node_cost(*flip->producer()).other_flops, 0);
  // Solves with a factored matrix: n²·k per substitution, for an n×n matrix and n×k right-hand side.
  Value* a = g.add_input("a", f32({2, 16, 16}), Role::Primal);
  Value* rhs = g.add_input("rhs", f32({2, 16, 3}), Role::Primal);
  Value* tri = b.call("aten::linalg_solve_triangular", {a, rhs, true});
  Value* chol = b.call("aten::cholesky_solve", {rhs, a});
  EXPECT_EQ(node_cost(*tri->producer()).other_flops, 2 * 16 * 16 * 3);
  EXPECT_EQ(node_cost(*chol->producer()).other_flops, 2 * 2 * 16 * 16 * 3);
}

// Counts past 2^63 are an error naming the op, never a wrapped number (this bmm's matmul_flops
// would wrap to 0).
// An op without a FLOP convention is counted as elementwise and named as uncosted.
TEST(Cost, OpsWithoutAConventionAreReportedAsUncosted) {
  Graph g;
  Value* x = g.add_input("x", f32({4, 3}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::sinc", {b.call("aten::add.Tensor", {x, x, 1})}));
  GraphCost c = graph_cost(g);
  EXPECT_EQ(c.uncosted_ops, (std::map<std::string, int64_t>{{"aten::sinc", 1}}));
  EXPECT_EQ(c.other_flops, 24);  // add 12, sinc 12 (the guess)
  EXPECT_TRUE(node_cost(*g.nodes().back()).uncosted);
  EXPECT_FALSE(node_cost(*g.nodes().front()).uncosted);
}

TEST(Cost, CountsPastInt64AreAnError) {
  Graph g;
  Value* a = g.add_input("a", f32({1, int64_t{1} << 25, int64_t{1} << 25}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::bmm", {a, a}));
  test::expect_error([&] { graph_cost(g); }, "node aten::bmm: cost exceeds 2^63");
}

TEST(Cost, PeakBytesFollowLiveness) {
  // x -> a -> b -> c: a dies once b exists, so at most two intermediates are alive.
  Graph g;
  Value* x = g.add_input("x", f32({1024}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::exp", {x});
  Value* c = b.call("aten::exp", {a});
  Value* d = b.call("aten::exp", {c});
  g.add_output(d);
  EXPECT_EQ(graph_cost(g).peak_bytes, 2 * 4096);
  // A view keeps its base alive and allocates nothing.
  g.add_output(b.call("aten::view", {a, std::vector<int64_t>{32, 32}}));
  EXPECT_EQ(graph_cost(g).peak_bytes, 3 * 4096);
}

TEST(Cost, ResidualBytesCountSharedStorageOnceAndAliasesApart) {
  Graph g;
  at::Tensor base = at::randn({16, 16});
  g.add_constant("r0", base);
  g.add_constant("r1", base.view({256}));     // same storage
  g.add_constant("r2", at::randn({8}), "q");  // the caller's input
  GraphCost c = graph_cost(g);
  EXPECT_EQ(c.residual_bytes, 16 * 16 * 4);
  EXPECT_EQ(c.aliased_input_bytes, 8 * 4);
}

// For every example: the matmul FLOPs the cost model predicts equal what runs, counted both
// by jvpc's KernelWatch and by LibTorch's profiler (with_flops).
class CostMatchesExecution : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(CostMatchesExecution, PredictedMatmulFlopsRun) {
  auto ex = test::make_example(GetParam());
  Trace t = trace(ex.fn(), ex.inputs);
  GraphCost predicted = graph_cost(*t.graph);
  std::vector<std::string> graph_ops;
  int64_t predicted_plain = 0;  // the matmuls LibTorch's profiler has FLOP formulas for
  for (const Node* n : t.graph->nodes()) {
    graph_ops.push_back(n->op());
    if (n->op() == "aten::bmm" || n->op() == "aten::mm" || n->op() == "aten::addmm" || n->op() == "aten::baddbmm")
      predicted_plain += node_cost(*n).matmul_flops;
  }
  Executable exe(std::move(t.graph), ExecutableOptions::plain());
  auto inputs = test::values_of(ex.inputs);
  {
    KernelWatch watch;
    exe.run(inputs);
    EXPECT_EQ(watch.matmul_flops(), predicted.matmul_flops);
    EXPECT_EQ(watch.kernels(), graph_ops);
  }
  auto profiled = test::profile_kernels([&] { exe.run(inputs); });
  int64_t profiler_flops = 0;
  for (const auto& k : profiled)
    if (k.op == "aten::bmm" || k.op == "aten::mm" || k.op == "aten::addmm" || k.op == "aten::baddbmm")
      profiler_flops += k.flops;
  EXPECT_EQ(profiled.size(), graph_ops.size());
  EXPECT_EQ(profiler_flops, predicted_plain);
}

INSTANTIATE_TEST_SUITE_P(Examples, CostMatchesExecution, ::testing::ValuesIn(test::example_configs()),
                         [](const auto& info) { return "config" + std::to_string(info.index); });

}  // namespace
}  // namespace jvpc
