// The IR: building graphs, use lists, mutation, cloning and the text form.
#include "ir/builder.h"
#include "ir/dtypes.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

namespace jvpc {
namespace {

using test::f32;

TEST(Ir, BuilderInfersOutputMetadataAndFillsDefaults) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 3}), Role::Primal, true);
  Value* w = g.add_input("w", f32({3, 4}), Role::Primal, true);
  Builder b(g);
  Value* y = b.call("aten::mm", {x, w});
  Value* s = b.call("aten::sum.dim_IntList", {y, std::vector<int64_t>{-1}, true});
  EXPECT_EQ(y->meta().sizes, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(s->meta().sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(s->producer()->args().size(), 4u);  // dtype took its default (None)
  EXPECT_EQ(s->producer()->arg(3).kind, ArgKind::None);
  verify(g);
}

TEST(Ir, UseListsFollowReplaceAllUsesWith) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::neg", {x});
  Value* c = b.call("aten::exp", {a});
  Value* d = b.call("aten::add.Tensor", {a, c});
  g.add_output(d);
  EXPECT_EQ(a->uses().size(), 2u);
  a->replace_all_uses_with(x);
  EXPECT_FALSE(a->has_uses());
  EXPECT_EQ(x->uses().size(), 3u);  // neg, exp, add
  g.erase(a->producer());
  EXPECT_EQ(g.num_nodes(), 2u);
  verify(g);
}

TEST(Ir, DotEscapesQuotesAndBackslashesInNames) {
  Graph g;
  Value* x = g.add_input("a\"b\\", test::f32({2}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::neg", {x}), "o\"");
  std::string dot = to_dot(g, "t\"");
  EXPECT_NE(dot.find("digraph \"t\\\"\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("label=\"a\\\"b\\\\\\n"), std::string::npos) << dot;
  EXPECT_NE(dot.find("label=\"o\\\"\"]"), std::string::npos) << dot;
}

TEST(Ir, EraseRefusesUsedNodes) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::neg", {x});
  b.call("aten::exp", {a});
  EXPECT_THROW(g.erase(a->producer()), Error);
}

TEST(Ir, InsertionPointPlacesNodesBefore) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* e = b.call("aten::exp", {x});
  {
    InsertionGuard at(g, e->producer());
    b.call("aten::neg", {x});
    EXPECT_EQ(g.insertion_point(), e->producer());
  }
  EXPECT_EQ(g.insertion_point(), nullptr);
  b.call("aten::sin", {x});
  ASSERT_EQ(g.nodes().size(), 3u);
  EXPECT_EQ(g.nodes()[0]->op(), "aten::neg");
  EXPECT_EQ(g.nodes()[2]->op(), "aten::sin");
}

TEST(Ir, InsertionGuardRestoresWhenItsScopeThrows) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* e = b.call("aten::exp", {x});
  EXPECT_THROW(
      {
        InsertionGuard at(g, e->producer());
        b.call("aten::neg", {x});
        throw Error("a rule that fails");
      },
      Error);
  EXPECT_EQ(g.insertion_point(), nullptr);
  // Nested guards restore in turn; a saved point whose node is erased moves to the next node.
  Value* n = b.call("aten::neg", {x});
  Value* s = b.call("aten::sin", {x});
  {
    InsertionGuard outer(g, n->producer());
    {
      InsertionGuard inner(g, e->producer());
      g.erase(n->producer());
    }
    EXPECT_EQ(g.insertion_point(), s->producer());  // the node after the erased one
  }
  EXPECT_EQ(g.insertion_point(), nullptr);
}

