// The tracer: runs a C++ callable on real tensors and records, as a jvpc Graph, the kernels
// the dispatcher actually executes.
//
// How: a boxed fallback on the dispatch key TESTING_ONLY_GenericMode, switched on for the
// calling thread only while tracing. That key sits above Autograd, so every ATen call reaches
// the fallback first:
//  - an op whose only kernel is CompositeImplicitAutograd (scaled_dot_product_attention,
//    matmul, linear, reshape, ...) is not recorded; it is passed on below our key, runs its
//    decomposition, and the decomposition's own calls come back to the fallback;
//  - any other op (one with a CPU/CUDA or CompositeExplicit kernel: bmm, _safe_softmax, views,
//    factories, fused attention kernels) is recorded as one node and run with our key
//    excluded, so that a kernel's internals never show.
// This sees exactly the ops PyTorch's FlopCounterMode and profiler see at kernel level, needs
// no Python, and works for any callable. The alternatives (a fallback below Autograd on the
// Fake key, which upstream is taking for a C++ fake-tensor mode; a C++ TorchDispatchMode,
// which is tied to one version's PyInterpreter vtable; torch::jit::tracer, which records SDPA
// whole) are documented in docs/design.md.
//
// The IR is functional. In-place ops on intermediates (`add_` in SDPA's masked path) are
// recorded as their out-of-place forms; reading, after such a write, another view of the
// written storage is an error, as is writing to an input. `_reshape_alias` and `_unsafe_view`
// are recorded as `view`. Fused attention kernels are asked for their logsumexp. Recording is in
// tracer.cpp, functionalization in functionalize.{h,cpp}.
#pragma once

#include "ir/graph.h"

#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace jvpc {

/// A callable on tensors: what jvpc traces.
using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct TraceInput {
  std::string name;
  at::Tensor value;
  /// Differentiated by default when floating point (q, k, v; activations and weights; a float
  /// additive mask too, as in torch.func: set false to hold it constant). Boolean masks and
  /// integer indices are never differentiated.
  bool differentiable = true;
  /// State the callable may write in place (a module's buffers: BatchNorm's running statistics
  /// and num_batches_tracked). Its writes are recorded, and the graph returns its final value
  /// after the callable's outputs (Trace::state_of), where a compiled program writes it back at
  /// every call. Never differentiated. Other inputs may not be written.
  bool state = false;
};

struct TraceOptions {
  /// Keep every value the tracing run computed (for folding without a second forward).
  bool keep_values = true;
  /// Let the callable read values computed from the inputs into C++ numbers (item(), if (t),
  /// at::equal, at::allclose) or through aliases made outside the dispatcher (.data()). The graph
  /// then holds those values as constants: right at these inputs only. linearize allows it (its
  /// result is for these primals, and LibTorch's forward AD treats such values as constants
  /// too); a graph traced for replay on other inputs does not.
  bool specialize_on_scalars = false;

  /// The graph alone, no values kept (for saving, showing or replaying it).
  static TraceOptions graph_only() {
    TraceOptions o;
    o.keep_values = false;
    return o;
  }
};

struct Trace {
  std::unique_ptr<Graph> graph;
  /// The callable's outputs, as the tracing run computed them.
  std::vector<at::Tensor> outputs;
  /// The graph's outputs after the callable's: for each, the index of the state input
  /// (TraceInput::state) whose final value it is.
  std::vector<size_t> state_of;
  /// Value id -> tensor computed by the tracing run (inputs included), when keep_values.
  TensorsById values;
  /// The kernels the dispatcher ran, in order, as named by the dispatcher (before the
  /// functional and view normalisation of the graph): views of names that live as long as the
  /// process (OpInfo::name).
  std::vector<std::string_view> kernels;
  /// The matmul FLOPs of those kernels, by op (kernel_matmul_flops, ir/cost/kernel_watch.h;
  /// a jvpc:: operator's are those of the kernels it calls): what a KernelWatch would count.
  std::map<std::string, int64_t> matmul_flops_by_op;
};

/// Traces `fn` on `inputs`. Throws jvpc::Error naming the op for anything the IR cannot
/// express (out= variants, writes to inputs, reads of stale views, unsupported argument types).
Trace trace(const TensorFn& fn, const std::vector<TraceInput>& inputs, const TraceOptions& options = {});

/// Where a tensor's value comes from, as the trace running on this thread knows it: for a front
/// that sees the callable turn a tensor into a number outside the dispatcher (Python's
/// .tolist(), .numpy()), which a graph replayed at other inputs would repeat as it was.
struct ValueOrigin {
  /// Computed from the traced function's inputs (or a view of such a value).
  bool from_inputs = false;
  /// Otherwise, the captured tensors it was computed from (the tensor itself, where the trace
  /// has not seen it yet): the number stays right while none of them is written.
  std::vector<at::Tensor> captured;
};
/// Whether a trace runs on this thread.
bool tracing();
/// The origin of `t` in the trace running on this thread; nullopt where none runs.
std::optional<ValueOrigin> traced_value_origin(const at::Tensor& t);

}  // namespace jvpc
