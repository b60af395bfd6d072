// Compiled programs (compiler/api/program.h): linearize at points other than the compile point
// against linearize there and LibTorch's forward AD in float64, for every example; the matmul
// FLOPs that run against the primal graph's cost; each guard; captured weights after an
// optimizer step; and what cannot be compiled.
#include "compiler/api/program.h"
#include "compiler/api/reference.h"
#include "ir/cost/kernel_watch.h"
#include "ir/cost/peak_bytes.h"
#include "ir/printer.h"
#include "tests/batch_check.h"
#include "tests/helpers.h"

namespace jvpc {
namespace {

using Tensors = std::vector<at::Tensor>;

// Another point: each floating input moved by a random step; masks and indices as they were.
Tensors another_point(const std::vector<TraceInput>& inputs) {
  Tensors out;
  for (const TraceInput& in : inputs)
    out.push_back(in.value.is_floating_point() ? in.value + 0.5 * at::randn_like(in.value) : in.value);
  return out;
}

std::vector<TraceInput> at_point(std::vector<TraceInput> inputs, const Tensors& values) {
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i].value = values[i];
  return inputs;
}

// Random tangents for `lin`'s arguments, and the same as forward AD's per-primal tangents.
std::pair<Tensors, std::vector<std::optional<at::Tensor>>> tangents_for(const Linearized& lin,
                                                                        const std::vector<TraceInput>& inputs) {
  Tensors t;
  std::vector<std::optional<at::Tensor>> ref(inputs.size());
  for (const Input* in : lin.jvp_fn->arguments()) {
    const TensorMeta& m = in->value->meta();
    t.push_back(at::randn(m.sizes, at::TensorOptions().dtype(m.dtype).device(m.device)));
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].name == in->tangent_of) ref[i] = t.back();
  }
  return {t, ref};
}

class ProgramExamples : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ProgramExamples, MatchLinearizeAndForwardAdAtNewPointsInFloat64) {
  auto ex = test::make_example(GetParam(), {"--dtype", "float64"});
  Program prog = compile(ex.fn(), ex.inputs);
  for (int point = 0; point < 2; ++point) {
    SCOPED_TRACE("point " + std::to_string(point));
    Tensors x2 = another_point(ex.inputs);
    Linearized got = prog.linearize(x2);
    Linearized want = linearize(ex.fn(), at_point(ex.inputs, x2));
    auto [t, ref] = tangents_for(want, ex.inputs);
    ASSERT_EQ(got.tangent_names(), want.tangent_names());
    Tensors dy = got.jvp(t);
    EXPECT_LT(compare(dy, want.jvp(t)).rel_error, 1e-10);
    EXPECT_LT(compare(dy, forward_ad_jvp(ex.make_fn(examples::Backend::Math), x2, ref)).rel_error, 1e-10);
    EXPECT_LT(compare(got.primal_outputs, ex.fn()(x2)).rel_error, 1e-12);
  }
}