TEST(Ir, OutputsAreUsesOfTheReturnNode) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::neg", {x});
  Value* c = b.call("aten::exp", {x});
  g.add_output(a, "a");
  g.add_output(c, "c");
  g.add_output(a, "a2");
  ASSERT_EQ(a->uses().size(), 2u);
  EXPECT_TRUE(a->uses()[0].user->is_return());
  EXPECT_EQ(a->uses()[0].user, g.return_node());
  EXPECT_TRUE(a->is_graph_output());
  EXPECT_FALSE(x->is_graph_output());
  EXPECT_EQ(g.nodes().size(), 2u);  // the return node is not among the nodes
  EXPECT_THROW(g.erase(a->producer()), Error);
  // Replacing a value replaces it as an output; the outputs after an erased one move up.
  a->replace_all_uses_with(c);
  EXPECT_FALSE(a->has_uses());
  EXPECT_EQ(g.outputs(), (std::vector<Value*>{c, c, c}));
  g.erase(a->producer());
  g.erase_output(0);
  EXPECT_EQ(g.output_names(), (std::vector<std::string>{"c", "a2"}));
  ASSERT_EQ(c->uses().size(), 2u);
  EXPECT_EQ(c->uses()[0].user, g.return_node());
  EXPECT_EQ(c->uses()[0].index, 0u);
  EXPECT_EQ(c->uses()[1].index, 1u);
  verify(g);
  EXPECT_THROW(g.erase_output(2), Error);
}

TEST(Ir, ErasedValuesAreNotInputs) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Value* unused = g.add_input("u", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::neg", {x});
  g.add_output(x);
  EXPECT_THROW(g.erase_inputs_if([](const Input&) { return true; }), Error);  // x is returned
  EXPECT_EQ(g.inputs().size(), 2u);                                           // none erased
  g.erase(a->producer());
  EXPECT_TRUE(a->erased());
  EXPECT_FALSE(g.is_input(a));
  EXPECT_EQ(a->producer(), nullptr);
  EXPECT_EQ(g.erase_inputs_if([&](const Input& in) { return in.value == unused; }), 1u);
  EXPECT_TRUE(unused->erased());
  EXPECT_FALSE(x->erased());
  EXPECT_FALSE(g.is_input(unused));
  EXPECT_THROW(g.add_output(a), Error);
  verify(g);
}

// erase_inputs_if checks every chosen input before it erases any: an unread input chosen before
// a returned one stays.
TEST(Ir, EraseInputsIfErasesNoneWhenOneIsReturned) {
  Graph g;
  Value* unused = g.add_input("u", f32({4}), Role::Primal);
  Value* y = g.add_input("y", f32({4}), Role::Primal);
  g.add_output(y);
  EXPECT_THROW(g.erase_inputs_if([](const Input&) { return true; }), Error);
  EXPECT_EQ(g.inputs().size(), 2u);
  EXPECT_FALSE(unused->erased());
  EXPECT_TRUE(g.is_input(unused));
  verify(g);
}

TEST(Ir, CloneIsIndependentAndEqualInText) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 2}), Role::Primal, true);
  g.add_constant("c", at::ones({2, 2}));
  Builder b(g);
  g.add_output(b.call("aten::mul.Scalar", {x, 0.5}));
  auto c = g.clone();
  EXPECT_EQ(to_text(g), to_text(*c));
  EXPECT_TRUE(c->inputs()[1].data.equal(g.inputs()[1].data));
  verify(*c);
}

TEST(Ir, TextFormIsOneLinePerNode) {
  Graph g;
  Value* x = g.add_input("x", f32({5, 128, 64}), Role::Primal, true);
  Value* w = g.add_input("w", f32({5, 64, 128}), Role::Primal, true);
  Builder b(g);
  g.add_output(b.call("aten::bmm", {x, w}));
  EXPECT_EQ(to_text(g),
            "graph(%0 : f32[5,128,64] x,\n"
            "      %1 : f32[5,64,128] w):\n"
            "  %2 : f32[5,128,128] = aten::bmm(%0, %1)\n"
            "  return (%2 out0)\n");
}

TEST(Ir, NumelOverflowIsAnError) {
  EXPECT_THROW(f32({1LL << 40, 1LL << 40}), Error);  // contiguous strides would overflow
  TensorMeta m{{1LL << 40, 1LL << 40}, {1, 1}, c10::kFloat, c10::kCPU};
  EXPECT_THROW(m.numel(), Error);
  EXPECT_THROW(m.is_contiguous(), Error);
}

