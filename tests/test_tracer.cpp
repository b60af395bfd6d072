// The tracer: kernel-level graphs, the same ops LibTorch's profiler sees, functionalised
// in-place ops, impure ops, fused kernels, and unchanged results.
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "ir/printer.h"
#include "compiler/trace/tracer.h"
#include "runtime/executable.h"
#include "tests/helpers.h"
#include "tests/profiler.h"

#include <ATen/EmptyTensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/library.h>

namespace jvpc {
namespace {

std::vector<const Node*> nodes_of(const Graph& g, const std::string& op) {
  std::vector<const Node*> out;
  for (const Node* n : g.nodes())
    if (n->op() == op) out.push_back(n);
  return out;
}

bool contains(const std::string& s, const std::string& frag) { return s.find(frag) != std::string::npos; }

TEST(Tracer, SeedSdpaHasExactlyTwoBmmsOfTheExpectedShapes) {
  auto ex = test::make_example({"sdpa"});
  Trace t = trace(ex.fn(), ex.inputs);
  auto bmms = nodes_of(*t.graph, "aten::bmm");
  ASSERT_EQ(bmms.size(), 2u) << to_text(*t.graph);
  EXPECT_EQ(bmms[0]->input(0)->meta().sizes, (std::vector<int64_t>{5, 128, 64}));
  EXPECT_EQ(bmms[0]->input(1)->meta().sizes, (std::vector<int64_t>{5, 64, 128}));
  EXPECT_EQ(bmms[1]->input(0)->meta().sizes, (std::vector<int64_t>{5, 128, 128}));
  EXPECT_EQ(bmms[1]->input(1)->meta().sizes, (std::vector<int64_t>{5, 128, 64}));
  EXPECT_EQ(nodes_of(*t.graph, "aten::_safe_softmax").size(), 1u);
  EXPECT_EQ(nodes_of(*t.graph, "aten::scaled_dot_product_attention").size(), 0u);
  EXPECT_GE(nodes_of(*t.graph, "aten::transpose.int").size(), 1u);
  EXPECT_EQ(nodes_of(*t.graph, "aten::mul.Scalar").size(), 2u);  // sqrt(scale) on q and on kᵀ
}

// Arbitrary callables, not only the examples: the tracer's op list equals the kernel-level ops
// LibTorch's profiler records for the same callable run eagerly.
struct Callable {
  const char* name;
  TensorFn fn;
  std::vector<std::vector<int64_t>> shapes;
};

std::vector<Callable> callables() {
  return {
      {"matmul_softmax",
       [](const std::vector<at::Tensor>& x) {
         return std::vector<at::Tensor>{at::matmul(at::softmax(at::matmul(x[0], x[1].transpose(-2, -1)), -1), x[1])};
       },
       {{2, 3, 8, 4}, {2, 3, 8, 4}}},
      {"linear_gelu_norm",
       [](const std::vector<at::Tensor>& x) {
         return std::vector<at::Tensor>{at::layer_norm(at::gelu(at::linear(x[0], x[1], x[2])), {6})};
       },
       {{4, 5}, {6, 5}, {6}}},
      {"reshape_cat_sum",
       [](const std::vector<at::Tensor>& x) {
         auto y = at::cat({x[0].reshape({6, 2}), x[1].t()}, 0);
         return std::vector<at::Tensor>{y.sum(1), y.mean(), at::tanh(y).pow(2)};
       },
       {{3, 4}, {2, 5}}},
      {"views_and_selects",
       [](const std::vector<at::Tensor>& x) {
         auto parts = x[0].chunk(2, -1);
         return std::vector<at::Tensor>{parts[0] * parts[1].exp(), x[0].select(0, 1).unsqueeze(0).expand({3, 8})};
       },
       {{4, 8}}},
      {"masked_math",
       [](const std::vector<at::Tensor>& x) {
         auto m = x[0] > 0;
         return std::vector<at::Tensor>{at::where(m, x[0], x[1]).masked_fill(m.logical_not(), 0.5).sigmoid()};
       },
       {{5, 5}, {5, 5}}},
      {"sdpa_causal_gqa",
       [](const std::vector<at::Tensor>& x) {
         at::globalContext().setSDPUseFlash(false);
         auto o = at::scaled_dot_product_attention(x[0], x[1], x[2], std::nullopt, 0.0, true, std::nullopt, true);
         at::globalContext().setSDPUseFlash(true);
         return std::vector<at::Tensor>{o};
       },
       {{1, 4, 16, 8}, {1, 2, 16, 8}, {1, 2, 16, 8}}},
  };
}

class TracerMatchesProfiler : public ::testing::TestWithParam<size_t> {};

TEST_P(TracerMatchesProfiler, SameKernelsInTheSameOrder) {
  Callable c = callables()[GetParam()];
  std::vector<TraceInput> inputs;
  for (size_t i = 0; i < c.shapes.size(); ++i) inputs.push_back({"x" + std::to_string(i), at::randn(c.shapes[i])});
  Trace t = trace(c.fn, inputs, TraceOptions::graph_only());
  auto profiled = test::profile_kernels([&] { c.fn(test::values_of(inputs)); });
  std::vector<std::string> expected;
  for (const auto& k : profiled) expected.push_back(k.op);
  // Where int and float scalars make two overloads fit the profiler's record (mul.Scalar and
  // mul.Tensor with a wrapped number), compare names without the overload.
  ASSERT_EQ(t.kernels.size(), expected.size()) << c.name << "\n"
                                               << ::testing::PrintToString(t.kernels) << "\n"
                                               << ::testing::PrintToString(expected);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(split_op_name(std::string(t.kernels[i])).first, split_op_name(expected[i]).first)
        << c.name << " kernel " << i;
  EXPECT_GT(t.graph->num_nodes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Callables, TracerMatchesProfiler, ::testing::Range<size_t>(0, 6),
                         [](const auto& info) { return std::string(callables()[info.param].name); });

TEST(Tracer, InPlaceOpsOnIntermediatesBecomeFunctional) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor y = x[0] * 2;
    y.add_(1);
    y.mul_(x[0]);
    return std::vector<at::Tensor>{y};
  };
  at::Tensor x = at::randn({3, 3});
  Trace t = trace(fn, {{"x", x}});
  for (const Node* n : t.graph->nodes()) EXPECT_NE(n->op().find("_."), n->op().size() - 2) << n->op();
  EXPECT_EQ(nodes_of(*t.graph, "aten::add.Scalar").size(), 1u);
  EXPECT_EQ(nodes_of(*t.graph, "aten::mul.Tensor").size(), 1u);
  Executable exe(std::move(t.graph));
  EXPECT_TRUE(exe.run({x})[0].allclose(fn({x})[0]));
}

// unbind of a batch of 1 (and chunk(1)): the one part is linked to its base too, so a write into it
// reaches the base.
TEST(Tracer, AWriteIntoTheOnlyPartOfAnUnbindReachesTheBase) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor y = x[0] * 2;
    std::vector<at::Tensor> parts = y.unbind(0), chunks = y.chunk(1, 1);
    parts[0].mul_(x[0][0]);
    chunks[0].add_(1);
    return std::vector<at::Tensor>{y * y};
  };
  at::Tensor x = at::randn({1, 4}, at::kDouble), t = at::randn({1, 4}, at::kDouble);
  EXPECT_LT(test::rel_error(linearize(fn, {{"x", x}}).jvp({t})[0], forward_ad_jvp(fn, {x}, {t})[0]), 1e-12);
}

