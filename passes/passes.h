// Every pass jvpc has, as a free function on a Graph (returns true if it changed the graph)
// and as a named Pass for pipelines. This header holds the API contract only: arguments, return
// values, preconditions. One pass per file, and that file's banner (the comment at the top of
// passes/<name>.cpp, with a before/after example) is where the pass is described, once: what it
// rewrites, where, and why. Its tests are tests/ir/<name>.ir. Local rewrites run through
// rewrite_nodes() (passes/rewrite.h).
#pragma once

#include "passes/pass.h"
#include "passes/rewrite.h"

#include <functional>
#include <map>
#include <optional>
#include <unordered_map>

namespace jvpc {

/// jvp.cpp. Differentiates with respect to the primal inputs `wrt` names, in that order (empty:
/// those marked differentiable). Returns true; throws jvpc::Error where it cannot (the banner).
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
/// fold.cpp. The values that become residuals (the banner says which), each once, in graph
/// order: `varying` is tangent_dependent(g); g's outputs from `first_output` on count as tangent
/// reads; a graph input is one only where `input_held` says so.
std::vector<Value*> residual_values(Graph& g, const ValueSet& varying, size_t first_output,
                                    const std::function<bool(const Input&)>& input_held);
/// fold.cpp. Moves the primal graph out of `g`, which keeps the tangent graph, its residuals
/// read from unbound constant inputs. Throws if a primal output reads tangents.
PrimalSplit split_primal(Graph& g, const SplitOptions& options = {});
/// fold.cpp. A primal graph's outputs: `known` holds tensors already computed (value id ->
/// tensor: the tracing run's values, the primal inputs); the rest is run through the runtime.
/// `matmul_flops_by_op`, if given, adds the matmul FLOPs of the nodes it runs
/// (kernel_matmul_flops, ir/cost/kernel_watch.h).
std::vector<at::Tensor> evaluate_primal(const Graph& primal, const TensorsById& known,
                                        std::map<std::string, int64_t>* matmul_flops_by_op = nullptr);
/// fold.cpp. split_primal() and evaluate_primal(), then binds each residual. `known` and
/// `matmul_flops_by_op` as evaluate_primal's; `split`, if given, receives the primal graph.
/// Returns false where there was nothing to fold.
bool fold(Graph& g, const TensorsById& known, const SplitOptions& options = {}, PrimalSplit* split = nullptr,
          std::map<std::string, int64_t>* matmul_flops_by_op = nullptr);

/// dce.cpp. `prune_primal_inputs`: on a tangent graph after fold, also unread primal inputs
/// and draws. Returns whether it changed g.
bool dce(Graph& g, bool prune_primal_inputs = false);

/// drop_primal_outputs.cpp: erases the graph's first `n` outputs (a jvpc::Error if it has fewer).
bool drop_primal_outputs(Graph& g, size_t n);

/// cse.cpp. Returns whether it changed g.
bool cse(Graph& g);

/// simplify_views.cpp. Returns whether it changed g.
bool simplify_views(Graph& g);

/// simplify_arith.cpp. Returns whether it changed g.
bool simplify_arith(Graph& g);

/// scale_to_residual.cpp. On a JVP'd graph, before fold. Returns whether it changed g.
bool scale_to_residual(Graph& g);

/// merge_factors.cpp. On a JVP'd graph, before fold. Returns whether it changed g.
bool merge_factors(Graph& g);

/// select_masks.cpp. On a JVP'd graph, before fold. Returns whether it changed g.
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

/// attention_match.cpp. On a graph right after jvp, with its primal outputs still returned;
/// dce then drops the P forms it replaced. Returns the attentions it matched, in graph order;
/// throws jvpc::Error naming the attention where matching or building one fails.
std::vector<MatchedAttention> attention_match(Graph& g);

/// attention_match.cpp. Emits the P form of `m` (one of attention_match's results on `g`)
/// again; returns the tangent of `m.out` it gives. The caller redirects the O(L) form's readers.
Value* matched_p_form(Graph& g, const MatchedAttention& m);

/// attention_form.cpp. `residual_budget`: bytes (none: default_memory_limit() of the graph's
/// device; 0: O(L) everywhere; kNoMemoryLimit: P everywhere). `matched`: attention_match's
/// results on `g`. Returns one choice per jvpc::attention_tangent node, in graph order; throws
/// jvpc::Error when no choice fits, naming the smallest budget that would do.
std::vector<AttentionChoice> attention_form(Graph& g, std::optional<int64_t> residual_budget,
                                            const std::vector<MatchedAttention>& matched = {});

/// zero_blocks.cpp. Returns whether it changed g.
bool zero_blocks(Graph& g);

/// group_bmm.cpp. On a JVP'd graph, before fold. Returns whether it changed g.
bool group_bmm(Graph& g);

/// What batch_tangents made: the batched graph, and the ops that had no batching rule.
struct BatchResult {
  std::unique_ptr<Graph> graph;
  /// Ops without a batching rule, each applied as K unrolled copies of itself (sorted, once each).
  std::vector<std::string> unrolled;
};

/// batch.cpp. From `g`, a tangent graph for one tangent (after fold; left as it is), the graph
/// for K ≥ 1 tangents stacked on a new leading axis, tidied by batched_passes(). Throws
/// jvpc::Error for K < 1 or a batching rule that fails.
BatchResult batch_tangents(const Graph& g, int64_t K);

/// fuse_matmul_add.cpp. Returns whether it changed g.
bool fuse_matmul_add(Graph& g);

}  // namespace jvpc
