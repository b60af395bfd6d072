// Every pass jvpc has, as a free function on a Graph (returns true if it changed the graph)
// and as a named Pass for pipelines. One pass per file; each file's banner says what it does.
#pragma once

#include "passes/pass.h"
#include "passes/rewrite.h"

#include <functional>
#include <map>
#include <optional>
#include <unordered_map>

namespace jvpc {

/// jvp.cpp: adds a tangent input for each chosen primal input ("d" + name, primed where that
/// name is taken; Input::tangent_of names the primal) and the tangent of
/// every node, from the per-op rules in passes/jvp_rules/. Appends one tangent output per
/// primal output. Tangent inputs follow `wrt`'s order; `wrt` empty: every primal input marked
/// differentiable, in graph order.
bool jvp(Graph& g, const std::vector<std::string>& wrt = {});

/// How split_primal() and fold() divide a graph.
struct SplitOptions {
  /// The graph's first outputs that are primal outputs (f(x)): they go to the primal graph.
  size_t primal_outputs = 0;
  /// Captured constants that tangent nodes read become residuals too, so that a program reads
  /// them as they are at each point (otherwise they stay constants of the tangent graph).
  bool constants_as_residuals = false;
};
/// The primal graph split_primal() takes out of a graph.
struct PrimalSplit {
  /// The graph's primal inputs and the constants it reads -> the primal outputs, then one
  /// output per residual, named as the residual. Values keep the ids they had. Null when there
  /// was nothing to split.
  std::unique_ptr<Graph> primal;
  /// The residual inputs ("r<k>", constants) added to the graph, in the primal graph's order.
  std::vector<std::string> residuals;
};
/// fold.cpp: the values that become residuals, each once, in graph order: the values outside
/// `varying` (primal-only) that a node in it (or one without outputs) reads, then those among g's
/// outputs from `first_output` on. Never the zeros a rule materializes (aten::zeros of a shape:
/// made per call they cost a fill, held they would cost their bytes for as long as the tangent
/// graph lives), and a graph input only where `input_held` says so.
std::vector<Value*> residual_values(Graph& g, const ValueSet& varying, size_t first_output,
                                    const std::function<bool(const Input&)>& input_held);
/// fold.cpp: moves the primal-only nodes that compute the residuals (primal-only values that
/// tangent-dependent nodes read or that are returned as tangents) and the primal outputs into
/// a primal graph, and reads each residual in the graph from an unbound constant input.
PrimalSplit split_primal(Graph& g, const SplitOptions& options = {});
/// fold.cpp: a primal graph's outputs, evaluating each node at most once: `known` holds tensors
/// already computed (value id -> tensor: the tracing run's values, the primal inputs);
/// anything else needed is run through the runtime. `matmul_flops_by_op`, if given, adds the
/// matmul FLOPs of the nodes it runs (kernel_matmul_flops, ir/cost/kernel_watch.h).
std::vector<at::Tensor> evaluate_primal(const Graph& primal, const TensorsById& known,
                                        std::map<std::string, int64_t>* matmul_flops_by_op = nullptr);
/// fold.cpp: split_primal() and evaluate_primal(), then binds each residual to its value: the
/// nodes that depend only on primal inputs and constants are evaluated once, and the values
/// the rest of the graph reads become constant inputs (residuals). Residuals that alias a
/// primal input are marked with that input's name. `split`, if given, receives the primal graph;
/// `matmul_flops_by_op` as evaluate_primal's.
bool fold(Graph& g, const TensorsById& known, const SplitOptions& options = {}, PrimalSplit* split = nullptr,
          std::map<std::string, int64_t>* matmul_flops_by_op = nullptr);

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
  /// What the budget was compared with: the whole tangent graph's residuals plus a call's peak
  /// (intermediates and the largest kernel workspace), as the cost model predicts them with the
  /// forms chosen; where a bound on it was within the budget, that bound (the reason says "at
  /// most"). The same in every choice of one graph.
  int64_t counted_bytes = 0;
  /// B·H·Lq·Lk: the elements of its scores (what the P form holds of them).
  int64_t score_elements = 0;
};

/// An attention that attention_match gave the O(L) form.
struct MatchedAttention {
  Node* node = nullptr;  ///< the jvpc::attention_tangent node it built
  Value* o_l = nullptr;  ///< what the tangent's readers now read: the node's result, in their shape
  Value* out = nullptr;  ///< the primal attention output whose tangent that is
  /// Primal values with their tangents (q, k, v and the mask, as the node reads them), from
  /// which the JVP rules give the P form again.
  std::vector<std::pair<Value*, Value*>> seeds;
};

/// attention_match.cpp: recognizes attention on LibTorch's math path and attention written by
/// hand (a softmax over q·kᵀ that multiplies v: scaled, masked, grouped-query, in any of the
/// ways the file's banner lists) in a JVP'd graph, and makes the readers of its tangent read
/// jvpc::attention_tangent (the O(L) form), with the logsumexp a node on the traced scores.
/// Runs before dce, which then drops the P form the rules emitted.
std::vector<MatchedAttention> attention_match(Graph& g);

/// attention_match.cpp: the P form of a matched attention, the tangent of `m.out` by the JVP
/// rules of the primal nodes between the seeds and it, each right after its primal node, as the
/// jvp pass emitted it.
Value* matched_p_form(Graph& g, const MatchedAttention& m);

/// attention_form.cpp: per jvpc::attention_tangent node (the O(L) form the fused attention
/// rules emit), chooses the O(L) form or the P form under `residual_budget` bytes (none: the
/// default, default_memory_limit() of the graph's device; 0: O(L) everywhere; kNoMemoryLimit:
/// P everywhere), and expands those that hold P. Throws when no choice fits, naming the smallest
/// budget that would do. Returns one choice per attention, in graph order. An attention in
/// `matched` that keeps P gets the P form the rules emit (matched_p_form).
std::vector<AttentionChoice> attention_form(Graph& g, std::optional<int64_t> residual_budget,
                                            const std::vector<MatchedAttention>& matched = {});

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