// pow_'s functional forms have other overload names: pow_.Scalar is pow.Tensor_Scalar (pow.Scalar
// is Scalar ** Tensor), pow_.Tensor is pow.Tensor_Tensor.
TEST(Tracer, InPlacePowersBecomeTheirFunctionalForms) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor a = x[0] * 2, b = x[0] + 1;
    a.pow_(3);
    b.pow_(x[1]);
    return std::vector<at::Tensor>{a + b};
  };
  std::vector<at::Tensor> x = {at::rand({4}, at::kDouble) + 0.5, at::rand({4}, at::kDouble)};
  std::vector<at::Tensor> t = {at::randn({4}, at::kDouble), at::randn({4}, at::kDouble)};
  Linearized lin = linearize(fn, {{"x", x[0]}, {"y", x[1]}});
  EXPECT_LT(test::rel_error(lin.jvp(t)[0], forward_ad_jvp(fn, x, {t[0], t[1]})[0]), 1e-12);
}

// index_add with an empty index (a graph without edges): LibTorch's C++ Meta kernel fails there,
// so its shape rule is jvpc's.
TEST(Tracer, IndexAddWithAnEmptyIndexLinearizes) {
  at::Tensor e = at::empty({0}, at::kLong);
  TensorFn fn = [e](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::zeros_like(x[0]).index_add(0, e, x[0].index_select(0, e) * 2) + x[0]};
  };
  at::Tensor x = at::randn({3, 2}, at::kDouble), t = at::randn({3, 2}, at::kDouble);
  EXPECT_TRUE(linearize(fn, {{"x", x}}).jvp({t})[0].equal(t));
}

TEST(Tracer, MaskedSdpaRecordsTheOutOfPlaceAdd) {
  auto ex = test::make_example({"sdpa", "--mask", "bool"});
  Trace t = trace(ex.fn(), ex.inputs);
  EXPECT_EQ(nodes_of(*t.graph, "aten::add_.Tensor").size(), 0u);
  EXPECT_EQ(nodes_of(*t.graph, "aten::add.Tensor").size(), 1u);
  EXPECT_TRUE(contains(std::string(t.kernels.front()), "aten::"));
  EXPECT_NE(std::find(t.kernels.begin(), t.kernels.end(), "aten::add_.Tensor"), t.kernels.end());
}

