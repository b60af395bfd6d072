// The jvpc runtime: executes a Graph through ATen, on CPU or CUDA. Depends on the IR only, so
// an application can load a compiled tangent graph and run it without the tracer or passes:
//
//   auto g = jvpc::load("tangent.json");              // constants come from tangent.safetensors
//   jvpc::Executable f(std::move(g));
//   std::vector<at::Tensor> dy = f({dq, dk, dv});      // one tensor per non-constant input
//
// At construction every node is resolved to a dispatcher handle and a boxed-argument template;
// a call fills in the tensors, calls each kernel and releases each intermediate after its last
// use; a node whose first operand dies there and that has an in-place form (baddbmm_, add_, ...)
// runs in place, reusing that buffer. Before a node whose op takes indices (gather, embedding,
// max_pool's backward: ir/op_contracts.h) runs, its index arguments are checked
// against the tensors actually passed, on the host, so that no kernel reads or writes outside
// them; a graph with an op that addresses storage by absolute offsets (as_strided, copy) gets
// inputs that own their storage (a view into a larger buffer is copied first); an uninitialized
// allocation (empty and its kin) is zeroed. Inputs are never written. They are checked against the
// graph's signature; a contiguous input declared contiguous is used as it is (but for storage offsets, above). An
// output that is a constant, or that repeats an earlier output, is returned as a copy; one that
// is an input (an identity map) is that input, as in eager PyTorch. The first call checks every node's results against the
// shapes and dtypes the graph declares.
//
// CUDA: work is issued on the caller's current stream. A graph on a CUDA device with static
// shapes, no random ops and no checked index arguments is captured as a CUDA graph on the first call and replayed after
// that (ExecutableOptions::cuda_graph). Inputs are then copied into static buffers, unless the
// caller wrote them there directly (input_buffers()), and outputs are copied out of the
// graph's static memory unless ExecutableOptions::static_outputs.
//
// Threads: run() may be called from several threads at once on CPU, and on CUDA when no CUDA
// graph is used. With a CUDA graph, calls are serialised by a mutex (the static buffers are
// shared), and on the GPU by an event: a call on one stream waits until the previous call's
// replay and output copies, on whatever stream, are done. Capture is thread-local, so other
// threads may use CUDA meanwhile. bind() must not race with run().
//
// Files: the plan (slots, steps, in-place forms, releases) is made in runtime/plan.cpp, the
// CUDA-graph capture and replay are in runtime/cuda_graph.cpp; this file binds, checks and runs.
#pragma once

#include "ir/graph.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>

namespace jvpc {

struct Plan;
class CudaGraph;

struct ExecutableOptions {
  /// Capture and replay a CUDA graph where that is safe (CUDA device, no impure nodes).
  bool cuda_graph = true;
  /// With a CUDA graph: return the graph's static output tensors (overwritten by the next call)
  /// instead of copies. The first call, which runs eagerly and then captures, returns fresh
  /// tensors; replays return the static ones.
  bool static_outputs = false;
  /// Run a node in place (add_, baddbmm_, ...) when its first operand is an intermediate that
  /// dies there, reusing its buffer.
  bool reuse_buffers = true;
  /// While a Python dispatch mode is active on the calling thread (FlopCounterMode around a call
  /// from Python), run every node as the graph names it (no in-place forms, which such a mode may
  /// not know: FlopCounterMode counts baddbmm, not baddbmm_) and eagerly (a CUDA-graph replay
  /// dispatches nothing, so a mode would see nothing).
  bool functional_under_dispatch_mode = true;
  /// The constructor refuses a graph whose constants, inputs and peak of intermediates
  /// (memory_needed in ir/io/limits.h) pass this many bytes on its device. None:
  /// default_memory_limit() of the device (3/4 of its memory); kNoMemoryLimit: no check.
  std::optional<int64_t> max_memory;

