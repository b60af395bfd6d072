// jvpc's public compiler API: linearize and jvp of C++ callables on tensors.
//
//   auto lin = jvpc::linearize(fn, {{"q", q}, {"k", k}, {"v", v}});
//   at::Tensor out = lin.primal_outputs[0];      // f(q, k, v), computed once, while tracing
//   auto dout = lin.jvp({dq, dk, dv});           // J·(dq, dk, dv); call it again and again
//
// linearize traces fn once (that run is the only forward evaluation), differentiates the
// graph, folds every primal-only value into residuals (reusing the tracing run's values), and
// minimises the tangent graph. The result holds the tangent graph, an Executable for it on the
// primals' device, and the per-pass compile report.
//
// Threads: jvp() may be called from several threads at once on one Linearized (it runs the
// Executable, whose guarantee runtime/executable.h states: concurrent run() calls on CPU, and
// on CUDA without a CUDA graph; with one, calls are serialised). linearize() itself traces on
// the calling thread only; ops the callable runs on threads of its own are not traced.
#pragma once

#include "ir/cost/cost_model.h"
#include "compiler/trace/tracer.h"
#include "passes/cost_table.h"
#include "passes/linearize_pipeline.h"
#include "runtime/executable.h"

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <memory>

namespace jvpc {

struct LinearizeOptions {
  /// Primal inputs to differentiate, in the order jvp() takes their tangents; empty: those
  /// marked differentiable, in graph order.
  std::vector<std::string> wrt;
  /// Optimizations to leave out, to see what each one does: the optional passes of
  /// linearize_passes() (passes/linearize_pipeline.h). The tangent graph is as correct, and larger.
  std::set<std::string> disabled_passes;
  /// Extra observers of the pass pipeline (IR dumps, ...).
  std::vector<PassObserver*> observers;
  /// Verify the whole graph after every pass, not only the pipeline's input and output (the test
  /// suite's default: JVPC_VERIFY_EACH=1).
  bool verify_each = verify_each_by_default();
  /// Bytes the attentions' tangents may take (residuals plus peak per call, see
  /// passes/attention_form.cpp): each attention holds P where that fits, else takes the O(L)
  /// form. None: default_memory_limit() of the device (ir/io/limits.h); 0: the O(L) form
  /// everywhere; kNoMemoryLimit: the P form everywhere.
  std::optional<int64_t> residual_budget;
  /// Count the graph after every pass that changed it: the cost table CompileReport::passes
  /// holds (`jvpc linearize` prints it, report()["passes"] gives it). Off, only the traced graph
  /// and the tangent graph are counted, as the rows "trace" and "tangent graph": a count per
  /// pass is a tenth of a whole model's compile.
  bool pass_costs = false;
  ExecutableOptions runtime;
};

/// The wall time of one phase of a compile, in milliseconds.
struct PhaseTime {
  std::string phase;
  double ms = 0;
};

struct CompileReport {
  /// One row for the traced graph ("trace"), then one per pass (LinearizeOptions::pass_costs),
  /// or one for the tangent graph ("tangent graph").
  std::vector<CostRow> passes;
  /// Cost of the traced forward graph.
  GraphCost forward;
  /// Matmul FLOPs of the kernels that ran during linearize (tracing and folding), measured.
  int64_t linearize_matmul_flops = 0;
  std::map<std::string, int64_t> linearize_matmul_by_op;
  /// Cost of the final tangent graph.
  GraphCost tangent;
  /// Per attention, the form of its tangent chosen under the residual budget, and why.
  std::vector<AttentionChoice> attention;
  /// The random ops the traced function drew with, in order: the map is for those draws.
  std::vector<std::string> random_ops;
  /// Wall time of each pass and of its verification (not deterministic: --timing and --report).
  std::vector<PassTime> timings;
  /// Wall time of linearize's phases, in order: "trace" ("evaluate" for a given graph),
  /// "passes", "verification", "executable" (planning the tangent graph's), "shape inference"
  /// (the part of the passes' and verification's time spent inferring shapes the memo did not
  /// answer, ir/shape_memo.h), "total". A linearize answered from a LinearizeCache
  /// shows "trace", "cache" (the lookup), "fold" (the cached primal graph run at this point)
  /// and "total".
  std::vector<PhaseTime> phases;
};

/// The linear map for K tangents at once (Linearized::batched): the batched tangent graph
/// (passes/batch.cpp) and an Executable for it.
struct BatchedLinear {
  int64_t K = 1;
  std::shared_ptr<Executable> fn;
  /// Ops without a batching rule, run as K unrolled copies of themselves.
  std::vector<std::string> unrolled;
};
struct BatchedCache;
/// A fresh, empty cache of batched linear maps (compiler/api/batched.cpp).
std::shared_ptr<BatchedCache> new_batched_cache();

struct Linearized {
  std::vector<at::Tensor> primal_outputs;
  std::shared_ptr<const Graph> tangent_graph;
  std::shared_ptr<Executable> jvp_fn;
  CompileReport report;
  /// Names of the tangents jvp() takes, in order ("dq", "dk", ...).
  std::vector<std::string> tangent_names() const;
  /// The linear map: one tangent per differentiated primal input, in tangent_names() order
  /// (LinearizeOptions::wrt's order, or graph order).
  std::vector<at::Tensor> jvp(const std::vector<at::Tensor>& tangents) const {
    check_captured();
    return jvp_fn->run(tangents);
  }