// A point made from the primal graph's outputs computed elsewhere (here: by an Executable of the
// primal graph, as Python's Inductor route computes them) is the point linearize makes.
TEST_P(ProgramExamples, APointFromThePrimalGraphsOutputsIsLinearizes) {
  auto ex = test::make_example(GetParam(), {"--dtype", "float64"});
  Program prog = compile(ex.fn(), ex.inputs);
  Tensors x2 = another_point(ex.inputs);
  Executable primal(prog.primal_graph().clone(), ExecutableOptions::plain());
  Linearized got = prog.linearize_from(x2, primal.run(x2));
  Linearized want = prog.linearize(x2);
  auto [t, ref] = tangents_for(want, ex.inputs);
  EXPECT_LT(compare(got.jvp(t), want.jvp(t)).rel_error, 1e-12);
  EXPECT_LT(compare(got.primal_outputs, want.primal_outputs).rel_error, 1e-12);
  EXPECT_THROW(prog.linearize_from(x2, {}), Error);  // not the primal graph's outputs
  // Another backend's primal output in another dtype (or shape) is refused, naming it.
  Tensors outs = primal.run(x2);
  outs[0] = outs[0].to(at::kFloat);
  try {
    prog.linearize_from(x2, outs);
    ADD_FAILURE() << "a float32 primal output was taken for a float64 one";
  } catch (const Error& e) {
    std::string want = "primal output '" + prog.primal_graph().output_names()[0] + "' is f64";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// A point's batched linear map (compiler/api/batched.cpp) reads that point's residuals.
TEST_P(ProgramExamples, APointsBatchedMapEqualsKSingleCallsInFloat64) {
  auto ex = test::make_example(GetParam(), {"--dtype", "float64"});
  Program prog = compile(ex.fn(), ex.inputs);
  Linearized first = prog.linearize(another_point(ex.inputs));
  Linearized got = prog.linearize(another_point(ex.inputs));
  test::BatchCheck r = test::batched_vs_single(got, 3);
  EXPECT_LT(r.rel_error, 1e-12);
  EXPECT_LT(test::batched_vs_single(first, 2).rel_error, 1e-12);
}

// The tangent graph is the one linearize makes (the primal outputs stay in the graph until fold,
// for the primal graph, and change nothing on the tangent side): the same text, ids renumbered
// and residuals unbound. A program's captured weights are residuals (read afresh at each point)
// where linearize keeps them as constants: there, the same ops in the same order.
std::string normalized(const Graph& g) {
  std::unique_ptr<Graph> c = g.clone();  // ids renumbered in order
  for (Input& in : c->inputs()) in.data = at::Tensor();
  return to_text(*c);
}

TEST_P(ProgramExamples, TheTangentGraphIsLinearizes) {
  auto ex = test::make_example(GetParam());
  Program prog = compile(ex.fn(), ex.inputs);
  Linearized lin = linearize(ex.fn(), ex.inputs);
  bool captures = !lin.captured.empty();
  if (!captures) {
    EXPECT_EQ(normalized(*prog.tangent_graph()), normalized(*lin.tangent_graph));
  } else {
    std::vector<std::string> ops, want;
    for (const Node* n : prog.tangent_graph()->nodes()) ops.push_back(n->op());
    for (const Node* n : lin.tangent_graph->nodes()) want.push_back(n->op());
    EXPECT_EQ(ops, want);
  }
  EXPECT_EQ(prog.report().tangent.matmul_flops, lin.report.tangent.matmul_flops);
  EXPECT_EQ(prog.report().tangent.nodes, lin.report.tangent.nodes);
}

// What runs at a new point is the primal graph: its matmul FLOPs, counted on the kernels that ran.
TEST_P(ProgramExamples, LinearizeRunsThePrimalGraphsMatmulFlops) {
  auto ex = test::make_example(GetParam());
  Program prog = compile(ex.fn(), ex.inputs);
  Tensors x2 = another_point(ex.inputs);
  KernelWatch watch;
  Linearized lin = prog.linearize(x2);
  EXPECT_EQ(watch.matmul_flops(), prog.primal_cost().matmul_flops);
  EXPECT_GT(watch.matmul_flops(), 0);
}

// Linearize at a new point holds no more than the residuals beside what the forward itself
// allocates at its peak (the primal graph is the forward plus the residuals it keeps).
TEST_P(ProgramExamples, LinearizesPeakIsAtMostTheResidualsPlusTheForwardsPeak) {
  auto ex = test::make_example(GetParam());
  Program prog = compile(ex.fn(), ex.inputs);
  Tensors x2 = another_point(ex.inputs);
  TensorFn fn = ex.fn();
  int64_t forward = measured_peak_bytes([&] {
    at::NoGradGuard no_grad;
    fn(x2);
  });
  std::optional<Linearized> held;
  int64_t linearize = measured_peak_bytes([&] { held = prog.linearize(x2); });
  int64_t residuals = prog.report().tangent.residual_bytes;
  EXPECT_LE(linearize, residuals + forward) << "forward's peak " << forward << " B, residuals " << residuals << " B";
  EXPECT_GT(forward, 0);
}

INSTANTIATE_TEST_SUITE_P(Examples, ProgramExamples, ::testing::ValuesIn(test::example_configs()),
                         [](const auto& info) { return "config" + std::to_string(info.index); });

TEST(Program, TheSeedsLinearizeIsOneForward) {
  auto ex = test::make_example({"sdpa"});
  Program prog = compile(ex.fn(), ex.inputs);
  EXPECT_EQ(prog.primal_cost().matmul_flops, 20971520);
  Tensors x2 = another_point(ex.inputs);
  KernelWatch watch;
  Linearized lin = prog.linearize(x2);
  EXPECT_EQ(watch.matmul_flops(), 20971520);
  auto [t, ref] = tangents_for(lin, ex.inputs);
  KernelWatch jvp_watch;
  lin.jvp(t);
  EXPECT_EQ(jvp_watch.matmul_flops(), 41943040);
}

// Linearizations at earlier points keep their own residuals.
TEST(Program, EarlierLinearizationsStayValid) {
  auto ex = test::make_example({"sdpa", "--causal"}, {"--dtype", "float64"});
  Program prog = compile(ex.fn(), ex.inputs);
  Tensors x1 = another_point(ex.inputs), x2 = another_point(ex.inputs);
  Linearized a = prog.linearize(x1);
  auto [t, ref] = tangents_for(a, ex.inputs);
  Tensors before = a.jvp(t);
  Linearized b = prog.linearize(x2);
  b.jvp(t);
  Tensors after = a.jvp(t);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(before[i].equal(after[i]));
  EXPECT_LT(compare(after, linearize(ex.fn(), at_point(ex.inputs, x1)).jvp(t)).rel_error, 1e-12);
}

// Weights the function captured are read as they are at each linearize.
TEST(Program, AnOptimizerStepBetweenTwoPointsIsSeen) {
  at::Tensor w = at::randn({4, 4}, at::kDouble).requires_grad_(), b = at::randn({4}, at::kDouble);
  TensorFn fn = [w, b](const Tensors& a) { return Tensors{at::mm(at::tanh(at::mm(a[0], w) + b), w)}; };
  at::Tensor x = at::randn({3, 4}, at::kDouble), dx = at::randn({3, 4}, at::kDouble);
  Program prog = compile(fn, {{"x", x}});
  Linearized before = prog.linearize({x});
  Tensors dy_before = before.jvp({dx});
  {
    at::NoGradGuard no_grad;
    w.sub_(0.1 * at::randn_like(w));  // an optimizer step, in place
    b.add_(0.25);
  }
  at::Tensor x2 = at::randn({3, 4}, at::kDouble);
  Linearized after = prog.linearize({x2});
  Tensors want = linearize(fn, {{"x", x2}}).jvp({dx});
  EXPECT_LT(compare(after.jvp({dx}), want).rel_error, 1e-12);
  EXPECT_LT(compare(after.primal_outputs, fn({x2})).rel_error, 1e-12);
  // The earlier linearization holds its own copy of the old weights: unchanged, still valid.
  EXPECT_TRUE(before.jvp({dx})[0].equal(dy_before[0]));
}

// Under grad mode, a primal or a captured parameter that requires grad gets eager's gradient
// from the one run that also gives the residuals; without grad mode nothing is recorded.
TEST(Program, UnderGradModeTheRunIsTheStepsOnlyForward) {
  at::Tensor w = at::randn({4, 4}, at::kDouble).requires_grad_(), b = at::randn({4}, at::kDouble);
  TensorFn fn = [w, b](const Tensors& a) { return Tensors{at::mm(at::tanh(at::mm(a[0], w) + b), w)}; };
  at::Tensor x = at::randn({3, 4}, at::kDouble);
  Program prog = compile(fn, {{"x", x}});
  at::Tensor x2 = at::randn({3, 4}, at::kDouble).requires_grad_(), g = at::randn({3, 4}, at::kDouble);
  KernelWatch watch;
  Linearized lin = prog.linearize({x2});
  EXPECT_EQ(watch.matmul_flops(), prog.primal_cost().matmul_flops);
  ASSERT_TRUE(lin.primal_outputs[0].requires_grad());
  lin.primal_outputs[0].backward(g);
  at::Tensor gx = x2.grad().clone(), gw = w.grad().clone();
  x2.mutable_grad().reset();
  w.mutable_grad().reset();
  fn({x2})[0].backward(g);
  EXPECT_LT(compare({gx, gw}, {x2.grad(), w.grad()}).rel_error, 1e-12);
  at::Tensor dx = at::randn({3, 4}, at::kDouble);
  EXPECT_LT(compare(lin.jvp({dx}), linearize(fn, {{"x", x2.detach()}}).jvp({dx})).rel_error, 1e-12);
  at::NoGradGuard no_grad;
  EXPECT_FALSE(prog.linearize({x2}).primal_outputs[0].requires_grad());
}

// A residual that aliases a caller's primal input is protected as linearize's are.
TEST(Program, WritingAnAliasedInputAfterLinearizeIsAnError) {
  TensorFn fn = [](const Tensors& a) { return Tensors{at::mm(a[0], a[1])}; };
  at::Tensor x = at::randn({3, 4}, at::kDouble), w = at::randn({4, 2}, at::kDouble);
  Program prog = compile(fn, {{"x", x}, {"w", w}});
  at::Tensor x2 = at::randn({3, 4}, at::kDouble), w2 = at::randn({4, 2}, at::kDouble);
  Linearized lin = prog.linearize({x2, w2});
  at::Tensor dx = at::randn({3, 4}, at::kDouble), dw = at::randn({4, 2}, at::kDouble);
  EXPECT_LT(compare(lin.jvp({dx, dw}), {at::mm(dx, w2) + at::mm(x2, dw)}).rel_error, 1e-12);
  x2.add_(1);
  test::expect_error([&] { lin.jvp({dx, dw}); }, "which was written in place after the graph was compiled");
}

TEST(Program, GuardsNameTheInputAndBothValues) {
  TensorFn fn = [](const Tensors& a) { return Tensors{at::tanh(a[0]) * a[1]}; };
  at::Tensor x = at::randn({3, 4}), y = at::randn({3, 4});
  Program prog = compile(fn, {{"x", x}, {"y", y}});
  using test::expect_error;
  expect_error([&] { prog.linearize({x}); }, "expected 2 primals (x, y), got 1");
  expect_error([&] { prog.linearize({x, at::randn({4, 3})}); }, "primal 'y': expected shape [3,4] but got [4,3]");
  expect_error([&] { prog.linearize({x.to(at::kDouble), y}); }, "primal 'x': expected dtype Float but got Double");
  expect_error(
      [&] {
        prog.linearize({x, at::empty({3, 4}, at::TensorOptions().device(at::kMeta))});
      },
      "primal 'y': expected device cpu but got meta");
  at::Tensor transposed = at::randn({4, 3}).t();
  expect_error([&] { prog.linearize({transposed, y}); }, "primal 'x': expected strides [4,1] but got [1,3]");
  expect_error([&] { prog.linearize({x, at::Tensor()}); }, "primal 'y': expected f32[3,4] but got an undefined tensor");
  // Without exact strides, another layout is copied into the compiled one.
  ProgramOptions loose;
  loose.exact_strides = false;
  Program any_layout = compile(fn, {{"x", x}, {"y", y}}, loose);
  at::Tensor dx = at::randn({3, 4}), dy = at::randn({3, 4});
  Tensors got = any_layout.linearize({transposed, y}).jvp({dx, dy});
  Tensors want = linearize(fn, {{"x", transposed.contiguous()}, {"y", y}}).jvp({dx, dy});
  EXPECT_LT(compare(got, want).rel_error, 1e-6);
}

TEST(Program, AValueReadIntoANumberCannotBeCompiled) {
  TensorFn fn = [](const Tensors& a) { return Tensors{a[0] * a[0].sum().item<double>()}; };
  at::Tensor x = at::randn({3});
  test::expect_error(
      [&] {
        compile(fn, {{"x", x}});
      },
      "aten::_local_scalar_dense reads a value computed from the inputs");
  linearize(fn, {{"x", x}});  // linearize at one point allows it
}

TEST(Program, DataDependentShapesCannotBeCompiled) {
  TensorFn fn = [](const Tensors& a) { return Tensors{a[0].index_select(0, (a[0] > 0).nonzero().view({-1})).sin()}; };
  at::Tensor x = at::tensor({1.0, -1.0, 2.0});
  test::expect_error(
      [&] {
        compile(fn, {{"x", x}});
      },
      "aten::nonzero gives an output whose shape depends on the input values");
  TensorFn masked = [](const Tensors& a) { return Tensors{a[0].index({a[0] > 0}).sin()}; };  // x[x > 0]
  test::expect_error(
      [&] {
        compile(masked, {{"x", x}});
      },
      "aten::index.Tensor with a boolean mask (x[x > 0]) gives an output whose shape depends on the input "
      "values");
  TensorFn indexed = [](const Tensors& a) { return Tensors{a[0].index({at::tensor({2, 0})}).sin()}; };
  compile(indexed, {{"x", x}});  // integer indices: the shape is the index's
}

// A program draws afresh at every point, from the default generator in eager's order and
// number (a draw nothing reads included), so that seeded alike it gives eager's results exactly;
// the tangent reads the point's own draw.
TEST(Program, RandomOpsDrawAtEveryPointAsEagerDoes) {
  TensorFn fn = [](const Tensors& a) {
    at::Tensor unread = at::rand({3});
    at::Tensor keep = (at::rand({a[0].size(0)}, a[0].options()) < 0.7).to(a[0].scalar_type());
    return Tensors{at::dropout(a[0].exp(), 0.5, true) * keep};
  };
  at::Tensor x = at::randn({16}, at::kDouble), t = at::randn({16}, at::kDouble);
  Program prog = compile(fn, {{"x", x}});
  for (int seed : {1, 2}) {
    at::manual_seed(seed);
    at::Tensor eager = fn({x})[0], eager_next = at::rand({4});
    at::manual_seed(seed);
    at::Tensor want = forward_ad_jvp(fn, {x}, {t})[0];
    at::manual_seed(seed);
    Linearized lin = prog.linearize({x});
    EXPECT_TRUE(at::equal(lin.primal_outputs[0], eager)) << seed;
    EXPECT_TRUE(at::equal(at::rand({4}), eager_next)) << seed;
    EXPECT_LT((lin.jvp({t})[0] - want).abs().max().item<double>(), 1e-12) << seed;
  }
}

// On CUDA the primal graph replays a CUDA graph: each point's residuals are copied out of its
// static buffers, so a later point leaves an earlier one's linear map as it was.
TEST(Program, CudaPointsOwnTheirResidualsUnderCudaGraphs) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (auto cfg : std::vector<std::vector<std::string>>{{"sdpa"}, {"sdpa", "--causal"}, {"block"}}) {
    SCOPED_TRACE(test::config_name(cfg));
    std::vector<std::string> flags(cfg.begin() + 1, cfg.end());
    flags.insert(flags.end(), {"--device", "cuda", "--dtype", "float32"});
    auto ex = examples::make(cfg[0], flags);
    Program prog = compile(ex.fn(), ex.inputs);
    std::vector<Linearized> points;
    std::vector<Tensors> xs, tangents, first;
    for (int p = 0; p < 3; ++p) {  // the first call captures, the next ones replay
      xs.push_back(another_point(ex.inputs));
      points.push_back(prog.linearize(xs.back()));
      tangents.push_back(tangents_for(points.back(), ex.inputs).first);
      first.push_back(points.back().jvp(tangents.back()));
    }
    for (int p = 0; p < 3; ++p) {
      Tensors again = points[static_cast<size_t>(p)].jvp(tangents[static_cast<size_t>(p)]);
      for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(again[i].equal(first[static_cast<size_t>(p)][i]));
      auto want =
          linearize(ex.fn(), at_point(ex.inputs, xs[static_cast<size_t>(p)])).jvp(tangents[static_cast<size_t>(p)]);
      EXPECT_LT(compare(again, want).rel_error, 1e-4);
    }
  }
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// State inputs (TraceInput::state, a module's buffers): the program records the function's
// writes to them, BatchNorm's running statistics and its counter, and writes them back into the
// tensors passed at every point, as eager code writes them; a saved program keeps that.
TEST(Program, StateInputsAreWrittenBackAtEveryPoint) {
  TensorFn fn = [](const Tensors& a) {  // x, then the state: running mean, running var, count
    a[3].add_(1);
    return Tensors{at::batch_norm(a[0], {}, {}, a[1], a[2], /*training=*/true, 0.1, 1e-5, false).sin()};
  };
  auto state = [] {
    return Tensors{at::zeros({3}, at::kDouble), at::ones({3}, at::kDouble), at::zeros({}, at::kLong)};
  };
  Tensors mine = state(), eager = state();
  at::Tensor x = at::randn({5, 3}, at::kDouble);
  std::vector<TraceInput> in = {{"x", x}, {"rm", mine[0]}, {"rv", mine[1]}, {"n", mine[2]}};
  for (size_t i = 1; i < in.size(); ++i) in[i].state = true;
  test::expect_error([&] { linearize(fn, in); }, "linearize: input 'rm' is state");
  Program prog = compile(fn, in);  // its trace runs fn once, writing the state as eager code does
  mine = {mine[0].zero_(), mine[1].fill_(1), mine[2].zero_()};
  std::string path = test::temp_path("state-program.json");
  prog.save(path);
  Program loaded = Program::load(path);
  for (int step = 0; step < 3; ++step) {
    at::Tensor xs = at::randn({5, 3}, at::kDouble), t = at::randn({5, 3}, at::kDouble);
    at::Tensor want = fn({xs, eager[0], eager[1], eager[2]})[0];
    Linearized lin = (step == 2 ? loaded : prog).linearize({xs, mine[0], mine[1], mine[2]});
    EXPECT_TRUE(at::allclose(lin.primal_outputs[0], want, 1e-12, 1e-14)) << step;
    EXPECT_EQ(lin.jvp({t}).size(), 1u) << "the state has no tangent";
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(mine[i], eager[i], 1e-12, 1e-14)) << step << " state " << i;
  }
  EXPECT_EQ(mine[2].item<int64_t>(), 3);
}

}  // namespace
}  // namespace jvpc