  /// No CUDA graph: every call runs node by node (in-place reuse of dying buffers stays).
  static ExecutableOptions eager() {
    ExecutableOptions o;
    o.cuda_graph = false;
    return o;
  }
  /// Each node by itself, as written: no CUDA graph, no buffer reuse (a reference run).
  static ExecutableOptions plain() {
    ExecutableOptions o = eager();
    o.reuse_buffers = false;
    return o;
  }
};

class Executable {
 public:
  explicit Executable(std::shared_ptr<const Graph> graph, ExecutableOptions options = {});
  /// For a graph the caller verified just now (a pass pipeline's output): not verified again.
  struct Verified {};
  Executable(std::shared_ptr<const Graph> graph, ExecutableOptions options, Verified);
  explicit Executable(std::unique_ptr<Graph> graph, ExecutableOptions options = {})
      : Executable(std::shared_ptr<const Graph>(std::move(graph)), options) {}
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  /// Binds (or rebinds) the tensor of a constant input, moved to the graph's device (and made
  /// contiguous where the graph declares it so). The tensor itself is held, not a copy. A graph's
  /// constants hold values computed together (a residual that aliases a caller's input, others
  /// computed from it), so run() refuses to go on once any constant has been written in place
  /// since it was bound or compiled (its version counter moved), naming it: compile again then.
  /// The constructor refuses the same for the graph's constants. Inference tensors keep no
  /// version counter: writes into them (possible only inside InferenceMode) go unseen.
  void bind(const std::string& constant_name, const at::Tensor& value);

  /// A new Executable of the same graph and plan, with other constants: one tensor per constant
  /// input, in graph order, each checked and held as bind() holds it. Nothing is verified or
  /// planned again (what a compiled program does at each point: its residuals are new, its
  /// tangent graph is not). The copy captures its own CUDA graph, if any.
  std::unique_ptr<Executable> with_constants(const std::vector<at::Tensor>& constants) const;
  /// The bound constants, one per constant input in graph order (undefined: not bound).
  const std::vector<at::Tensor>& constants() const { return constants_; }

  /// Runs the graph. `inputs` holds one tensor per non-constant graph input, in graph order.
  /// Where grad mode is on and an input or a constant requires grad, every node runs as the
  /// graph names it, eagerly (no in-place reuse, no CUDA graph), and autograd records it as it
  /// records eager code; otherwise the graph records nothing (its results have no grad_fn).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs);
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) { return run(inputs); }

  /// The inputs run() would use, checked as run() checks them (shapes, dtypes, devices; a view
  /// the graph was not compiled for made contiguous), and the constants against writes since they
  /// were bound: what another runner of this graph's computation (Inductor's) must check too.
  std::vector<at::Tensor> checked(const std::vector<at::Tensor>& inputs) const;
  /// The non-constant inputs run() takes, in order.
  const std::vector<const Input*>& arguments() const;
  const Graph& graph() const { return *graph_; }

  /// True once a CUDA graph has been captured and is being replayed.
  bool replaying_cuda_graph() const;
  /// Whether this executable will capture a CUDA graph on its first call.
  bool cuda_graph_enabled() const { return cuda_device_.has_value(); }
  /// With a CUDA graph: the static input buffers, one per argument (captured on first use with
  /// these shapes). A caller may write inputs into them and pass them to run() to skip copies.
  std::vector<at::Tensor> input_buffers();

 private:
  /// Runs without CUDA-graph capture (what a capture records). `inputs` are already checked.
  /// `functional`: every node in the form the graph names (no in-place reuse).
  std::vector<at::Tensor> run_eager(const std::vector<at::Tensor>& inputs, bool functional = false) const;
  /// Whether autograd records a run on `inputs` (grad mode, and an input or constant requiring grad).
  bool records_autograd(const std::vector<at::Tensor>& inputs) const;
  /// `value` checked against constant `i` and moved to the graph's device (bind()'s rules).
  at::Tensor bindable(size_t i, const at::Tensor& value) const;
  Executable(const Executable& other, std::vector<at::Tensor> constants);

  std::shared_ptr<const Graph> graph_;
  ExecutableOptions options_;
  std::shared_ptr<const Plan> plan_;              // slots and steps (runtime/plan.h), shared by with_constants()
  std::vector<at::Tensor> constants_;             // per plan constant: its tensor
  std::vector<std::optional<int64_t>> versions_;  // per constant: its version when bound (none: inference tensor)
  std::optional<c10::Device> cuda_device_;        // where a CUDA graph is captured; none: no CUDA graph
  std::unique_ptr<CudaGraph> cuda_;
  std::mutex mu_;
  mutable std::atomic<bool> results_checked_{false};
};

/// Executes a single node on concrete tensors (one per operand). Used by constant folding.
std::vector<at::Tensor> execute_node(const Node& n, const std::vector<at::Tensor>& operands);

}  // namespace jvpc
