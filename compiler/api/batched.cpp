// Linearized::batched and jvp_batched: the linear map for K tangents per call, compiled from
// the tangent graph by the batching transform (passes/batch.cpp) once per K and cached.
#include "compiler/api/linearize.h"

#include <mutex>
#include <unordered_map>

namespace jvpc {

struct BatchedCache {
  std::mutex mu;
  std::unordered_map<int64_t, std::unique_ptr<BatchedLinear>> by_k;  // entries never move or go
};

std::shared_ptr<BatchedCache> new_batched_cache() { return std::make_shared<BatchedCache>(); }

const BatchedLinear& Linearized::batched(int64_t K) const {
  if (K < 1) throw Error("the number of tangents K must be at least 1, got " + std::to_string(K));
  if (!tangent_graph) throw Error("this Linearized has no tangent graph");
  std::lock_guard<std::mutex> lock(batched_cache->mu);
  auto& slot = batched_cache->by_k[K];
  if (!slot) {
    BatchResult b = batch_tangents(*tangent_graph, K);
    auto entry = std::make_unique<BatchedLinear>();
    entry->K = K;
    entry->unrolled = std::move(b.unrolled);
    ExecutableOptions options;
    if (jvp_fn) {  // the single map's runtime options, as far as they are known
      options.cuda_graph = jvp_fn->cuda_graph_enabled();
    }
    entry->fn = std::make_shared<Executable>(std::shared_ptr<const Graph>(std::move(b.graph)), options);
    // The residuals as the single map holds them: a compiled program's point binds its own to
    // its executable, and leaves the tangent graph's constants unbound (compiler/api/program.h).
    if (jvp_fn) {
      std::unordered_map<std::string, at::Tensor> bound;
      size_t i = 0;
      for (const Input& in : jvp_fn->graph().inputs())
        if (in.role == Role::Constant) {
          const at::Tensor& t = jvp_fn->constants()[i++];
          if (t.defined()) bound[in.name] = t;
        }
      for (const Input& in : entry->fn->graph().inputs()) {
        auto it = in.role == Role::Constant && !in.data.defined() ? bound.find(in.name) : bound.end();
        if (it != bound.end()) entry->fn->bind(in.name, it->second);
      }
    }
    slot = std::move(entry);
  }
  return *slot;
}

std::vector<at::Tensor> Linearized::jvp_batched(int64_t K, const std::vector<at::Tensor>& tangents) const {
  check_captured();
  const BatchedLinear& b = batched(K);
  const auto& args = b.fn->arguments();
  if (tangents.size() != args.size())
    throw Error("expected " + std::to_string(args.size()) + " tangents, got " + std::to_string(tangents.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    const at::Tensor& t = tangents[i];
    const std::string who = "tangent '" + args[i]->name + "'";
    const TensorMeta& m = args[i]->value->meta();
    if (!t.defined()) throw Error(who + " is an undefined tensor");
    if (t.dim() < 1 || t.size(0) != K)
      throw Error(who + ": expected K = " + std::to_string(K) + " tangents on the leading dim, got " +
                  (t.dim() < 1 ? std::string("a 0-d tensor") : std::to_string(t.size(0))));
    if (t.sizes().vec() != m.sizes || t.scalar_type() != m.dtype)
      throw Error(who + ": expected " + m.str() + " (K tangents of its primal), got " + TensorMeta::of(t).str());
  }
  return b.fn->run(tangents);
}

}  // namespace jvpc
