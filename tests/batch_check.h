// Checks the batching transform (passes/batch.cpp) through Linearized::jvp_batched: K random
// tangents in one batched call against K single calls of jvp().
#pragma once

#include "compiler/api/linearize.h"
#include "tests/helpers.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace jvpc::test {

struct BatchCheck {
  double rel_error = 0;               // the worst over tangents and outputs
  std::vector<std::string> unrolled;  // ops that had no batching rule
};

/// K random tangents per argument of `lin`, stacked: [K, ...].
inline std::vector<at::Tensor> random_batched_tangents(const Linearized& lin, int64_t K) {
  std::vector<at::Tensor> out;
  for (const Input* in : lin.jvp_fn->arguments()) {
    const TensorMeta& m = in->value->meta();
    std::vector<int64_t> sizes = m.sizes;
    sizes.insert(sizes.begin(), K);
    out.push_back(at::randn(sizes, at::TensorOptions().dtype(m.dtype).device(m.device)));
  }
  return out;
}

inline BatchCheck batched_vs_single(const Linearized& lin, int64_t K) {
  BatchCheck r;
  r.unrolled = lin.batched(K).unrolled;
  std::vector<at::Tensor> tangents = random_batched_tangents(lin, K);
  std::vector<at::Tensor> got = lin.jvp_batched(K, tangents);
  for (int64_t k = 0; k < K; ++k) {
    std::vector<at::Tensor> one;
    for (const at::Tensor& t : tangents) one.push_back(t.select(0, k).contiguous());
    std::vector<at::Tensor> want = lin.jvp(one);
    if (want.size() != got.size()) return {1e300, r.unrolled};
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i].dim() < 1 || got[i].size(0) != K || got[i].sizes().slice(1) != want[i].sizes())
        return {1e300, r.unrolled};
      r.rel_error = std::max(r.rel_error, rel_error(got[i].select(0, k), want[i]));
    }
  }
  return r;
}

}  // namespace jvpc::test