TEST(Ir, UnknownOpIsAnErrorNamingIt) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  try {
    b.call("aten::no_such_op", {x});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aten::no_such_op"), std::string::npos);
  }
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// The hand-written shape rules (ops for which LibTorch registers Meta kernels only from Python)
// against what the CPU kernels return, dtypes included.
TEST(Ir, ShapeRulesAgreeWithTheCpuKernels) {
  auto meta = [](std::vector<int64_t> s, c10::ScalarType t) {
    return TensorMeta::contiguous(std::move(s), t, c10::kCPU);
  };
  struct Case {
    std::string op;
    std::vector<TensorMeta> inputs;
    std::function<std::vector<BArg>(const std::vector<Value*>&)> args;
  };
  auto bf16 = c10::kBFloat16, f32 = c10::kFloat;
  std::vector<Case> cases = {
      // A 0-dim float32 operand does not widen a bfloat16 one.
      {"aten::where.self",
       {meta({3, 4}, c10::kBool), meta({3, 4}, bf16), meta({}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], v[2]};
       }},
      {"aten::where.self",
       {meta({3, 1}, c10::kBool), meta({1, 4}, f32), meta({3, 4}, bf16)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], v[2]};
       }},
      // Statistics: the input's dtype on CPU, unless the weight and bias are float32.
      {"aten::native_layer_norm",
       {meta({4, 8}, bf16), meta({8}, bf16), meta({8}, bf16)},
       [](auto& v) {
         return std::vector<BArg>{v[0], std::vector<int64_t>{8}, v[1], v[2], 1e-5};
       }},
      {"aten::native_layer_norm",
       {meta({4, 8}, bf16), meta({8}, f32), meta({8}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], std::vector<int64_t>{8}, v[1], v[2], 1e-5};
       }},
      {"aten::native_layer_norm",
       {meta({2, 4, 8}, bf16)},
       [](auto& v) {
         return std::vector<BArg>{v[0], std::vector<int64_t>{4, 8}, std::nullopt, std::nullopt, 1e-5};
       }},
      {"aten::native_group_norm",
       {meta({2, 4, 3, 3}, bf16), meta({4}, f32), meta({4}, f32)},
       [](auto& v) { return std::vector<BArg>{v[0], v[1], v[2], 2, 4, 9, 2, 1e-5}; }},
      {"aten::native_group_norm",
       {meta({2, 6, 5}, f32)},
       [](auto& v) { return std::vector<BArg>{v[0], std::nullopt, std::nullopt, 2, 6, 5, 3, 1e-5}; }},
      // convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups)
      {"aten::convolution",
       {meta({2, 3, 9, 8}, f32), meta({4, 3, 3, 2}, f32), meta({4}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0],
                                  v[1],
                                  v[2],
                                  std::vector<int64_t>{2, 1},
                                  std::vector<int64_t>{1, 0},
                                  std::vector<int64_t>{1, 2},
                                  false,
                                  std::vector<int64_t>{0},
                                  1};
       }},
      {"aten::convolution",
       {meta({2, 4, 5}, f32), meta({4, 3, 3}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0],
                                  v[1],
                                  std::nullopt,
                                  std::vector<int64_t>{2},
                                  std::vector<int64_t>{1},
                                  std::vector<int64_t>{1},
                                  true,
                                  std::vector<int64_t>{1},
                                  2};
       }},
      {"aten::linalg_matrix_exp", {meta({2, 4, 4}, f32)}, [](auto& v) { return std::vector<BArg>{v[0]}; }},
      {"aten::index_add",
       {meta({4, 3}, f32), meta({0}, c10::kLong), meta({0, 3}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], 0, v[1], v[2], 1.0};
       }},
      {"aten::cholesky_solve",
       {meta({2, 3, 4}, f32), meta({3, 3}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], false};
       }},
      {"aten::linalg_solve_triangular",
       {meta({3, 3}, f32), meta({2, 3, 4}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], true, true, false};
       }},
      {"aten::linalg_solve_triangular",
       {meta({2, 1, 3, 3}, f32), meta({4, 3}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], false, false, true};
       }},
      // abs of complex values is real; conj_physical keeps the dtype
      {"aten::abs", {meta({3, 4}, c10::kComplexFloat)}, [](auto& v) { return std::vector<BArg>{v[0]}; }},
      {"aten::_conj_physical", {meta({3, 4}, c10::kComplexFloat)}, [](auto& v) { return std::vector<BArg>{v[0]}; }},
      {"aten::linalg_pinv.atol_rtol_tensor",
       {meta({2, 5, 3}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], std::nullopt, std::nullopt, false};
       }},
      // linalg_lstsq(A, B, rcond, driver): solutions column-major in max(m, n) rows; residuals
      // for m > n except with gelsy; singular values with gelsd and gelss
      {"aten::linalg_lstsq",
       {meta({5, 3}, f32), meta({5, 2}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], std::nullopt, std::nullopt};
       }},
      {"aten::linalg_lstsq",
       {meta({2, 5, 3}, f32), meta({1, 5, 2}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], std::nullopt, "gelsd"};
       }},
      {"aten::linalg_lstsq",
       {meta({2, 5, 3}, f32), meta({2, 5}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], std::nullopt, "gelss"};
       }},
      {"aten::linalg_lstsq",
       {meta({3, 5}, f32), meta({3}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], std::nullopt, "gelsd"};
       }},
      {"aten::linalg_lstsq",
       {meta({5, 3}, f32), meta({5, 2}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], std::nullopt, "gels"};
       }},
      // grid_sampler_2d_backward(grad, input, grid, mode, padding, align_corners, output_mask)
      {"aten::grid_sampler_2d_backward",
       {meta({2, 3, 4, 5}, f32), meta({2, 3, 6, 7}, f32), meta({2, 4, 5, 2}, f32)},
       [](auto& v) {
         return std::vector<BArg>{v[0], v[1], v[2], 0, 0, false, c10::List<bool>({true, true})};
       }},
  };
  for (const Case& c : cases) {
    Graph g;
    std::vector<Value*> in;
    std::vector<at::Tensor> values;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      in.push_back(g.add_input("x" + std::to_string(i), c.inputs[i], Role::Primal));
      const TensorMeta& m = c.inputs[i];
      values.push_back(m.dtype == c10::kBool ? at::rand(m.sizes) > 0.5 : at::randn(m.sizes).to(m.dtype));
    }
    Builder b(g);
    std::vector<Value*> out = b.emit(c.op, c.args(in));
    std::vector<at::Tensor> got = execute_node(*out[0]->producer(), values);
    ASSERT_EQ(got.size(), out.size()) << c.op;
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(got[i].sizes().vec(), out[i]->meta().sizes) << to_text(g);
      EXPECT_EQ(got[i].scalar_type(), out[i]->meta().dtype) << to_text(g);
      EXPECT_EQ(got[i].strides().vec(), out[i]->meta().strides) << to_text(g);
    }
  }
}