TEST(Tracer, WritingToAnInputIsAnErrorNamingTheOp) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    x[0].add_(1);
    return std::vector<at::Tensor>{x[0] * 2};
  };
  try {
    trace(fn, {{"x", at::randn({3})}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "aten::add_.Scalar writes in place to the input 'x' (f32[3])")) << e.what();
  }
}

// In-place writes through views reach their base, as functionalization does: the tracer
// records base' = slice_scatter(base, view', ...) (select_scatter, diagonal_scatter, or the
// inverse view), and views read after a write are taken again from their base's new value.
TEST(Tracer, WritesThroughViewsReachTheirBase) {
  using T = const std::vector<at::Tensor>&;
  std::vector<std::pair<const char*, TensorFn>> cases = {
      {"view",
       [](T x) {
         at::Tensor y = x[0] * 2;
         y.view({-1}).add_(1);
         return std::vector<at::Tensor>{y * x[0]};
       }},
      {"select fill_",
       [](T x) {
         at::Tensor y = x[0] * 2;
         y.select(1, 0).fill_(3);
         return std::vector<at::Tensor>{y * x[0]};
       }},
      {"slice copy_",
       [](T x) {
         at::Tensor y = x[0].sin();
         y.slice(0, 1, 3).copy_(x[0].slice(0, 0, 2).exp());
         return std::vector<at::Tensor>{y * x[0]};
       }},
      {"select of select",
       [](T x) {
         at::Tensor y = x[0] * x[0];
         y.select(0, 1).select(0, 2).mul_(x[0][0][0]);
         return std::vector<at::Tensor>{y};
       }},
      {"a sibling view, taken again",
       [](T x) {
         at::Tensor y = x[0] * 2, a = y.slice(0, 0, 2), b = y.slice(0, 1, 3);
         a.mul_(x[0].slice(0, 0, 2));
         return std::vector<at::Tensor>{b * 1.5, y};
       }},
      {"transpose, diagonal",
       [](T x) {
         at::Tensor y = x[0].cos();
         y.t().diagonal().mul_(3);
         return std::vector<at::Tensor>{y};
       }},
      {"a view of the written base",
       [](T x) {
         at::Tensor y = x[0] * 2, v = y.unsqueeze(0);
         y.mul_(x[0]);
         return std::vector<at::Tensor>{v.sum(1)};
       }},
      {"circular padding",
       [](T x) {
         return std::vector<at::Tensor>{at::pad(x[0].unsqueeze(0), {1, 2}, "circular")};
       }},
  };
  for (const auto& [name, fn] : cases) {
    SCOPED_TRACE(name);
    at::Tensor x = at::randn({3, 3}, at::kDouble), t = at::randn({3, 3}, at::kDouble);
    Trace tr = trace(fn, {{"x", x}}, TraceOptions::graph_only());
    std::vector<at::Tensor> want = fn({x}), got = Executable(std::move(tr.graph)).run({x});
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].allclose(want[i])) << i;
    Linearized lin = linearize(fn, {{"x", x}});
    std::vector<at::Tensor> ad = forward_ad_jvp(fn, {x}, {t}), jvp = lin.jvp({t});
    for (size_t i = 0; i < ad.size(); ++i) EXPECT_LT(test::rel_error(jvp[i], ad[i]), 1e-12) << i;
  }
}

