// The cost model: FLOPs, bytes and memory of a graph, computed from its metadata alone.
//
// matmul_flops are counted exactly as PyTorch's FlopCounterMode counts them
// (torch/utils/flop_counter.py): mm and addmm 2·m·n·k, bmm and baddbmm 2·b·m·n·k (the addition
// of addmm/baddbmm is not counted), fused attention forwards (flash, efficient, cuDNN)
// 2·b·h·s_q·s_k·d_qk + 2·b·h·s_q·s_k·d_v, mask ignored. The CPU flash kernel takes the same
// formula (the two bmms it replaces), as torch 2.15's FlopCounterMode counts it; torch 2.11's
// has no rule for it, and the node's note says so. So graph matmul_flops compare directly with
// FlopCounterMode's totals.
//
// Everything else goes in other_flops and transcendentals, by the convention in
// docs/cost-model.md: one per output element for elementwise arithmetic, one per input element
// for reductions, softmax 4 + 1 transcendental per element, and so on. An op the convention
// does not name is counted as elementwise and listed as uncosted. Views and copies cost no
// FLOPs. bytes = bytes read + bytes written, 0 for views; a broadcast (stride-0) operand is read
// once per distinct element.
#pragma once

#include "ir/graph.h"

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <string>

namespace jvpc {

struct NodeCost {
  int64_t matmul_flops = 0;
  int64_t other_flops = 0;
  int64_t transcendentals = 0;
  int64_t bytes = 0;
  const char* note = nullptr;  ///< set where jvpc extends FlopCounterMode's rules
  /// Temporaries the kernel allocates and frees inside itself (jvpc::attention_tangent).
  int64_t workspace_bytes = 0;
  /// The op has no FLOP convention in docs/cost-model.md: its FLOPs (1 per output element) are
  /// a guess.
  bool uncosted = false;
};

NodeCost node_cost(const Node& n);

struct GraphCost {
  int64_t nodes = 0;
  int64_t matmul_flops = 0;
  int64_t other_flops = 0;
  int64_t transcendentals = 0;
  int64_t bytes = 0;
  /// Constant inputs the graph owns (residuals), shared storage counted once.
  int64_t residual_bytes = 0;
  /// Constant inputs that alias the caller's inputs (reported apart: the caller owns them).
  int64_t aliased_input_bytes = 0;
  /// Peak bytes of intermediates and outputs alive at once during one execution, from liveness
  /// (graph inputs and constants excluded: they are held by the caller and residual_bytes).
  int64_t peak_bytes = 0;
  /// The largest workspace of one node (NodeCost::workspace_bytes), held during that node on
  /// top of what liveness counts: peak_bytes + workspace_bytes bounds a call's memory.
  int64_t workspace_bytes = 0;
  std::map<std::string, int64_t> ops;
  /// Nodes per op that has no FLOP convention (NodeCost::uncosted).
  std::map<std::string, int64_t> uncosted_ops;
};

GraphCost graph_cost(const Graph& g);

/// {"nodes", "matmul_flops", "other_flops", "transcendentals", "bytes", "residual_bytes",
///  "aliased_input_bytes", "peak_bytes", "workspace_bytes", "ops", "uncosted_ops"}: what `jvpc cost --json` and reports print.
nlohmann::json to_json(const GraphCost& c);

/// jvpc::attention_tangent (runtime/attention_tangent.h), the O(L) form of attention's tangent:
/// its sizes and which of its optional operands are present.
struct AttentionTangentShape {
  int64_t B = 1, H = 1, Hkv = 1, Lq = 1, Lk = 1, D = 1, Dv = 1;
  bool dq = false, dk = false, dv = false, mask = false, dmask = false, causal = false;
  int64_t block_q = 1, block_k = 1;
  int64_t K = 1;                           ///< tangents per call (jvpc::attention_tangent.batched)
  int64_t dtype_bytes = 4, acc_bytes = 4;  ///< element sizes of q and of its accumulation type
};
/// Score elements (query, key) the operator computes per batch and head: those of every
/// (query block, key block) pair that a causal mask does not hide entirely, as it skips them.
int64_t attention_tangent_score_elements(const AttentionTangentShape& a);
/// Its matmul FLOPs: 2·B·H·(score elements)·(D·(1 + [dq] + [dk]) + Dv·([dS ≠ 0] + [dv])), the
/// bmms it runs (S = q·kᵀ; dq·kᵀ; q·dkᵀ; (P⊙dS)·v; P·dv). With every tangent present that is
/// 2·B·H·Lq·Lk·(3D + 2Dv) without causal skipping. The batched overload, K tangents per call:
/// 2·B·H·(score elements)·(D + K·(D·([dq] + [dk]) + Dv·([dS ≠ 0] + [dv]))), the score recompute once.
int64_t attention_tangent_matmul_flops(const AttentionTangentShape& a);
/// Bytes of the temporaries it holds at once while it runs (block scores, probabilities and
/// their tangent, one block of operands, the accumulators of a query block): bounded by the
/// block sizes, independent of Lq·Lk.
int64_t attention_tangent_workspace_bytes(const AttentionTangentShape& a);
/// The shape of a jvpc::attention_tangent node (or of its batched overload).
AttentionTangentShape attention_tangent_shape(const Node& n);

/// Bytes of one tensor as a kernel reads it: distinct elements × element size.
int64_t distinct_bytes(const TensorMeta& m);

/// The comparisons (eq, ne, lt, le, gt, ge; Scalar and Tensor overloads): boolean results, no
/// tangent, 1 FLOP per output element. The cost table prices them; the loader admits them.
const std::vector<std::string>& comparison_ops();

/// FlopCounterMode's matmul FLOPs for `op` given its operand shapes (an absent optional operand:
/// empty), or -1 if not a matmul op. A convolution also needs its output's shape and whether
/// it is transposed. Shared with the FLOP counter that watches kernels at run time.
int64_t matmul_flops_for(const std::string& op, const std::vector<std::vector<int64_t>>& shapes,
                         const std::vector<int64_t>& out = {}, bool transposed = false);

}  // namespace jvpc
