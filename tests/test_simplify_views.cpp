// simplify-views, as IR text in and checks on IR text out.
#include "compiler/ir/text.h"
#include "tests/filecheck.h"
#include "tests/pass_helpers.h"
#include "tests/same_structure.h"

#include "runtime/executable.h"

#include <limits>

namespace jvpc {
namespace {
using test::f32;
using test::run;

TEST(SimplifyViews, RemovesIdentityExpandAndCollapsesViewChains) {
  auto g = parse_text(R"(
    graph(%0 : f32[1,5,128,64] x [primal]):
      %1 : f32[1,5,128,64] = aten::expand(%0, [1, 5, 128, 64], false)
      %2 : f32[5,128,64] = aten::view(%1, [5, 128, 64])
      %3 : f32[640,64] = aten::view(%2, [640, 64])
      return (%3 out0))");
  EXPECT_TRUE(simplify_views(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      graph(%0 : f32[1,5,128,64] x [primal]):
    CHECK-NEXT:   %3 : f32[640,64] = aten::view(%0, [640, 64])
    CHECK-NEXT:   return (%3 out0)
  )"));
  EXPECT_FALSE(simplify_views(*g));
  verify(*g);
}

TEST(SimplifyViews, DoubleTransposeIsTheIdentity) {
  auto g = parse_text(R"(
    graph(%0 : f32[2,3,4] x [primal]):
      %1 : f32[4,3,2]{1,4,12} = aten::transpose.int(%0, -1, 0)
      %2 : f32[2,3,4] = aten::transpose.int(%1, 0, 2)
      %3 : f32[2,3,4] = aten::exp(%2)
      return (%3 out0))");
  EXPECT_TRUE(simplify_views(*g));
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      graph(%0 : f32[2,3,4] x [primal]):
    CHECK-NEXT:   %3 : f32[2,3,4] = aten::exp(%0)
    CHECK-NEXT:   return (%3 out0)
  )"));
}

TEST(SimplifyViews, KeepsRealReshapes) {
  const char* text = R"(
    graph(%0 : f32[2,3] x [primal]):
      %1 : f32[4,2,3]{0,3,1} = aten::expand(%0, [4, 2, 3], false)
      %2 : f32[3,2]{1,3} = aten::t(%0)
      %3 : f32[3,2]{1,3} = aten::clone(%2, None)
      return (%1 out0, %3 out1))";  // a copy of a non-contiguous view
  auto g = parse_text(text);
  EXPECT_FALSE(simplify_views(*g));
  EXPECT_TRUE(test::same_structure(*g, *parse_text(text)));
}

// Writes through views leave slice_scatter/select_scatter nodes, and reads of the written part
// or of the rest (a rotary embedding's tangent has them).
TEST(SimplifyViews, ReadsAroundAScatterReadItsSourceOrItsBase) {
  auto g = parse_text(R"(
    graph(%0 : f32[4,6] base [primal],
          %1 : f32[4,2] src [primal],
          %2 : f32[6] row [primal]):
      %3 : f32[4,6] = aten::slice_scatter(%0, %1, 1, 2, 4, 1)
      %4 : f32[4,2]{6,1} = aten::slice.Tensor(%3, -1, 2, 4, 1)
      %5 : f32[4,2]{6,1} = aten::slice.Tensor(%3, 1, 4, None, 1)
      %6 : f32[4,2]{6,1} = aten::slice.Tensor(%3, 1, 1, 3, 1)
      %7 : f32[4,6] = aten::select_scatter(%0, %2, 0, -1)
      %8 : f32[6] = aten::select.int(%7, 0, 3)
      %9 : f32[6] = aten::select.int(%7, 0, 0)
      return (%4 source, %5 of_base, %6 overlaps, %8 row_source, %9 row_of_base))");
  std::unique_ptr<Graph> before = g->clone();
  EXPECT_TRUE(simplify_views(*g));
  verify(*g);
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      %3 : f32[4,6] = aten::slice_scatter(%0, %1, 1, 2, 4, 1)
    CHECK-NEXT: %5 : f32[4,2]{6,1} = aten::slice.Tensor(%0, 1, 4, None, 1)
    CHECK-NEXT: %6 : f32[4,2]{6,1} = aten::slice.Tensor(%3, 1, 1, 3, 1)
    CHECK-NOT:  select_scatter
    CHECK-NEXT: %9 : f32[6] = aten::select.int(%0, 0, 0)
    CHECK-NEXT: return (%1 source, %5 of_base, %6 overlaps, %2 row_source, %9 row_of_base)
  )"));
  std::vector<at::Tensor> in = {at::randn({4, 6}), at::randn({4, 2}), at::randn({6})};
  auto want = Executable(std::move(before)).run(in), got = Executable(g->clone()).run(in);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << i;
}

TEST(SimplifyViews, AnAddOfTwoViewsIsAViewOfTheAdd) {
  auto g = parse_text(R"(
    graph(%0 : f32[2,6,3] x [primal],
          %1 : f32[2,6,3] y [primal]):
      %2 : f32[4,3,3] = aten::view(%0, [4, 3, 3])
      %3 : f32[4,3,3] = aten::view(%1, [4, 3, 3])
      %4 : f32[4,3,3] = aten::add.Tensor(%2, %3, 2.)
      return (%4 out0))");
  std::vector<at::Tensor> in = {at::randn({2, 6, 3}), at::randn({2, 6, 3})};
  at::Tensor before = run(*g, in)[0];
  EXPECT_TRUE(simplify_views(*g));
  verify(*g);
  EXPECT_TRUE(test::filecheck(to_text(*g), R"(
    CHECK:      [[S:%[0-9]+]] : f32[2,6,3] = aten::add.Tensor(%0, %1, 2.)
    CHECK-NEXT: [[V:%[0-9]+]] : f32[4,3,3] = aten::view([[S]], [4, 3, 3])
    CHECK-NEXT: return ([[V]] out0)
  )"));
  EXPECT_TRUE(run(*g, in)[0].equal(before));
}

}  // namespace
}  // namespace jvpc