// A view taken again from its base and then written in place (rotary embeddings written into
// halves) keeps its pre-write value for folding. In-place view ops (t_, unsqueeze_) change
// metadata, not data: they are not writes, and write no transposed copy into the base. A view of
// at::tensor's values replays those values, not uninitialized memory.
TEST(Tracer, InPlaceViewsAndRetakenViewsKeepTheirValues) {
  using T = const std::vector<at::Tensor>&;
  std::vector<std::pair<const char*, TensorFn>> cases = {
      {"a view taken again, then written",
       [](T x) {
         at::Tensor y = x[0] * 1, b = y.slice(0, 1, 3);
         y.select(0, 0).fill_(0);
         b.sin_();
         return std::vector<at::Tensor>{y};
       }},
      {"rotary halves",
       [](T x) {
         at::Tensor y = x[0] * 1, x1 = y.slice(1, 0, 2), x2 = y.slice(1, 2, 4);
         at::Tensor c = x[0].slice(1, 0, 2).cos(), s = x[0].slice(1, 2, 4).sin(), x1c = x1.clone();
         x1.mul_(c).sub_(x2 * s);
         x2.mul_(c).add_(x1c * s);
         return std::vector<at::Tensor>{y};
       }},
      {"t_ after a view",
       [](T x) {
         at::Tensor y = x[0] * 1, r = y.select(0, 0);
         y.t_();
         return std::vector<at::Tensor>{r + 0, y * 2};
       }},
      {"t_ of a slice",
       [](T x) {
         at::Tensor y = x[0] * 1, s = y.slice(1, 0, 2);
         s.t_();
         return std::vector<at::Tensor>{y + 0, s + 0};
       }},
      {"unsqueeze_, then an older view",
       [](T x) {
         at::Tensor y = x[0] * 2, s = y.slice(0, 0, 2);
         y.unsqueeze_(0);
         return std::vector<at::Tensor>{s * 1, y.sin()};
       }},
      {"transpose_, then a write",
       [](T x) {
         at::Tensor y = x[0] * 2;
         y.transpose_(0, 1);
         y.select(0, 1).mul_(3);
         return std::vector<at::Tensor>{y};
       }},
      {"a view of a tensor literal",
       [](T x) {
         at::Tensor c = at::tensor({1., 2., 3., 4.}, at::kDouble).view({4, 1});
         return std::vector<at::Tensor>{x[0] * c};
       }},
      // kept values that are the restrided tensor itself keep their metadata; a tensor literal
      // written in part replays its values, not uninitialized memory; batch norm's running
      // statistics, when traced values, are not written where the tracer cannot see it
      {"t_ after its value was used",
       [](T x) {
         at::Tensor h = x[0].slice(0, 0, 3).sin(), p = h * x[0].slice(0, 0, 3);
         h.t_();
         return std::vector<at::Tensor>{p, h * 1};
       }},
      {"a tensor literal written in part",
       [](T x) {
         at::Tensor c = at::tensor({1., 2., 3., 4.}, at::kDouble);
         c.slice(0, 0, 1).fill_(5);
         return std::vector<at::Tensor>{x[0] * c};
       }},
      {"running statistics that are traced values",
       [](T x) {
         at::Tensor rm = at::zeros({4}, x[0].options()), rv = at::ones({4}, x[0].options());
         at::Tensor s = x[0] * (rm + 1);
         at::Tensor y = at::batch_norm(x[0], {}, {}, rm, rv, true, 0.1, 1e-5, false);
         return std::vector<at::Tensor>{s + y};
       }},
  };
  for (const auto& [name, fn] : cases) {
    SCOPED_TRACE(name);
    at::Tensor x = at::randn({4, 4}, at::kDouble), t = at::randn({4, 4}, at::kDouble),
               x2 = at::randn({4, 4}, at::kDouble);
    Trace tr = trace(fn, {{"x", x}}, TraceOptions::graph_only());
    Executable exe(std::move(tr.graph));
    for (const at::Tensor& in : {x, x2}) {  // the traced inputs, and others
      std::vector<at::Tensor> want = fn({in}), got = exe.run({in});
      for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].allclose(want[i])) << i;
    }
    Linearized lin = linearize(fn, {{"x", x}});
    std::vector<at::Tensor> ad = forward_ad_jvp(fn, {x}, {t}), jvp = lin.jvp({t});
    for (size_t i = 0; i < ad.size(); ++i) EXPECT_LT(test::rel_error(jvp[i], ad[i]), 1e-12) << i;
  }
}

// t_ on a tensor the tracer meets for the first time there (memory the callable wraps): it is
// captured, with the metadata it had, not the one t_ gives it.
TEST(Tracer, AConstantCapturedByAnInPlaceViewOpKeepsItsMetadata) {
  auto buf = std::make_shared<std::vector<double>>(std::vector<double>{1, 2, 3, 4, 5, 6});
  TensorFn fn = [buf](const std::vector<at::Tensor>& x) {
    at::Tensor c = at::from_blob(buf->data(), {2, 3}, at::kDouble);
    c.t_();
    return std::vector<at::Tensor>{at::mm(x[0], c)};
  };
  Trace tr = trace(fn, {{"x", at::randn({4, 3}, at::kDouble)}}, TraceOptions::graph_only());
  at::Tensor x2 = at::randn({4, 3}, at::kDouble);
  EXPECT_TRUE(Executable(std::move(tr.graph)).run({x2})[0].allclose(fn({x2})[0]));
}

TEST(Tracer, StorageChangesAndReadsOfUpdatedRunningStatisticsAreErrors) {
  TensorFn resize = [](const std::vector<at::Tensor>& x) {
    at::Tensor y = x[0] * 1;
    y.resize_({2});
    return std::vector<at::Tensor>{y};
  };
  test::expect_error([&] { trace(resize, {{"x", at::randn({3})}}); }, "aten::resize_ changes a tensor's storage");
  TensorFn stats = [](const std::vector<at::Tensor>& x) {
    at::Tensor rm = at::zeros({3}, x[0].options()), rv = at::ones({3}, x[0].options());
    at::Tensor y = at::batch_norm(x[0], {}, {}, rm, rv, true, 0.1, 1e-5, false);
    return std::vector<at::Tensor>{y, rm * 1};
  };
  test::expect_error([&] { trace(stats, {{"x", at::randn({4, 3})}}); }, "in-place op wrote");
}

