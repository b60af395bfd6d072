// Batching rules: for each op of a tangent graph, how to apply it to K tangents at once, as IR.
// A table keyed by op name, filled by one file per op family (elementwise, views, reductions,
// linalg, attention), as the JVP rules are (passes/jvp_rules/), in the manner of JAX's
// primitive_batchers.
//
// The batching transform (passes/batch.cpp) gives every value of the batched graph one of two
// forms: unbatched, as in the tangent graph (residuals and what depends on them alone: done
// once per call), or batched, with the K tangents stacked on a new leading axis ([K, ...] where
// the tangent graph has [...]). A rule sees the tangent graph's node, its operands in the
// batched graph and which of them are batched (at least one is); it returns the node's outputs,
// each batched, or nothing where it does not apply (the transform then unrolls the node). A rule never expands or copies an unbatched operand K times where the op can
// broadcast it instead, and a product of an unbatched operand by a batched one is one larger
// product with K folded into its rows or columns.
#pragma once

#include "ir/builder.h"
#include "passes/op_table.h"

#include <functional>

namespace jvpc::batch_rules {

class Ctx {
 public:
  Ctx(Builder& b, const Node& n, int64_t K, std::vector<Value*> operands, std::vector<bool> batched)
      : b(b), n(n), K(K), operands_(std::move(operands)), batched_(std::move(batched)) {}

  /// b: the builder that emits into the batched graph.
  Builder& b;
  /// n: the tangent graph's node.
  const Node& n;
  /// K: the number of tangents.
  const int64_t K;

  /// x(arg): the batched graph's value for tensor schema argument `arg`.
  Value* x(size_t arg) const;
  /// Whether x(arg) is batched (false for an argument that is not a tensor).
  bool batched(size_t arg) const;
  /// The logical rank of tensor argument `arg`: its rank in the tangent graph.
  int64_t rank(size_t arg) const { return static_cast<int64_t>(n.tensor_arg(arg)->meta().sizes.size()); }
  /// The operand `i` (Node::inputs() order) in the batched graph, and whether it is batched.
  Value* operand(size_t i) const { return operands_.at(i); }
  bool operand_batched(size_t i) const { return batched_.at(i); }
  /// c(arg): the constant schema argument `arg`.
  const c10::IValue& c(size_t arg) const { return n.arg(arg).value; }
  /// The node's schema arguments as the batched graph holds them: tensors mapped, constants as
  /// they are (but a channels_last memory format, which the K axis's extra rank refuses: contiguous).
  std::vector<BArg> args() const;

  Value* call(const std::string& op, std::vector<BArg> args) { return b.call(op, std::move(args)); }
  /// The node's op on `args` (all its outputs).
  std::vector<Value*> emit(std::vector<BArg> args) { return b.emit(n.op(), std::move(args)); }

  /// A batched value v [K, ...] with size-1 dims inserted after K to a logical rank `rank`, so that
  /// it broadcasts, K leading, against unbatched values of rank up to `rank` (a view).
  Value* pad_to(Value* v, int64_t rank);
  /// v [K, s...] viewed as [K·s0, s1, ...] (copied first where its layout cannot be viewed so).
  Value* fold_into_first(Value* v);
  /// An unbatched value broadcast to [K, ...] (expand: a view, no copy).
  Value* broadcast(Value* v);
  /// Dim `d` of a logical rank `rank` as a dim of the batched value (wrapped, then shifted by one).
  static int64_t dim(int64_t d, int64_t rank);

 private:
  std::vector<Value*> operands_;
  std::vector<bool> batched_;
};

using Rule = std::function<std::vector<Value*>(Ctx&)>;

using Registry = OpTable<Rule>;

/// All rules, built once.
const Registry& registry();

// Rule makers.
/// Elementwise with broadcasting over every tensor argument (add, mul, where, _to_copy, ...):
/// batched operands are padded to the output's rank, unbatched ones broadcast as they are.
Rule pointwise();
/// Acts on its single batched operand as a whole, its other arguments unchanged, where the op
/// is rank-polymorphic over leading dims (clone, view_as_real, ...): the op itself.
Rule same_op();
/// The op with the dims in arguments `dim_args` (Int or Ints; None or [] for all dims) shifted past
/// K, for ops whose tensor arguments are batched or broadcast alike (sum.dim_IntList, transpose,
/// cat): unbatched tensor operands are broadcast to [K, ...] (a view), except those of the
/// schema arguments in `keep` (an index_select's index). Dims wrap at the first tensor's rank
/// plus `extra_rank` (1 for ops that add a dim: unsqueeze, stack).
Rule with_dims(std::vector<size_t> dim_args, std::vector<size_t> keep = {}, int64_t extra_rank = 0);
/// K folded into the first dim of the single batched operand, which the op treats as a batch
/// (pooling, resampling, padding: [K·N, C, ...]), and unfolded from the result.
Rule fold_first();

// One registration function per family file.
void register_elementwise(Registry& r);
void register_views(Registry& r);
void register_reductions(Registry& r);
void register_linalg(Registry& r);
void register_attention(Registry& r);

}  // namespace jvpc::batch_rules
