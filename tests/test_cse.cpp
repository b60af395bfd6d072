// Common-subexpression elimination (passes/cse.cpp), as IR text in and checks on IR text out.
#include "compiler/ir/text.h"
#include "tests/filecheck.h"
#include "tests/pass_helpers.h"

namespace jvpc {
namespace {

TEST(Cse, MergesRepeatedComputations) {
  auto g = parse_text(R"(
    graph(%0 : f32[4,3] x [primal]):
      %1 : f32[3,4]{1,3} = aten::transpose.int(%0, 0, 1)
      %2 : f32[3,4]{1,3} = aten::transpose.int(%0, 0, 1)
      %3 : f32[3,4] = aten::add.Tensor(%1, %2, 1)
      return (%3 out0))");
  EXPECT_TRUE(cse(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      %1 : f32[3,4]{1,3} = aten::transpose.int(%0, 0, 1)
    CHECK-NOT:  aten::transpose.int
    CHECK-NEXT: %3 : f32[3,4] = aten::add.Tensor(%1, %1, 1)
  )"));
  EXPECT_FALSE(cse(*g));
  verify(*g);
}

// x·dx and dx·x (a product rule of x·x) are one product; x − y and y − x, and sums with
// alpha ≠ 1, are not.
TEST(Cse, MergesCommutedProductsAndSumsOnly) {
  auto g = parse_text(R"(
    graph(%0 : f32[4] x [primal], %1 : f32[4] y [primal]):
      %2 : f32[4] = aten::mul.Tensor(%0, %1)
      %3 : f32[4] = aten::mul.Tensor(%1, %0)
      %4 : f32[4] = aten::add.Tensor(%0, %1, 1)
      %5 : f32[4] = aten::add.Tensor(%1, %0, 1)
      %6 : f32[4] = aten::sub.Tensor(%0, %1, 1)
      %7 : f32[4] = aten::sub.Tensor(%1, %0, 1)
      %8 : f32[4] = aten::add.Tensor(%0, %1, 2)
      %9 : f32[4] = aten::add.Tensor(%1, %0, 2)
      return (%2 a, %3 b, %4 c, %5 d, %6 e, %7 f, %8 g, %9 h))");
  EXPECT_TRUE(cse(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      %2 : f32[4] = aten::mul.Tensor(%0, %1)
    CHECK-NEXT: %4 : f32[4] = aten::add.Tensor(%0, %1, 1)
    CHECK-NEXT: %6 : f32[4] = aten::sub.Tensor(%0, %1, 1)
    CHECK-NEXT: %7 : f32[4] = aten::sub.Tensor(%1, %0, 1)
    CHECK-NEXT: %8 : f32[4] = aten::add.Tensor(%0, %1, 2)
    CHECK-NEXT: %9 : f32[4] = aten::add.Tensor(%1, %0, 2)
    CHECK-NEXT: return (%2 a, %2 b, %4 c, %4 d, %6 e, %7 f, %8 g, %9 h)
  )"));
  verify(*g);
}

TEST(Cse, KeepsDifferentArgumentsApart) {
  auto g = parse_text(R"(
    graph(%0 : f32[4] x [primal]):
      %1 : f32[4] = aten::mul.Scalar(%0, 0.5)
      %2 : f32[4] = aten::mul.Scalar(%0, 0.5000000000000001)
      return (%1 out0, %2 out1))");
  EXPECT_FALSE(cse(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      %1 : f32[4] = aten::mul.Scalar(%0, 0.5)
    CHECK-NEXT: %2 : f32[4] = aten::mul.Scalar(%0, 0.5000000000000001)
    CHECK-NEXT: return (%1 out0, %2 out1)
  )"));
}

TEST(Cse, NeverMergesRandomNodes) {
  auto g = parse_text(R"(
    graph():
      %0 : f32[4] = aten::rand([4], None, None, None, None)  # impure
      %1 : f32[4] = aten::rand([4], None, None, None, None)  # impure
      return (%0 out0, %1 out1))");
  EXPECT_FALSE(cse(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      %0 : f32[4] = aten::rand(
    CHECK-NEXT: %1 : f32[4] = aten::rand(
    CHECK-NEXT: return (%0 out0, %1 out1)
  )"));
}

}  // namespace
}  // namespace jvpc