TEST(Tracer, AliasesMadeOutsideTheDispatcherAreAnErrorInTraces) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{(x[0] * 2).data() * x[0]}; };
  test::expect_error(
      [&] {
        trace(fn, {{"x", at::randn({3})}});
      },
      "aliases a value computed from the inputs but was made outside");
  at::Tensor x = at::randn({3}, at::kDouble),
             t = at::randn({3}, at::kDouble);  // linearize: a constant, as in forward AD
  EXPECT_LT(test::rel_error(linearize(fn, {{"x", x}}).jvp({t})[0], forward_ad_jvp(fn, {x}, {t})[0]), 1e-12);
  TensorFn foreach = [](const std::vector<at::Tensor>& x) {
    std::vector<at::Tensor> l = {x[0] * 1};
    at::_foreach_mul_(l, 2.0);
    return l;
  };
  test::expect_error(
      [&] {
        trace(foreach, {{"x", at::randn({3})}});
      },
      "aten::_foreach_mul_.Scalar writes in place to a list of tensors");
}

// torch:: factories (and Python's) return the kernel's result in a new TensorImpl on its storage
// (make_variable's shallow copy, since the tracer holds the original): that is the factory's
// result, recorded as a node, however the traced code uses it: read, combined with inputs, or
// written slice by slice. A shallow copy of a value computed from the inputs (.data()) stays an
// error, above.
TEST(Tracer, FactoryResultsReturnedAsShallowCopiesAreTheirNodes) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor ones = torch::ones_like(x[0]) * x[0];
    at::Tensor buf = torch::zeros({2, 6}, x[0].options());
    buf.slice(1, 0, 3).copy_(x[0].sin());
    buf.slice(1, 3, 6).copy_(x[0].cos());
    return std::vector<at::Tensor>{ones + buf.sum(0, true).narrow(1, 0, 3), torch::full_like(x[0], 2.0)};
  };
  at::Tensor x = at::randn({2, 3}, at::kDouble), t = at::randn({2, 3}, at::kDouble);
  Trace tr = trace(fn, {{"x", x}}, TraceOptions::graph_only());
  EXPECT_EQ(nodes_of(*tr.graph, "aten::ones_like").size(), 1u) << to_text(*tr.graph);
  EXPECT_EQ(nodes_of(*tr.graph, "aten::zeros").size(), 1u) << to_text(*tr.graph);
  EXPECT_EQ(nodes_of(*tr.graph, "aten::full_like").size(), 1u) << to_text(*tr.graph);
  for (const Input& in : tr.graph->inputs()) EXPECT_NE(in.role, Role::Constant) << in.name;
  EXPECT_LT(test::rel_error(linearize(fn, {{"x", x}}).jvp({t})[0], forward_ad_jvp(fn, {x}, {t})[0]), 1e-12);
}

// A write through a view jvpc cannot take again (unfold) leaves its base unreadable.
TEST(Tracer, ReadingAStaleViewIsAnError) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor y = x[0] * 2;
    y.unfold(0, 2, 2).add_(1);  // writes y's storage through an unfold
    return std::vector<at::Tensor>{y + 1};
  };
  try {
    trace(fn, {{"x", at::randn({4})}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "in-place")) << e.what();
  }
}

TEST(Tracer, OutVariantsAreRejectedByName) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor out = at::empty_like(x[0]);
    at::add_out(out, x[0], x[0]);
    return std::vector<at::Tensor>{out};
  };
  try {
    trace(fn, {{"x", at::randn({3})}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "aten::add.out writes to its argument 'out'")) << e.what();
  }
}

TEST(Tracer, RandomOpsAreImpureAndZeroDropoutIsNot) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{x[0] + at::rand({4}), std::get<0>(at::native_dropout(x[0], 0.0, true))};
  };
  Trace t = trace(fn, {{"x", at::randn({4})}});
  auto rand = nodes_of(*t.graph, "aten::rand");
  ASSERT_EQ(rand.size(), 1u);
  EXPECT_TRUE(rand[0]->impure());
  auto drop = nodes_of(*t.graph, "aten::native_dropout");
  ASSERT_EQ(drop.size(), 1u);
  EXPECT_FALSE(drop[0]->impure());
}

TEST(Tracer, FusedAttentionIsOneNodeWithItsOutputs) {
  auto ex = test::make_example({"sdpa", "--backend", "flash"});
  Trace t = trace(ex.fn(), ex.inputs);
  auto fused = nodes_of(*t.graph, "aten::_scaled_dot_product_flash_attention_for_cpu");
  ASSERT_EQ(fused.size(), 1u) << to_text(*t.graph);
  EXPECT_EQ(fused[0]->outputs().size(), 2u);  // output and logsumexp
  EXPECT_EQ(fused[0]->output(1)->meta().sizes, (std::vector<int64_t>{1, 5, 128}));
  EXPECT_EQ(nodes_of(*t.graph, "aten::bmm").size(), 0u);
}

