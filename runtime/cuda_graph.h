// CUDA-graph capture and replay of an Executable's eager run. A graph without random ops whose
// arguments and results all live on one GPU is captured on its first call and replayed after
// that; everything CUDA-specific the runtime does is here, behind JVPC_WITH_CUDA (a build
// without CUDA compiles the same interface, and never captures).
#pragma once

#include "ir/graph.h"

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace jvpc {

/// The device a CUDA graph of `g` captures on: the one CUDA device every argument (`arguments`,
/// the non-constant inputs) and every node result lives on ("cuda" is the current device).
/// Constants may be anywhere (CPU scalars). None where they are not all on one CUDA device,
/// where `impure` (random ops), where JVPC_NO_CUDA_GRAPH is set, and in a build without CUDA.
std::optional<c10::Device> cuda_graph_device(const Graph& g, const std::vector<const Input*>& arguments, bool impure);

/// The allocator ATen's empty() uses on `d` (CUDA's caching allocator on a GPU).
c10::Allocator* device_allocator(const c10::Device& d);

/// A CUDA graph of one eager run. Not thread-safe: the Executable serialises calls.
class CudaGraph {
 public:
  /// An eager run on already checked inputs (what a capture records).
  using Eager = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// One call on `device`, on the caller's current stream. The first runs `eager` on a side
  /// stream (its results are the call's; it also creates cuBLAS handles and workspaces), then
  /// captures the same work without running it; later calls copy `inputs` into the captured
  /// buffers (unless they are those buffers) and replay. Results are copies of the graph's static
  /// outputs unless `static_outputs`. An event orders calls made on different streams.
  /// `arguments` give the static buffers' layouts.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, const std::vector<const Input*>& arguments,
                              c10::Device device, bool static_outputs, const Eager& eager);
  /// Whether a graph has been captured (and later calls replay it).
  bool captured() const;
  /// The captured graph's input buffers, one per argument (empty before capture).
  std::vector<at::Tensor> static_inputs() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace jvpc
