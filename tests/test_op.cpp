// Op handles (ir/op.h): every handle names an operator the dispatcher knows, names and handles
// round-trip, nodes compare by handle, and the properties the op info and the predicates read.
#include "ir/builder.h"
#include "ir/op.h"
#include "ir/ops.h"
#include "runtime/attention_tangent.h"
#include "tests/helpers.h"

#include <algorithm>
#include <set>

namespace jvpc {
namespace {

using test::f32;

TEST(OpHandles, EveryHandleNamesARegisteredOperator) {
  runtime::register_ops();  // jvpc::attention_tangent and its kin
  std::set<std::string> seen;
  for (Op op : Op::all()) {
    EXPECT_TRUE(seen.insert(op.name()).second) << op.name() << " is listed twice";
    if (!op.has(kNotInEveryRelease)) {
      EXPECT_NO_THROW(op_info(op.name())) << op.name();
    }
    EXPECT_EQ(Op::find(op.name()), op) << op.name();
  }
  EXPECT_EQ(seen.size() + 1, size_t{ops::count_index});
}

TEST(OpHandles, AnOpTheCodeDoesNotNameHasNoHandle) {
  EXPECT_EQ(Op::find("aten::no_such_op"), Op());
  EXPECT_EQ(Op().name(), "");
  EXPECT_NE(Op::find("aten::mul.Tensor"), Op::find("aten::mul.Scalar"));
  EXPECT_EQ(ops::mul_Tensor.name(), "aten::mul.Tensor");
  EXPECT_EQ(ops::jvpc_attention_tangent.name(), "jvpc::attention_tangent");
}

TEST(OpHandles, NodesCompareByHandle) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 3}), Role::Primal, true);
  Value* w = g.add_input("w", f32({3, 4}), Role::Primal, true);
  Builder b(g);
  Node* mm = b.call(ops::mm, {x, w})->producer();
  Node* clone = b.call("aten::clone", {x})->producer();
  EXPECT_TRUE(mm->is(ops::mm));
  EXPECT_FALSE(mm->is(ops::bmm));
  EXPECT_EQ(mm->handle(), ops::mm);
  EXPECT_TRUE(clone->is(ops::clone));  // a name given as text finds its handle
}

TEST(OpHandles, PropertiesReachTheOpInfoAndThePredicates) {
  EXPECT_TRUE(op_info("aten::mul.Tensor").commutative);
  EXPECT_FALSE(op_info("aten::sub.Tensor").commutative);
  EXPECT_TRUE(op_info("aten::bmm").matmul);
  EXPECT_TRUE(op_info("aten::baddbmm_").matmul);  // counted as baddbmm
  EXPECT_TRUE(is_fused_attention("aten::_scaled_dot_product_flash_attention_for_cpu"));
  EXPECT_FALSE(is_fused_attention("aten::bmm"));
  EXPECT_TRUE(op_info("aten::bernoulli.p").fills_self_at_random);
  EXPECT_TRUE(op_info("aten::empty_like").allocates_uninitialized);
  EXPECT_TRUE(op_info("aten::empty_like").reads_only_metadata_of_self);
  EXPECT_TRUE(op_info("aten::select_scatter").view_scatter);
  EXPECT_TRUE(op_info("aten::_unsafe_view").is_view);
  std::vector<std::string> matmuls = matmul_ops();
  EXPECT_EQ(std::count(matmuls.begin(), matmuls.end(), "aten::mm"), 1);
  EXPECT_EQ(std::count(matmuls.begin(), matmuls.end(), "aten::mul.Tensor"), 0);
}

}  // namespace
}  // namespace jvpc