TEST(Tracer, MultipleOutputsViewsAndNestedCallables) {
  TensorFn inner = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0].t(), x[0].exp()}; };
  TensorFn outer = [inner](const std::vector<at::Tensor>& x) {
    auto a = inner(x);
    auto parts = a[1].split(2, 0);
    return std::vector<at::Tensor>{a[0], parts[0], parts[1] * 3, x[0]};
  };
  at::Tensor x = at::randn({4, 3});
  Trace t = trace(outer, {{"x", x}});
  EXPECT_EQ(t.graph->outputs().size(), 4u);
  EXPECT_EQ(t.graph->outputs()[3], t.graph->inputs()[0].value);  // returning an input
  auto split = nodes_of(*t.graph, "aten::split.Tensor");
  ASSERT_EQ(split.size(), 1u);
  EXPECT_EQ(split[0]->outputs().size(), 2u);
  Executable exe(std::move(t.graph));
  auto got = exe.run({x});
  auto want = outer({x});
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << i;
}

TEST(Tracer, CapturedTensorsBecomeConstants) {
  at::Tensor w = at::randn({3, 3});
  Trace t = trace([w](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{at::mm(x[0], w)}; },
                  {{"x", at::randn({2, 3})}});
  ASSERT_EQ(t.graph->inputs().size(), 2u);
  EXPECT_EQ(t.graph->inputs()[1].role, Role::Constant);
  EXPECT_TRUE(t.graph->inputs()[1].data.equal(w));
}

// at::tensor({...}) allocates through the dispatcher (empty) and copies its values in by
// pointer, which no tracer sees. The values are captured when first read, so the graph replays
// them instead of uninitialized memory; an empty that is filled (fill_, copy_) stays in the graph.
TEST(Tracer, ValuesWrittenOutsideTheDispatcherAreCaptured) {
  auto fn = [](const std::vector<at::Tensor>& x) {
    at::Tensor i = at::tensor({3, 0, 3}, at::kLong);
    at::Tensor ones = at::empty({4}, x[0].options()).fill_(1.0);
    return std::vector<at::Tensor>{x[0].index_select(0, i) + ones, x[0].index({at::tensor({1, 2}, at::kLong)})};
  };
  at::Tensor x = at::randn({4, 4});
  Trace t = trace(fn, {{"x", x}}, TraceOptions::graph_only());
  EXPECT_EQ(nodes_of(*t.graph, "aten::empty.memory_format").size(), 1u) << to_text(*t.graph);
  EXPECT_EQ(nodes_of(*t.graph, "aten::fill.Scalar").size(), 1u);
  Executable exe(std::move(t.graph));
  auto want = fn({x}), got = exe.run({x});
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << i;
}

// A decomposed op whose kernel fills an `empty` in a plain loop: captured like at::tensor's
// values, its result would be a constant and its tangent silently zero (CPU max_pool1d does
// this; the tracer runs it as max_pool1d_with_indices).
at::Tensor filled_outside(const at::Tensor& x) {
  at::Tensor c = x.contiguous();
  at::Tensor out = at::empty(c.sizes(), c.options());
  for (int64_t i = 0; i < c.numel(); ++i) out.data_ptr<float>()[i] = 2 * c.const_data_ptr<float>()[i];
  return out + 0;
}
TORCH_LIBRARY_FRAGMENT(jvpc_test, m) {
  m.def("filled_outside(Tensor x) -> Tensor");
  m.impl("filled_outside", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(filled_outside));
}

TEST(Tracer, AnOpComputingOutsideTheDispatcherIsAnErrorNamingIt) {
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("jvpc_test::filled_outside", "")
                .typed<at::Tensor(const at::Tensor&)>();
  TensorFn fn = [op](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{op.call(x[0])}; };
  test::expect_error(
      [&] {
        trace(fn, {{"x", at::randn({3})}});
      },
      "jvpc_test::filled_outside computes its result outside the dispatcher, where jvpc's tracer cannot see it");
}

TEST(Tracer, MaxPool1dIsTracedThroughItsKernelWithIndices) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::max_pool1d(x[0], {2}, {1})};
  };
  at::Tensor x = at::randn({2, 3, 8}, at::kDouble), t = at::randn({2, 3, 8}, at::kDouble);
  Linearized lin = linearize(fn, {{"x", x}});
  EXPECT_TRUE(lin.primal_outputs[0].equal(at::max_pool1d(x, {2}, {1})));
  EXPECT_LT(test::rel_error(lin.jvp({t})[0], forward_ad_jvp(fn, {x}, {t})[0]), 1e-12);
}

