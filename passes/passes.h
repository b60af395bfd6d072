// Every pass jvpc has, as a free function on a Graph (returns true if it changed the graph)
// and as a named Pass for pipelines. One pass per file; each file's banner says what it does.
#pragma once

#include "passes/pass.h"
#include "passes/rewrite.h"

#include <functional>
#include <optional>
#include <unordered_map>

namespace jvpc {

/// jvp.cpp: adds a tangent input for each chosen primal input ("d" + name, primed where that
/// name is taken; Input::tangent_of names the primal) and the tangent of
/// every node, from the per-op rules in passes/jvp_rules/. Appends one tangent output per
/// primal output. Tangent inputs follow `wrt`'s order; `wrt` empty: every primal input marked
/// differentiable, in graph order.
bool jvp(Graph& g, const std::vector<std::string>& wrt = {});

/// fold.cpp: evaluates, at most once each, the nodes that depend only on primal inputs and
/// constants, and turns the values the rest of the graph reads into constant inputs
/// (residuals). `known` holds tensors already computed (value id -> tensor: the tracing run's
/// values, the primal inputs); anything else needed is evaluated through the runtime.
/// Residuals that alias a primal input are marked with that input's name.
bool fold(Graph& g, const std::unordered_map<int, at::Tensor>& known);

/// dce.cpp: removes nodes whose outputs nobody reads (impure nodes stay), then unused
/// constant inputs, and unused primal inputs when `prune_primal_inputs`.
bool dce(Graph& g, bool prune_primal_inputs = false);

/// cse.cpp: makes readers of a node that repeats an earlier one (same op, arguments and
/// operands; pure) read the earlier one, and erases the repeat.
bool cse(Graph& g);

/// simplify_views.cpp: removes identity views (expand or view to the same shape, transposing
/// twice, clones of contiguous values) and collapses view-of-view chains into one view.
bool simplify_views(Graph& g);

/// simplify_arith.cpp: removes multiplications and divisions by one and additions of zero,
/// and merges chains of scalar multiplications.
bool simplify_arith(Graph& g);

/// scale_to_residual.cpp: sinks scalar multiplications of tangent values through views into
/// the matmul that reads them, and moves the scale onto the matmul's tangent-independent
/// operand, where fold precomputes it once; a scaling after products with primal operands
/// (hand-written attention's scores) goes onto those operands, where they take no more bytes.
bool scale_to_residual(Graph& g);

/// merge_factors.cpp: (t·a)·b -> t·(a·b) and t·a ± t·b -> t·(a ± b) for a tangent t and
/// primal tensors or numbers a, b (fold then computes the merged factor once), where the merged
/// factor takes no more residual bytes.
bool merge_factors(Graph& g);

/// select_masks.cpp: t·float(m) -> where(m, t, 0) for a tangent t and a boolean primal m, so
/// that the residual is the boolean mask (1 byte per element) rather than a float copy of it.
bool select_masks(Graph& g);

/// What attention_form chose for one attention, and why.
struct AttentionChoice {
  std::string node;  ///< the jvpc::attention_tangent node the rule emitted, as describe() names it
  struct Form {
    int64_t residual_bytes = 0;  ///< what the form holds between calls
    int64_t peak_bytes = 0;      ///< what it allocates at once during a call
    int64_t matmul_flops = 0;    ///< per call
    int64_t bytes() const;       ///< residual_bytes + peak_bytes: what the budget counts
  };
  Form p, o_l;  ///< the P form and the O(L) form
  bool o_l_form = false;
  std::string reason;
};

/// attention_form.cpp: per jvpc::attention_tangent node (the O(L) form the fused attention
/// rules emit), chooses the O(L) form or the P form under `residual_budget` bytes (none: the
/// default, default_memory_limit() of the graph's device; 0: O(L) everywhere; kNoMemoryLimit:
/// P everywhere), and expands those that hold P. Throws when no choice fits, naming the smallest
/// budget that would do. Returns one choice per attention, in graph order.
std::vector<AttentionChoice> attention_form(Graph& g, std::optional<int64_t> residual_budget);

/// zero_blocks.cpp: a bmm reading cat([zeros, t]) through views (a KV cache's tangent) skips
/// the zero block: bmm(slice(a), t) along the contracted dim, cat([zeros, bmm(a, t)]) along
/// another.
bool zero_blocks(Graph& g);

/// group_bmm.cpp: a bmm whose right operand repeats each key/value head (grouped-query
/// attention) reads the unrepeated tensor, with the left operand's matrices stacked per group.
bool group_bmm(Graph& g);

/// What batch_tangents made: the batched graph, and the ops that had no batching rule.
struct BatchResult {
  std::unique_ptr<Graph> graph;
  /// Ops without a batching rule, each applied as K unrolled copies of itself (sorted, once each).
  std::vector<std::string> unrolled;
};

/// batch.cpp: from a tangent graph for one tangent, the graph for K tangents stacked on a new
/// leading axis: every tangent input and output [...] becomes [K, ...], residuals stay as they
/// are (never copied), work that does not depend on the tangent is done once, and a product of a
/// residual by a batched tangent is one product with K folded into its rows or columns
/// (passes/batch_rules/). An op without a batching rule becomes K unrolled copies of itself.
BatchResult batch_tangents(const Graph& g, int64_t K);

/// fuse_matmul_add.cpp: add(x, bmm(a, b)) -> baddbmm(x, a, b) and add(x, mm(a, b)) ->
/// addmm(x, a, b), when the product is read only by the addition.
bool fuse_matmul_add(Graph& g);

}  // namespace jvpc
