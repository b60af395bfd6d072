// The IR's text form read back (ir/text.h): what it holds, its errors, the round trip
// of every example, and the FileCheck helper pass tests use (tests/filecheck.h). The round
// trip of every JVP rule case is IrText.* in test_jvp_rules.cpp.
#include "compiler/api/linearize.h"
#include "ir/builder.h"
#include "ir/printer.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "compiler/trace/tracer.h"
#include "examples/examples.h"
#include "tests/filecheck.h"
#include "tests/helpers.h"
#include "tests/same_structure.h"

#include <ATen/ATen.h>

namespace jvpc {
namespace {

using test::f32;

std::string error_of(const std::string& text) {
  try {
    parse_text(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(IrText, HoldsStridesFlagsNamesAndReturnCounts) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 3}), Role::Primal, true);
  g.add_input("odd name\"", f32({2}), Role::Primal);
  Value* dx = g.add_input("dx", TensorMeta{{2, 3}, {1, 2}, c10::kFloat, c10::Device(c10::kCPU)}, Role::Tangent);
  g.inputs().back().tangent_of = "x";
  g.add_constant("c", at::ones({3}), "x");
  g.add_input("unbound", f32({3}), Role::Constant);
  Builder b(g);
  Value* t = b.call("aten::transpose.int", {x, 0, 1});
  auto parts = b.emit("aten::split.Tensor", {b.call("aten::mul.Tensor", {x, dx}), 1, 0});
  Value* r = b.call("aten::rand", {std::vector<int64_t>{2}});
  g.add_output(t, "t");
  g.add_output(parts[1], "dout0'");
  g.add_output(r, "r r");
  std::string text = to_text(g);
  EXPECT_TRUE(test::filecheck(text, R"(
    CHECK:      graph(%0 : f32[2,3] x,
    CHECK-NEXT: %1 : f32[2] "odd name\"" [primal],
    CHECK-NEXT: %2 : f32[2,3]{1,2} dx [tangent, tangent_of x],
    CHECK-NEXT: %3 : f32[3] c [constant, stored, aliases x],
    CHECK-NEXT: %4 : f32[3] unbound [constant]):
    CHECK-NEXT: %5 : f32[3,2]{1,3} = aten::transpose.int(%0, 0, 1)
    CHECK:      %7 : f32[1,3], %8 : f32[1,3] = aten::split.Tensor(%6, 1, 0)  # returns [2]
    CHECK-NEXT: %9 : f32[2] = aten::rand([2], None, None, None, None)  # impure
    CHECK-NEXT: return (%5 t, %8 dout0', %9 "r r")
  )")) << text;
  auto back = parse_text(text);
  EXPECT_TRUE(test::same_structure(g, *back));
  EXPECT_EQ(to_text(*back), text);
  // A stored constant is bound by the callback, or to zeros of its layout.
  EXPECT_TRUE(back->inputs()[3].data.equal(at::zeros({3})));
  EXPECT_FALSE(back->inputs()[4].data.defined());
  ParseTextOptions bind;
  bind.bind = [](const std::string& name, const TensorMeta& m) {
    EXPECT_EQ(name, "c");
    return at::full(m.sizes, 2.0);
  };
  EXPECT_TRUE(parse_text(text, bind)->inputs()[3].data.equal(at::full({3}, 2.0)));
}

TEST(IrText, ArgumentKindsComeFromTheTextAndTheSchema) {
  auto g = parse_text(R"(
    graph(%0 : f64[2,3] x [primal]):
      %1 : f32[2,3] = aten::_to_copy(%0, Float, Strided, cpu, false, false, Contiguous)
      %2 : f32[3] = aten::sum.dim_IntList(%1, [0], false, None)
      %3 : f32[2,3] = aten::mul.Scalar(%1, -inf)
      %4 : f32[2,3] = aten::gelu(%1, 'tanh')
      %5 : f32[4,3] = aten::cat([%1, %1], 0)
      %6 : f32[0] = aten::zeros([0], Float, None, None, None)
      return (%2 a, %3 b, %4 c, %5 d, %6 e))");
  auto n = g->nodes();
  EXPECT_EQ(n[0]->arg(1).kind, ArgKind::ScalarType);
  EXPECT_EQ(n[0]->arg(2).kind, ArgKind::Layout);
  EXPECT_EQ(n[0]->arg(3).kind, ArgKind::Device);
  EXPECT_EQ(n[0]->arg(6).kind, ArgKind::MemoryFormat);
  EXPECT_EQ(n[1]->arg(1).kind, ArgKind::Ints);
  EXPECT_EQ(n[2]->arg(1).kind, ArgKind::Float);
  EXPECT_TRUE(std::isinf(n[2]->arg(1).value.toDouble()));
  EXPECT_EQ(n[3]->arg(1).value.toStringRef(), "tanh");
  EXPECT_EQ(n[4]->arg(0).kind, ArgKind::TensorList);
  EXPECT_EQ(n[4]->inputs().size(), 2u);  // one operand per mention
  EXPECT_EQ(n[5]->arg(0).kind, ArgKind::Ints);
  EXPECT_EQ(g->outputs()[0]->id(), 2);  // the text's ids
}

// `//` comments run to the end of their line, anywhere space may stand; a node's flags may
// follow its arguments before one.
TEST(IrText, CommentsRunToTheEndOfTheLine) {
  auto g = parse_text(R"(// jvpc opt: changed
    // a second line
    graph(%0 : f32[4] x,  // the input
          %1 : f32[4] y [primal]):
      %2 : f32[4] = aten::mul.Tensor(%0, %1)  // a product
      %3 : f32[4] = aten::rand([4], None, None, None, None)  # impure  // flags, then a comment
      return (%2 out0, %3 out1)  // end
    // after the graph)");
  EXPECT_EQ(g->num_nodes(), 2u);
  EXPECT_TRUE(g->nodes()[1]->impure());
  EXPECT_EQ(g->inputs()[1].name, "y");
  EXPECT_NE(error_of("graph(%0 : f32[4] x):\n  return (%0) / not a comment").find("text after the return"),
            std::string::npos);
}

TEST(IrText, ErrorsNameTheLineAndTheProblem) {
  EXPECT_EQ(error_of("graph(%0 : f32[4] x):\n  %1 : f32[4] = aten::exp(%7)\n  return (%1)"),
            "IR text, line 2, column 27: %7 is not defined before this use");
  EXPECT_NE(error_of("graph(%0 : f32[4] x):\n  %1 : f32[4] = aten::nosuchop(%0)\n  return (%1)")
                .find("line 2, column 17: unknown op 'aten::nosuchop'"),
            std::string::npos);
  EXPECT_NE(error_of("graph(%0 : q32[4] x):\n  return (%0)").find("unknown dtype 'q32'"), std::string::npos);
  EXPECT_NE(error_of("graph(%0 : f32[4] x, %0 : f32[4] y):\n  return (%0)").find("%0 is defined twice"),
            std::string::npos);
  EXPECT_NE(error_of("graph(%0 : f32[4] x):\n  %1 : f32[4] = aten::exp(%0, 1)\n  return (%1)")
                .find("aten::exp takes 1 arguments, the text gives 2"),
            std::string::npos);
  EXPECT_NE(error_of("graph(%0 : f32[4] x [weird]):\n  return (%0)").find("unknown role 'weird'"), std::string::npos);
  // Parsed graphs are verified: a declared shape the op does not produce is an error.
  EXPECT_NE(error_of("graph(%0 : f32[4] x):\n  %1 : f32[5] = aten::exp(%0)\n  return (%1)").find("is declared f32[5]"),
            std::string::npos);
  ParseTextOptions unverified;
  unverified.verify = false;
  EXPECT_NO_THROW(parse_text("graph(%0 : f32[4] x):\n  %1 : f32[5] = aten::exp(%0)\n  return (%1)", unverified));
}

// Every example's traced graph and tangent graph (at its default sizes) read back as they were.
TEST(IrText, EveryExamplesGraphsRoundTrip) {
  for (const std::string& name : examples::names()) {
    examples::Instance ex = examples::make(name, {"--device", "cpu"});
    Trace t = trace(ex.fn(), ex.inputs, TraceOptions::graph_only());
    Linearized lin = linearize(ex.fn(), ex.inputs);
    for (const Graph* g : std::vector<const Graph*>{t.graph.get(), lin.tangent_graph.get()}) {
      std::unique_ptr<Graph> back;
      try {
        back = parse_text(to_text(*g));
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << ": " << e.what();
        continue;
      }
      EXPECT_TRUE(test::same_structure(*g, *back)) << name;
    }
  }
}

// --- the FileCheck helper ----------------------------------------------------------------------

const char* kText =
    "graph(%0 : f32[4] x):\n"
    "  %1 : f32[4] = aten::exp(%0)\n"
    "  %2 : f32[4] = aten::neg(%1)\n"
    "  return (%2 out0)\n";

TEST(FileCheck, PassesWhatHolds) {
  EXPECT_TRUE(test::filecheck(kText, "CHECK: aten::exp\nCHECK-NEXT: aten::neg\nCHECK-SAME: (%1)\nCHECK-NOT: sin"));
  EXPECT_TRUE(test::filecheck(kText, R"(
    CHECK: [[E:%[0-9]+]] : f32[4] = aten::exp
    CHECK: = aten::neg([[E]])
    CHECK: return ({{%[0-9]+}} out0)
  )"));
  EXPECT_TRUE(test::filecheck(kText, "CHECK: aten::exp\nCHECK-NOT: aten::exp\nCHECK: return"));
}

TEST(FileCheck, FailsWhatDoesNotAndSaysWhy) {
  auto message = [](const ::testing::AssertionResult& r) { return std::string(r.message()); };
  auto r = test::filecheck(kText, "CHECK: aten::neg\nCHECK: aten::exp");  // order matters
  EXPECT_FALSE(r);
  EXPECT_NE(message(r).find("'CHECK: aten::exp' has no match after line 3"), std::string::npos) << message(r);
  EXPECT_NE(message(r).find("  2|   %1 : f32[4] = aten::exp(%0)"), std::string::npos) << message(r);  // the text
  EXPECT_FALSE(test::filecheck(kText, "CHECK: aten::exp\nCHECK-NEXT: return"));
  EXPECT_FALSE(test::filecheck(kText, "CHECK: aten::exp\nCHECK-SAME: neg"));
  EXPECT_FALSE(test::filecheck(kText, "CHECK: graph\nCHECK-NOT: aten::neg\nCHECK: return"));
  EXPECT_FALSE(test::filecheck(kText, "CHECK: aten::neg\nCHECK-NOT: out0"));  // to the end of the text
  EXPECT_FALSE(test::filecheck(kText, "CHECK: [[E:%[0-9]+]] = aten::neg\nCHECK: aten::exp([[E]])"));
  EXPECT_FALSE(test::filecheck(kText, "CHECK: [[E]]"));  // undefined
  EXPECT_FALSE(test::filecheck(kText, "CHEK: exp"));
  EXPECT_FALSE(test::filecheck(kText, ""));
}

}  // namespace
}  // namespace jvpc