// _shape_as_tensor fills its result outside the dispatcher too, but from the sizes alone: a
// constant of the (static) shapes, not an error (was a false positive).
TEST(Tracer, ShapeAsTensorIsAConstantOfTheShapes) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{x[0] * at::_shape_as_tensor(x[0]).to(at::kDouble).sum()};
  };
  at::Tensor x = at::randn({3, 5}, at::kDouble), t = at::randn({3, 5}, at::kDouble);
  Linearized lin = linearize(fn, {{"x", x}});
  EXPECT_TRUE(lin.primal_outputs[0].equal(x * 8));
  EXPECT_TRUE(lin.jvp({t})[0].equal(t * 8));
}

// A decomposed op returning a tensor that no kernel made: allocated and filled where the
// dispatcher does not see it (at::detail::empty_cpu, then a plain loop).
at::Tensor doubled_outside(const at::Tensor& x) {
  at::Tensor c = x.contiguous();
  at::Tensor out =
      at::detail::empty_cpu(c.sizes(), c.scalar_type(), std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  for (int64_t i = 0; i < c.numel(); ++i) out.data_ptr<float>()[i] = 2 * c.const_data_ptr<float>()[i];
  return out;
}
TORCH_LIBRARY(jvpc_test, m) {
  m.def("doubled_outside(Tensor x) -> Tensor");
  m.impl("doubled_outside", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(doubled_outside));
}

TEST(Tracer, ADecomposedOpReturningATensorNoKernelMadeIsAnError) {
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("jvpc_test::doubled_outside", "")
                .typed<at::Tensor(const at::Tensor&)>();
  TensorFn fn = [op](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{op.call(x[0] + 1)}; };
  test::expect_error(
      [&] {
        trace(fn, {{"x", at::randn({3})}});
      },
      "jvpc_test::doubled_outside computes its result outside the dispatcher");
}

// Batch norm in training mode writes its running statistics, which its schema does not say
// (replaying such a graph would write them again, into the caller's tensors).
TEST(Tracer, BatchNormInTrainingModeRecordsNoRunningStatistics) {
  TensorFn fn = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::batch_norm(x[0], {}, {}, x[1], x[2], true, 0.5, 1e-5, false)};
  };
  at::Tensor x = at::randn({4, 3}), mean = at::zeros({3}), var = at::ones({3});
  Trace t = trace(fn, {{"x", x}, {"mean", mean, false}, {"var", var, false}}, TraceOptions::graph_only());
  at::Tensor once = mean.clone();
  EXPECT_FALSE(once.equal(at::zeros({3})));  // the tracing run updated them, as eager does
  const Node* bn = nodes_of(*t.graph, "aten::native_batch_norm").at(0);
  EXPECT_EQ(bn->arg(3).kind, ArgKind::None);
  EXPECT_EQ(bn->arg(4).kind, ArgKind::None);
  Executable exe(std::move(t.graph));
  at::Tensor out = exe.run({x, mean, var}).at(0);
  EXPECT_TRUE(mean.equal(once));  // replaying changed nothing
  // Two float32 kernels for one normalization: equal to rounding (an output near 0 is outside
  // allclose's default absolute tolerance, 1e-8, on some draws of x).
  EXPECT_TRUE(out.allclose(at::batch_norm(x, {}, {}, {}, {}, true, 0.5, 1e-5, false), 1e-5, 1e-6));
}

// item() on a traced value: the graph would replay the number as a constant.
TEST(Tracer, ScalarsReadFromTracedValuesAreAnError) {
  TensorFn item = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{x[0] * x[0].sum().item<float>()};
  };
  test::expect_error(
      [&] {
        trace(item, {{"x", at::randn({3})}});
      },
      "aten::_local_scalar_dense reads a value computed from the inputs into a C++ scalar");
  TensorFn branch = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::equal(x[0], x[0].relu()) ? x[0] : -x[0]};
  };
  test::expect_error(
      [&] {
        trace(branch, {{"x", at::randn({3})}});
      },
      "aten::equal reads a value computed from the inputs");
  TensorFn close = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{at::allclose(x[0], x[0].relu()) ? x[0] : -x[0]};
  };
  test::expect_error(
      [&] {
        trace(close, {{"x", at::randn({3})}});
      },
      "aten::allclose reads a value computed from the inputs");
  // A captured constant's scalar is a constant.
  at::Tensor c = at::full({}, 3.0);
  TensorFn constant = [c](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0] * c.item<float>()}; };
  EXPECT_NO_THROW(trace(constant, {{"x", at::randn({3})}}));
  // linearize specializes on such numbers, as LibTorch's forward AD does: an index picked by
  // argmax (which indexing reads with item()) is a constant there.
  TensorFn pick = [](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{x[0].index({at::argmax(x[0])}) * x[0]};
  };
  at::Tensor x = at::randn({5}, at::kDouble), t = at::randn({5}, at::kDouble);
  Linearized lin = linearize(pick, {{"x", x}});
  EXPECT_TRUE(lin.jvp({t})[0].allclose(forward_ad_jvp(pick, {x}, {t})[0]));
}