// Group norm of a channels-last input (its composite fallback views the input, which fails there,
// so shape inference uses jvpc's rule).
TEST(Ir, GroupNormKeepsAChannelsLastInputsFormat) {
  at::Tensor x = at::randn({2, 4, 3, 3}).contiguous(at::MemoryFormat::ChannelsLast);
  Graph g;
  Value* xv = g.add_input("x", TensorMeta::of(x), Role::Primal);
  Builder b(g);
  std::vector<Value*> out = b.emit("aten::native_group_norm", {xv, std::nullopt, std::nullopt, 2, 4, 9, 2, 1e-5});
  std::vector<at::Tensor> got = execute_node(*out[0]->producer(), {x});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].sizes().vec(), out[i]->meta().sizes) << i;
    EXPECT_EQ(got[i].strides().vec(), out[i]->meta().strides) << i;
  }
}

// A convolution's result is channels-last when its input or its weight is (a rule that looked at
// the input only would declare a layout that a later view of a tangent fails on at run time).
TEST(Ir, ConvolutionTakesChannelsLastFromEitherOperand) {
  for (int cl = 1; cl < 4; ++cl) {
    at::Tensor x = at::randn({2, 3, 6, 6}), w = at::randn({4, 3, 3, 3});
    if (cl & 1) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    if (cl & 2) w = w.contiguous(at::MemoryFormat::ChannelsLast);
    Graph g;
    Value* xv = g.add_input("x", TensorMeta::of(x), Role::Primal);
    Value* wv = g.add_input("w", TensorMeta::of(w), Role::Primal);
    Builder b(g);
    Value* out = b.call("aten::convolution", {xv, wv, std::nullopt, std::vector<int64_t>{1}, std::vector<int64_t>{1},
                                              std::vector<int64_t>{1}, false, std::vector<int64_t>{0}, 1});
    at::Tensor got = execute_node(*out->producer(), {x, w}).at(0);
    EXPECT_EQ(got.strides().vec(), out->meta().strides) << "x channels-last " << (cl & 1) << ", w " << (cl & 2);
  }
}

