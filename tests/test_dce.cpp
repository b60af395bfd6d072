// Dead-code elimination (passes/dce.cpp), as IR text in and checks on IR text out.
#include "compiler/ir/text.h"
#include "tests/filecheck.h"
#include "tests/pass_helpers.h"

namespace jvpc {
namespace {

TEST(Dce, RemovesUnreadNodesAndKeepsTheRest) {
  auto g = parse_text(R"(
    graph(%0 : f32[4] x [primal]):
      %1 : f32[4] = aten::exp(%0)
      %2 : f32[4] = aten::sin(%0)
      %3 : f32[4] = aten::neg(%2)
      return (%1 out0))");
  EXPECT_TRUE(dce(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      graph(%0 : f32[4] x [primal]):
    CHECK-NEXT:   %1 : f32[4] = aten::exp(%0)
    CHECK-NEXT:   return (%1 out0)
  )"));
  EXPECT_FALSE(dce(*g));
  verify(*g);
}

TEST(Dce, KeepsImpureNodes) {
  auto g = parse_text(R"(
    graph(%0 : f32[4] x [primal]):
      %1 : f32[4] = aten::rand([4], None, None, None, None)  # impure
      return (%0 out0))");
  EXPECT_FALSE(dce(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), "CHECK: %1 : f32[4] = aten::rand("));
}

TEST(Dce, RemovesUnreadConstantsAndOptionallyPrimals) {
  auto g = parse_text(R"(
    graph(%0 : f32[4] x [primal],
          %1 : f32[4] unused [primal],
          %2 : f32[4] c [constant, stored],
          %3 : f32[4] dx [tangent]):
      return (%0 out0))");
  EXPECT_TRUE(dce(*g));  // tangents and primals stay by default
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      graph(%0 : f32[4] x [primal],
    CHECK-NEXT: %1 : f32[4] unused [primal],
    CHECK-NEXT: %3 : f32[4] dx [tangent]):
  )"));
  EXPECT_TRUE(dce(*g, true));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      graph(%0 : f32[4] x [primal],
    CHECK-NEXT: %3 : f32[4] dx [tangent]):
    CHECK-NEXT:   return (%0 out0)
  )"));  // x stays: it is an output
}

}  // namespace
}  // namespace jvpc
