// The reference jvpc is checked against: LibTorch's own forward-mode AD, run eagerly.
#pragma once

#include "compiler/trace/tracer.h"

#include <optional>

namespace jvpc {

/// J_fn(primals)·tangents by LibTorch's forward AD (dual tensors). A missing tangent is zero.
/// Force the math SDPA backend inside fn: fused attention kernels have no forward-AD formula.
std::vector<at::Tensor> forward_ad_jvp(const TensorFn& fn, const std::vector<at::Tensor>& primals,
                                       const std::vector<std::optional<at::Tensor>>& tangents);

/// A copy of `g` with each fused attention kernel (flash, efficient, cuDNN, CPU flash) replaced by
/// LibTorch's math path (_scaled_dot_product_attention_math), on which forward AD runs: the
/// reference for a graph file, as the math backend is for an example. Throws when another
/// output of a fused kernel (its logsumexp, ...) is read, or for attention the math path does
/// not compute (dropout, causal attention aligned to the bottom right).
std::unique_ptr<Graph> with_math_attention(const Graph& g);

/// J_fn(primals)·tangents by central differences, (fn(x + h·t) − fn(x − h·t)) / 2h, with the
/// floating-point primals and tangents in float64 (fn must accept them). A missing tangent is
/// zero. A reference that shares nothing with forward AD.
std::vector<at::Tensor> central_differences_jvp(const TensorFn& fn, const std::vector<at::Tensor>& primals,
                                                const std::vector<std::optional<at::Tensor>>& tangents,
                                                double h = 1e-6);

/// Bytes LibTorch's forward AD of a function with attention on the math path needs at its peak,
/// predicted: each value and its tangent alive at the forward's peak (2 × (`input_bytes` +
/// `forward_peak_bytes`, the traced graph's liveness peak)), plus per attention 6 × its score
/// elements (B·H·Lq·Lk) × `element_bytes`: the scores, the probabilities, their tangents and the
/// temporaries of softmax's tangent, which the math path allocates and a fused kernel does not.
/// What `jvpc linearize` compares with the memory limit to choose its check's reference.
int64_t forward_ad_bytes_estimate(int64_t input_bytes, int64_t forward_peak_bytes,
                                  const std::vector<int64_t>& attention_score_elements, int64_t element_bytes);

/// The tolerance on rel_error of a check against central differences in float64 for outputs
/// computed in `dtype`: tolerance_for(dtype), but no tighter than 1e-7 (the differences' own
/// truncation and rounding error, with h = 1e-6).
double central_differences_tolerance(c10::ScalarType dtype);

/// ‖a − b‖ / ‖b‖ over all tensors (float64), and max |a − b|.
/// A non-finite value on either side makes both errors NaN (the check cannot pass) and is
/// counted apart.
struct ErrorStats {
  double rel_error = 0;
  double max_abs_error = 0;
  int64_t nonfinite_got = 0, nonfinite_reference = 0;
};
ErrorStats compare(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& reference);
/// t on the CPU in float64, a complex t as its (re, im) pairs (view_as_real), for comparisons.
at::Tensor real_pairs(const at::Tensor& t);

/// The tolerance on rel_error for a dtype: float64 1e-10, float32 1e-5, float16/bfloat16 2e-2.
double tolerance_for(c10::ScalarType dtype);
/// The tolerance for a set of outputs: that of the least precise floating-point one (float32's
/// when none is floating-point). Integer and bool outputs have no tangent to check.
double tolerance_for(const std::vector<at::Tensor>& outputs);

}  // namespace jvpc
