// jvpc linearize's checks: the linear map on random tangents against a reference, and K
// tangents in one batched call against K single calls. The reference is LibTorch's forward AD
// run eagerly on the untraced callable (math SDPA backend), or for a graph file on the graph
// itself with fused attention on the math path. Where that reference would not fit in memory
// (the math path holds B·H·Lq·Lk scores several times over; forward_ad_bytes_estimate against
// the memory limit), the check runs against central differences in float64 through the
// function's own (fused, O(L)) kernels instead, and says so.
#pragma once

#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "compiler/cli/target.h"

#include <optional>
#include <string>
#include <vector>

namespace jvpc::cli {

/// What the tangents are checked against.
struct References {
  TensorFn forward_ad;  ///< run under forward AD (math attention)
  /// The function on its own (fused) attention kernels, for central differences in float64:
  /// the check's reference where forward AD of the math path would not fit in memory.
  TensorFn fused;
  /// Examples and graphs in float16/bfloat16: the reference runs on float32 copies of the
  /// primals and tangents. It is the truer answer, and LibTorch's forward AD has half-precision
  /// gaps of its own (layer_norm's float32 statistics on CUDA meet float16 weights).
  bool in_float32 = false;
};
References references_for(const Target& t, const LimitFlags& limits);

/// The linear map on random tangents (seeded) against the reference: forward AD where it fits
/// the memory limit (or with --check-reference forward-ad), else central differences in float64.
struct Check {
  ErrorStats err;
  double tolerance;
  bool passed;
  bool central_differences = false;
  std::string why;  ///< why that reference
  int64_t forward_ad_bytes = 0, memory_limit = 0;
};
Check check(const References& refs, const std::vector<std::string>& primal_names, const Linearized& lin,
            const std::vector<at::Tensor>& primal_values, uint64_t seed, std::optional<double> tolerance,
            const std::string& reference, std::optional<int64_t> max_memory);

/// --tangents K: K random tangents in one batched call (Linearized::jvp_batched), its matmul
/// FLOPs measured on the kernels that ran and its time, checked against K single calls.
struct BatchedCheck {
  int64_t K = 0;
  int64_t matmul_flops = 0, model_flops = 0, single_flops = 0;
  double ms = 0, single_ms = 0;  ///< one batched call; one single call
  std::vector<std::string> unrolled;
  double rel_error = 0, tolerance = 0;
  bool passed = false;
};
BatchedCheck check_batched(const Linearized& lin, int64_t K, uint64_t seed, std::optional<double> tolerance);

}  // namespace jvpc::cli