  /// The linear map for K tangents at once: each tangent has a leading dim K (K tangents of its
  /// primal stacked), and so does each result. Compiled on first use for each K and cached
  /// (thread-safe; copies of this Linearized share the cache). A wrong K, shape, dtype or device
  /// is a jvpc::Error naming the tangent.
  std::vector<at::Tensor> jvp_batched(int64_t K, const std::vector<at::Tensor>& tangents) const;
  /// The compiled batched map for K (compiled on first use, then cached).
  const BatchedLinear& batched(int64_t K) const;
  std::shared_ptr<BatchedCache> batched_cache = new_batched_cache();

  /// A tensor the traced callable captured (a constant of the traced graph: a module's
  /// parameter, a global), by its version counter only (the tensor itself is not held).
  struct Captured {
    std::string name;  ///< "c0", ... as in the traced graph
    TensorMeta meta;   ///< its type, for the error
    c10::VariableVersion version;
    uint32_t at = 0;  ///< its version when traced
  };
  /// The residuals were computed from these tensors' values at linearize time, so jvp() refuses
  /// to run once one of them has been written in place (an optimizer step): linearize again.
  std::vector<Captured> captured;
  /// Throws jvpc::Error naming the first captured tensor written in place since linearize.
  void check_captured() const;
};

/// Linearizes `fn` at `primals`.
Linearized linearize(const TensorFn& fn, const std::vector<TraceInput>& primals, const LinearizeOptions& options = {});

/// Linearizes a traced graph (e.g. loaded from JSON) at `primal_values`, one per primal input
/// in graph order. The forward is evaluated once, node by node, and fold reuses its values.
Linearized linearize(std::unique_ptr<Graph> graph, const std::vector<at::Tensor>& primal_values,
                     const LinearizeOptions& options = {});

class KernelWatch;

namespace detail {
/// What linearize and compile (program.h) share: runs linearize_passes() on a trace, whose
/// values are fold's, and makes the Linearized at the traced point. `split`: see
/// LinearizeConfig::split.
Linearized linearize_trace(Trace&& t, const LinearizeOptions& options, KernelWatch& watch,
                           std::shared_ptr<PrimalSplit> split = nullptr);
/// trace(), with `watch` paused: the tracer counts the matmul FLOPs of the kernels it records,
/// which are added to the watch (watching every dispatcher call costs a third of a forward).
/// Refuses state inputs (TraceInput::state), which only compile's programs write back: a
/// linearize's trace writes them once, as eager code does, as ordinary captured tensors.
void refuse_state(const std::vector<TraceInput>& inputs, const char* who);
Trace counted_trace(const TensorFn& fn, const std::vector<TraceInput>& inputs, const TraceOptions& options,
                    KernelWatch& watch);
/// A graph's forward evaluated node by node at `primal_values` (checked against its primal
/// inputs), as a Trace with every value.
Trace evaluate_graph(std::unique_ptr<Graph> graph, const std::vector<at::Tensor>& primal_values);
/// The graph's captured tensors (bound constants other than inference tensors), by version.
std::vector<Linearized::Captured> captured_of(const Graph& g);
/// Milliseconds since t0.
double ms_since(std::chrono::steady_clock::time_point t0);
/// Puts the phase `first` (the trace, or a graph's evaluation) first in r.phases and "total"
/// (since t0) last.
void add_trace_and_total(CompileReport& r, double trace_ms, std::chrono::steady_clock::time_point t0,
                         const char* first = "trace");
}  // namespace detail

struct JvpResult {
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> tangents;
};
/// One-shot forward-mode derivative: f(primals) and J·tangents.
JvpResult jvp(const TensorFn& fn, const std::vector<TraceInput>& primals, const std::vector<at::Tensor>& tangents,
              const LinearizeOptions& options = {});

}  // namespace jvpc
