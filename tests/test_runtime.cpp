// The runtime: results, input checks, constants, threads, and CUDA graphs (on a GPU).
#include "compiler/api/linearize.h"
#include "ir/cost/kernel_watch.h"
#include "ir/builder.h"
#include "ir/retarget.h"
#include "compiler/trace/tracer.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <thread>

namespace jvpc {
namespace {

// A test-only op: x filled with the number of threads ATen's parallel_for may use where it runs.
at::Tensor threads_here(const at::Tensor& x) { return at::full_like(x, at::get_num_threads()); }
at::Tensor threads_here_meta(const at::Tensor& x) { return at::empty_like(x); }

}  // namespace
}  // namespace jvpc

TORCH_LIBRARY(jvpc_runtime_test, m) { m.def("threads_here(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(jvpc_runtime_test, CPU, m) { m.impl("threads_here", &jvpc::threads_here); }
TORCH_LIBRARY_IMPL(jvpc_runtime_test, Meta, m) { m.impl("threads_here", &jvpc::threads_here_meta); }

namespace jvpc {
namespace {

std::shared_ptr<Graph> small_graph() {
  auto g = std::make_shared<Graph>();
  Value* x = g->add_input("x", TensorMeta::contiguous({4, 3}, c10::kFloat, c10::kCPU), Role::Primal, true);
  Value* c = g->add_constant("w", at::randn({3, 2}));
  Builder b(*g);
  g->add_output(b.call("aten::mm", {b.call("aten::exp", {x}), c}), "y");
  return g;
}

using test::expect_error;

TEST(Runtime, RunsAGraph) {
  auto g = small_graph();
  at::Tensor w = g->inputs()[1].data;
  Executable exe{std::shared_ptr<const Graph>(g)};
  at::Tensor x = at::randn({4, 3});
  EXPECT_TRUE(exe.run({x})[0].allclose(at::mm(x.exp(), w)));
}

TEST(Runtime, ChecksInputsByName) {
  Executable exe{std::shared_ptr<const Graph>(small_graph())};
  expect_error([&] { exe.run({}); }, "expected 1 input tensors, got 0");
  expect_error([&] { exe.run({at::randn({4, 4})}); }, "primal 'x': expected shape f32[4,3] but got f32[4,4]");
  expect_error(
      [&] {
        exe.run({at::randn({4, 3}, at::kDouble)});
      },
      "primal 'x': expected dtype f32[4,3] but got f64[4,3]");
  expect_error(
      [&] {
        exe.run({at::empty({4, 3}, at::device(at::kMeta))});
      },
      "primal 'x': expected device cpu but got meta");
  expect_error([&] { exe.run({at::Tensor()}); }, "primal 'x' is an undefined tensor");
}

TEST(Runtime, NonContiguousInputsAreAccepted) {
  auto g = small_graph();
  at::Tensor w = g->inputs()[1].data;
  Executable exe{std::shared_ptr<const Graph>(g)};
  at::Tensor x = at::randn({3, 4}).t();
  EXPECT_TRUE(exe.run({x})[0].allclose(at::mm(x.exp(), w)));
}

TEST(Runtime, ConstantsCanBeRebound) {
  auto g = small_graph();
  g->inputs()[1].data = at::Tensor();
  Executable exe{std::shared_ptr<const Graph>(g)};
  at::Tensor x = at::randn({4, 3});
  expect_error([&] { exe.run({x}); }, "constant 'w' is not bound");
  expect_error([&] { exe.bind("w", at::ones({2, 3})); }, "constant 'w': expected f32[3,2]");
  expect_error([&] { exe.bind("nope", at::ones({3, 2})); }, "no constant named 'nope'");
  exe.bind("w", at::ones({3, 2}));
  EXPECT_TRUE(exe.run({x})[0].allclose(at::mm(x.exp(), at::ones({3, 2}))));
  // A meta tensor is a one-line error; a layout the graph was not compiled for is made contiguous.
  expect_error([&] { exe.bind("w", at::ones({3, 2}, at::device(at::kMeta))); }, "constant 'w': ");
  at::Tensor wt = at::randn({2, 3}).t();
  exe.bind("w", wt);
  EXPECT_TRUE(exe.run({x})[0].allclose(at::mm(x.exp(), wt)));
}

// Without a GPU, a CUDA graph is a one-line jvpc::Error from the library, and a failed move
// leaves the graph as it was (not a raw multi-line c10::Error, not a half-moved graph).
TEST(Runtime, CudaGraphsWithoutAGpuAreOneLineErrors) {
  if (at::hasCUDA()) GTEST_SKIP() << "a CUDA device is present";
  auto g = std::make_shared<Graph>();
  Value* x = g->add_input("x", TensorMeta::contiguous({4}, c10::kFloat, c10::kCUDA), Role::Primal);
  Builder b(*g);
  g->add_output(b.call("aten::exp", {x}));
  expect_error([&] { Executable exe{std::shared_ptr<const Graph>(g)}; },
               "input 'x' is on cuda, and CUDA is not available on this machine");
  auto h = small_graph();
  expect_error([&] { retarget(*h, c10::Device(c10::kCUDA)); }, "device cuda: CUDA is not available on this machine");
  // A move that fails on the way (a constant written since it was bound) leaves the graph as it was.
  h->inputs()[1].data.add_(1);
  expect_error([&] { retarget(*h, c10::Device(c10::kMeta)); }, "constant 'w' was written in place");
  EXPECT_TRUE(h->inputs()[1].data.is_cpu());
  EXPECT_TRUE(h->inputs()[0].value->meta().device.is_cpu());
}

TEST(Runtime, KernelErrorsNameTheNode) {
  // A graph that verifies but whose kernel rejects its input values at run time.
  auto g = std::make_shared<Graph>();
  Value* x = g->add_input("x", TensorMeta::contiguous({4}, c10::kLong, c10::kCPU), Role::Primal);
  Value* t = g->add_constant("t", at::randn({3}));
  Builder b(*g);
  g->add_output(b.call("aten::index_select", {t, 0, x}));
  Executable exe{std::shared_ptr<const Graph>(g)};
  expect_error([&] { exe.run({at::full({4}, 7, at::kLong)}); }, "node aten::index_select");
}

TEST(Runtime, ReusesTheBufferOfAnOperandThatDies) {
  auto g = std::make_shared<Graph>();
  Value* x = g->add_input("x", TensorMeta::contiguous({64}, c10::kFloat, c10::kCPU), Role::Primal);
  Builder b(*g);
  Value* a = b.call("aten::exp", {x});
  Value* c = b.call("aten::add.Tensor", {a, x});      // a dies here: add_ into a's buffer
  g->add_output(b.call("aten::mul.Tensor", {x, c}));  // x is an input: never written
  Executable exe{std::shared_ptr<const Graph>(g)};
  at::Tensor xv = at::randn({64}), keep = xv.clone();
  at::Tensor out;
  std::vector<std::string> kernels;
  {
    KernelWatch watch;
    out = exe.run({xv})[0];
    kernels = watch.kernels();
  }
  EXPECT_TRUE(out.allclose(keep * (keep.exp() + keep)));
  EXPECT_TRUE(xv.equal(keep));
  EXPECT_EQ(kernels, (std::vector<std::string>{"aten::exp", "aten::add_.Tensor", "aten::mul.Tensor"}));
}

// A view of an intermediate whose storage nothing reads afterwards (the intermediate and every
// other view of it dead) is overwritten in place too; the autograd base the view keeps does not
// count as a reader.
TEST(Runtime, ReusesTheBufferOfAViewWhoseStorageDies) {
  auto g = std::make_shared<Graph>();
  Value* x = g->add_input("x", TensorMeta::contiguous({2, 4}, c10::kFloat, c10::kCPU), Role::Primal);
  Builder b(*g);
  Value* a = b.call("aten::exp", {x});
  Value* t = b.call("aten::t", {a});
  Value* v = b.call("aten::view", {b.call("aten::t", {t}), std::vector<int64_t>{8}});  // a's storage
  Value* c = b.call("aten::add.Tensor", {v, b.call("aten::view", {x, std::vector<int64_t>{8}})});
  g->add_output(b.call("aten::mul.Scalar", {c, 2.0}));
  Executable exe{std::shared_ptr<const Graph>(g)};
  at::Tensor xv = at::randn({2, 4}), keep = xv.clone();
  at::Tensor out;
  std::vector<std::string> kernels;
  {
    KernelWatch watch;
    out = exe.run({xv})[0];
    kernels = watch.kernels();
  }
  EXPECT_TRUE(out.allclose((keep.exp() + keep).view({8}) * 2));
  EXPECT_TRUE(xv.equal(keep));
  EXPECT_NE(std::find(kernels.begin(), kernels.end(), "aten::add_.Tensor"), kernels.end());
}

TEST(Runtime, NeverReusesBuffersThatAViewShares) {
  auto g = std::make_shared<Graph>();
  Value* x = g->add_input("x", TensorMeta::contiguous({8}, c10::kFloat, c10::kCPU), Role::Primal);
  Builder b(*g);
  Value* a = b.call("aten::exp", {x});
  Value* v = b.call("aten::view", {a, std::vector<int64_t>{2, 4}});  // a view shares a's storage
  g->add_output(b.call("aten::add.Tensor", {a, x}));
  g->add_output(v);
  Executable exe{std::shared_ptr<const Graph>(g)};
  at::Tensor xv = at::randn({8});
  std::vector<at::Tensor> outs;
  std::vector<std::string> kernels;
  {
    KernelWatch watch;
    outs = exe.run({xv});
    kernels = watch.kernels();
  }
  EXPECT_TRUE(outs[1].equal(xv.exp().view({2, 4})));
  EXPECT_EQ(kernels.back(), "aten::add.Tensor");
}

// Ops that return their operand, or a view of it, without their schema saying so: add_ in place
// would write the caller's input through _unsafe_view, a live value through unsafe_split, a
// constant through type_as. Inputs and constants are never written.
TEST(Runtime, OpsThatReturnUnmarkedAliasesAreNeverRunInPlaceOn) {
  auto g = std::make_shared<Graph>();
  Value* x = g->add_input("x", TensorMeta::contiguous({4, 4}, c10::kFloat, c10::kCPU), Role::Primal);
  Value* c = g->add_constant("c", at::ones({4, 4}));
  Builder b(*g);
  g->add_output(b.call("aten::add.Scalar", {b.call("aten::_unsafe_view", {x, std::vector<int64_t>{4, 4}}), 1.0}));
  g->add_output(b.call("aten::add.Tensor", {b.call("aten::type_as", {c, x}), x}));
  Value* a = b.call("aten::exp", {x});
  Value* s = b.emit("aten::unsafe_split.Tensor", {a, 2, 0})[0];
  g->add_output(b.call("aten::mul.Scalar", {s, 2.0}));
  g->add_output(b.call("aten::add.Scalar", {a, 0.5}));
  g->add_output(b.call("aten::sum_to_size", {b.call("aten::exp", {x}), std::vector<int64_t>{4, 4}}));
  g->add_output(g->outputs()[0]);  // returned twice: two tensors, as eager code would give
  // Ops that return their very input (one tensor, two names): atleast_1d of an input, of a constant.
  Value* c2 = g->add_constant("c2", at::arange(16, at::kFloat).view({4, 4}));
  g->add_output(b.call("aten::add.Tensor", {b.call("aten::mul.Scalar", {b.call("aten::atleast_1d", {x}), 10.0}), x}));
  g->add_output(b.call("aten::atleast_1d", {c2}));
  Executable exe{std::shared_ptr<const Graph>(g)};
  at::Tensor xv = at::randn({4, 4}), keep = xv.clone();
  for (int call = 0; call < 3; ++call) {
    auto outs = exe.run({xv});
    EXPECT_TRUE(xv.equal(keep)) << "call " << call;
    EXPECT_TRUE(outs[0].equal(keep + 1));
    EXPECT_TRUE(outs[1].equal(keep + 1));
    EXPECT_TRUE(outs[2].equal(keep.exp().split(2)[0] * 2));
    EXPECT_TRUE(outs[3].equal(keep.exp() + 0.5));
    EXPECT_FALSE(outs[5].is_same(outs[0]));
    EXPECT_TRUE(outs[6].equal(keep * 10 + keep));
    EXPECT_TRUE(outs[7].equal(at::arange(16, at::kFloat).view({4, 4})));
    outs[7].add_(100);  // a copy: the constant is untouched for the next call
  }
}

// A node whose tensors are all smaller than ATen's grain runs on the calling thread alone: under
// contention a parallel region for a few rows waits for every thread of its team to be
// scheduled. Larger nodes keep ATen's threads, and the caller's setting is restored.
TEST(Runtime, SmallNodesRunOnOneThread) {
  const int before = at::get_num_threads();  // ctest runs every test on one thread
  at::set_num_threads(2);
  struct Restore {
    int n;
    ~Restore() { at::set_num_threads(n); }
  } restore{before};
  const int threads = 2;
  for (int64_t n : {int64_t{16}, at::internal::GRAIN_SIZE}) {
    auto g = std::make_shared<Graph>();
    Value* x = g->add_input("x", TensorMeta::contiguous({n}, c10::kFloat, c10::kCPU), Role::Primal, true);
    g->add_output(Builder(*g).call("jvpc_runtime_test::threads_here", {x}), "y");
    Executable exe{std::shared_ptr<const Graph>(g)};
    at::Tensor y = exe.run({at::zeros({n})})[0];
    EXPECT_EQ(y[0].item<float>(), n < at::internal::GRAIN_SIZE ? 1 : threads) << n << " elements";
    EXPECT_EQ(at::get_num_threads(), threads);
  }
}

TEST(Runtime, ConcurrentCallsOnCpuAgree) {
  auto ex = test::make_example({"sdpa", "--seq-len", "32"});
  auto lin = linearize(ex.fn(), ex.inputs);
  std::vector<at::Tensor> tangents;
  for (const Input* in : lin.jvp_fn->arguments()) tangents.push_back(at::randn(in->value->meta().sizes));
  at::Tensor want = lin.jvp(tangents)[0];
  std::vector<at::Tensor> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = lin.jvp(tangents)[0]; });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_TRUE(g.equal(want));
}

TEST(Runtime, CudaGraphReplaysTheSeedTangentGraph) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto ex = examples::make("sdpa", {"--device", "cuda"});
  LinearizeOptions opt;
  auto lin = linearize(ex.fn(), ex.inputs, opt);
  ASSERT_TRUE(lin.jvp_fn->cuda_graph_enabled());
  Executable plain(lin.tangent_graph, ExecutableOptions::eager());
  std::vector<at::Tensor> tangents;
  for (const Input* in : lin.jvp_fn->arguments())
    tangents.push_back(at::randn(in->value->meta().sizes, at::device(at::kCUDA).dtype(in->value->meta().dtype)));
  at::Tensor first = lin.jvp(tangents)[0];  // runs eagerly, then captures
  EXPECT_TRUE(lin.jvp_fn->replaying_cuda_graph());
  EXPECT_TRUE(first.allclose(plain.run(tangents)[0], 1e-3, 1e-3));
  for (auto& t : tangents) t.normal_();
  at::Tensor replayed = lin.jvp(tangents)[0];
  at::Tensor expected = plain.run(tangents)[0];
  EXPECT_TRUE(replayed.allclose(expected, 1e-3, 1e-3));
  EXPECT_FALSE(replayed.allclose(first));
  // Writing into the captured buffers skips the input copies.
  auto buffers = lin.jvp_fn->input_buffers();
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(tangents[i]);
  EXPECT_TRUE(lin.jvp(buffers)[0].allclose(expected, 1e-3, 1e-3));
}

}  // namespace
}  // namespace jvpc
