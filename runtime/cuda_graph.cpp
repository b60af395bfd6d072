// CUDA-graph capture and replay (runtime/cuda_graph.h).
#include "runtime/cuda_graph.h"

#include <ATen/ATen.h>

#ifdef JVPC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdlib>

namespace jvpc {

struct CudaGraph::State {
#ifdef JVPC_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::vector<at::Tensor> static_inputs;
  std::vector<at::Tensor> static_outputs;
  at::cuda::CUDAEvent done;  // recorded after each replay's outputs are copied out
#endif
};

std::optional<c10::Device> cuda_graph_device(const Graph& g, const std::vector<const Input*>& arguments, bool impure) {
  // A CUDA graph replays only GPU work: every argument and every node result must be on one
  // CUDA device (constants may be anywhere, e.g. CPU scalars).
  bool one_cuda_device = true;
  c10::Device device(c10::kCPU);
  auto on_device = [&](const Value* v) {
    c10::Device d = v->meta().device;
#ifdef JVPC_WITH_CUDA
    if (d.is_cuda() && !d.has_index()) d = c10::Device(c10::kCUDA, c10::cuda::current_device());  // "cuda"
#endif
    if (!d.is_cuda() || (device.is_cuda() && d != device)) one_cuda_device = false;
    device = d;
  };
  for (const Input* in : arguments) on_device(in->value);
  for (const Node* n : g.nodes())
    for (const Value* o : n->outputs()) on_device(o);
#ifdef JVPC_WITH_CUDA
  if (one_cuda_device && device.is_cuda() && !impure && !std::getenv("JVPC_NO_CUDA_GRAPH")) return device;
#else
  (void)impure;
#endif
  return std::nullopt;
}

c10::Allocator* device_allocator(const c10::Device& d) {
#ifdef JVPC_WITH_CUDA
  if (d.is_cuda()) return c10::cuda::CUDACachingAllocator::get();
#endif
  return c10::GetAllocator(d.type());
}

CudaGraph::CudaGraph() : s_(std::make_unique<State>()) {}
CudaGraph::~CudaGraph() = default;

bool CudaGraph::captured() const {
#ifdef JVPC_WITH_CUDA
  return s_->graph != nullptr;
#else
  return false;
#endif
}

std::vector<at::Tensor> CudaGraph::static_inputs() const {
#ifdef JVPC_WITH_CUDA
  return s_->static_inputs;
#else
  return {};
#endif
}

std::vector<at::Tensor> CudaGraph::run(const std::vector<at::Tensor>& in, const std::vector<const Input*>& arguments,
                                       c10::Device device, bool static_outputs, const Eager& eager) {
#ifdef JVPC_WITH_CUDA
  c10::cuda::CUDAGuard device_guard(device);
  State& st = *s_;
  auto current = c10::cuda::getCurrentCUDAStream(device.index());
  st.done.block(current);  // a call on another stream may still be reading the static buffers
  std::vector<at::Tensor> outs;
  if (!st.graph) {
    // First call: run eagerly on a side stream (this run's results are the call's results, and
    // it creates cuBLAS handles and workspaces before capture), then capture the same work
    // without executing it. Later calls replay it: each call executes the graph once.
    st.static_inputs.clear();
    for (size_t i = 0; i < in.size(); ++i) {
      const TensorMeta& m = arguments[i]->value->meta();
      st.static_inputs.push_back(at::empty_strided(m.sizes, m.strides, in[i].options()).copy_(in[i]));
    }
    auto side = c10::cuda::getStreamFromPool(false, device.index());
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      outs = eager(st.static_inputs);
      auto g = std::make_unique<at::cuda::CUDAGraph>();
      // Thread-local capture: other threads' CUDA calls stay legal while this one captures.
      g->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        st.static_outputs = eager(st.static_inputs);
      } catch (...) {
        try {
          g->capture_end();
        } catch (...) {  // the capture was invalidated; the node's error is the one to report
        }
        throw;
      }
      g->capture_end();
      st.graph = std::move(g);
    }
    at::cuda::CUDAEvent captured;
    captured.record(side);
    captured.block(current);
    for (at::Tensor& t : outs) {
      for (const at::Tensor& buffer : st.static_inputs)
        if (t.is_alias_of(buffer)) t = t.clone();  // an output that is an input: the next call overwrites it
      if (t.is_cuda()) t.record_stream(current);   // made on the side stream, read on the caller's
    }
  } else {
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].data_ptr() != st.static_inputs[i].data_ptr()) st.static_inputs[i].copy_(in[i]);
    st.graph->replay();
    outs = st.static_outputs;
    if (!static_outputs)
      for (at::Tensor& t : outs) t = t.clone();
  }
  st.done.record(current);
  return outs;
#else
  (void)arguments, (void)device, (void)static_outputs;
  return eager(in);
#endif
}

}  // namespace jvpc