// Elementwise shape rules lay the result out as the kernels do: like a transposed operand, or
// contiguous for the loss backward kernels (a later view of it depends on that).
TEST(Ir, ShapeRulesKeepATransposedOperandsLayout) {
  at::Tensor x = at::randn({4, 3}).t();
  TensorMeta m = TensorMeta::of(x);
  std::vector<std::pair<std::string, std::function<std::vector<BArg>(Value*)>>> cases = {
      {"aten::relu", [](Value* v) { return std::vector<BArg>{v}; }},
      {"aten::abs", [](Value* v) { return std::vector<BArg>{v}; }},
      {"aten::hardtanh_backward",
       [](Value* v) {
         return std::vector<BArg>{v, v, -0.5, 0.5};
       }},
      {"aten::hardswish_backward",
       [](Value* v) {
         return std::vector<BArg>{v, v};
       }},
      {"aten::log_sigmoid_backward",
       [](Value* v) {
         return std::vector<BArg>{v, v, v};
       }},
      {"aten::smooth_l1_loss_backward",
       [](Value* v) {
         return std::vector<BArg>{v, v, v, 0, 1.0};
       }},
      {"aten::huber_loss_backward",
       [](Value* v) {
         return std::vector<BArg>{v, v, v, 0, 1.0};
       }},
      {"aten::binary_cross_entropy_backward",
       [](Value* v) {
         return std::vector<BArg>{v, v, v, std::nullopt, 0};
       }},
      {"aten::flip",
       [](Value* v) {
         return std::vector<BArg>{v, std::vector<int64_t>{0}};
       }},
  };
  for (const auto& [op, args] : cases) {
    Graph g;
    Value* in = g.add_input("x", m, Role::Primal);
    Builder b(g);
    Value* out = b.emit(op, args(in)).at(0);
    std::vector<at::Tensor> operands(out->producer()->inputs().size(), x);
    at::Tensor got = execute_node(*out->producer(), operands).at(0);
    EXPECT_EQ(got.sizes().vec(), out->meta().sizes) << op;
    EXPECT_EQ(got.strides().vec(), out->meta().strides) << op;
    EXPECT_EQ(got.scalar_type(), out->meta().dtype) << op;
  }
}

// Each dtype's names (ir/dtypes.h) lead back to it, and TensorMeta::str() writes the
// short one; a name no table holds, and complex dtypes in a graph file, are errors.
TEST(Dtypes, EveryNameLeadsBackToItsDtype) {
  for (const auto& [aten, python] : python_dtype_names()) {
    c10::ScalarType t = dtype_from_aten_name(aten);
    EXPECT_EQ(dtype_from_python_name(python), t) << python;
    EXPECT_EQ(dtype_from_text(short_dtype_name(t)), t) << aten;
    if (t != c10::kUInt64) {
      EXPECT_EQ(dtype_from_safetensors_name(safetensors_dtype_name(t)), t) << aten;
    }
    EXPECT_EQ(TensorMeta::contiguous({2}, t, c10::kCPU).str(), short_dtype_name(t) + "[2]");
  }
  EXPECT_EQ(short_dtype_name(c10::kBFloat16), "bf16");
  EXPECT_EQ(dtype_from_text("ComplexFloat"), c10::kComplexFloat);  // the text form holds complex graphs
  test::expect_error([] { dtype_from_aten_name("ComplexFloat"); }, "is not supported");
  test::expect_error([] { dtype_from_aten_name("Floaty"); }, "unknown dtype 'Floaty'");
  test::expect_error([] { safetensors_dtype_name(c10::kComplexFloat); }, "cannot be stored");
  test::expect_error([] { dtype_from_safetensors_name("F8"); }, "unknown safetensors dtype");
}

}  // namespace
}  // namespace jvpc