// A captured tensor written in place would change the constant the graph replays; LibTorch's own
// errors inside the callable are many lines; sparse inputs are not supported.
TEST(Tracer, BadCallablesAndInputsAreOneLineErrors) {
  // A name the loader would refuse (such a graph would save but not load back).
  test::expect_error(
      [] {
        trace([](const std::vector<at::Tensor>& x) { return x; }, {{"a\nb", at::ones({2})}});
      },
      "input name contains a control character");
  at::Tensor c = at::ones({3});
  auto writes_captured = [c](const std::vector<at::Tensor>& x) {
    at::Tensor cc = c;
    cc.add_(1);
    return std::vector<at::Tensor>{x[0] * cc};
  };
  test::expect_error(
      [&] {
        trace(writes_captured, {{"x", at::randn({3})}});
      },
      "aten::mul.Tensor reads a tensor the callable captured after it was written in place by aten::add_.Scalar "
      "(f32[3]), which the graph does not record; pass that tensor as an input instead");
  EXPECT_TRUE(c.equal(at::full({3}, 2.0)));  // the callable ran as eager code would, up to the read
  auto fails = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0].mm(x[0])}; };
  try {
    trace(fails, {{"x", at::randn({3})}});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("the traced callable failed: ", 0), 0u) << msg;
  }
  auto twice = [](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0] * 2}; };
  test::expect_error([&] { trace(twice, {{"x", at::randn({3, 3}).to_sparse()}}); }, "input 'x' is a Sparse tensor");
}

class TracingChangesNothing : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(TracingChangesNothing, TracedRunAndGraphRunEqualEager) {
  auto ex = test::make_example(GetParam());
  auto eager = ex.fn()(test::values_of(ex.inputs));
  Trace t = trace(ex.fn(), ex.inputs);
  ASSERT_EQ(t.outputs.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(t.outputs[i].equal(eager[i]));
  Executable exe(std::move(t.graph));
  auto replay = exe.run(test::values_of(ex.inputs));
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(replay[i].allclose(eager[i], 1e-5, 1e-6)) << i;
}

TEST(TracingChangesNothingOnCuda, EveryExample) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (auto cfg : test::example_configs()) {
    std::vector<std::string> flags(cfg.begin() + 1, cfg.end());
    if (std::find(flags.begin(), flags.end(), "flash") != flags.end()) continue;  // the CPU flash kernel
    flags.insert(flags.end(), {"--device", "cuda", "--dtype", "float32"});
    auto ex = examples::make(cfg[0], flags);
    auto eager = ex.fn()(test::values_of(ex.inputs));
    Trace t = trace(ex.fn(), ex.inputs);
    Executable exe(std::move(t.graph));
    auto replay = exe.run(test::values_of(ex.inputs));
    for (size_t i = 0; i < eager.size(); ++i)
      EXPECT_TRUE(replay[i].allclose(eager[i], 1e-4, 1e-5)) << test::config_name(cfg);
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, TracingChangesNothing, ::testing::ValuesIn(test::example_configs()),
                         [](const auto& info) { return "config" + std::to_string(info.index); });

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// A module's counter (BatchNorm's num_batches_tracked += 1) is a captured tensor written and
// never read: written once, as eager code would, and not recorded, like the running statistics.
TEST(Tracer, ACapturedCounterWrittenAndNeverReadIsWrittenOnceAndNotRecorded) {
  at::Tensor count = at::zeros({}, at::kLong), mean = at::zeros({3}), var = at::ones({3});
  auto bn = [&](const std::vector<at::Tensor>& x) {
    count.add_(1);
    return std::vector<at::Tensor>{at::batch_norm(x[0], {}, {}, mean, var, true, 0.1, 1e-5, false)};
  };
  Trace t = trace(bn, {{"x", at::randn({4, 3})}});
  EXPECT_EQ(count.item<int64_t>(), 1);
  for (const Node* n : t.graph->nodes()) EXPECT_NE(n->op(), "aten::add.Scalar") << to_text(*t.graph);
  EXPECT_GT(mean.abs().sum().item<double>(), 0);  // the running statistics were updated, once
}

// Generated names never collide with the user's: an LSTM's initial cell state is naturally c0.
TEST(Tracer, CapturedConstantsAreNamedApartFromTheInputs) {
  at::Tensor w = at::randn({3});
  auto fn = [w](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0] * w + x[1]}; };
  Trace t = trace(fn, {{"c0", at::randn({3})}, {"c1", at::randn({3})}});
  std::vector<std::string> names;
  for (const Input& in : t.graph->inputs()) names.push_back(in.name);
  EXPECT_EQ(names, (std::vector<std::string>{"c0", "c1", "c2"}));
}

}  // namespace
}  // namespace jvpc
