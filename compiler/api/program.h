// Compile once, linearize anywhere: a compiled program is linearize's work split as partial
// evaluation splits it.
//
//   jvpc::Program prog = jvpc::compile(fn, {{"q", q}, {"k", k}, {"v", v}});   // traces and optimizes once
//   jvpc::Linearized lin = prog.linearize({q2, k2, v2});   // runs the primal graph only
//   auto dout = lin.jvp({dq, dk, dv});                      // the tangent graph, at (q2, k2, v2)
//
// compile traces fn at the example primals (without specialize_on_scalars: a read of a value into
// a C++ number is an error naming the op), runs linearize's pipeline, and at fold's position
// splits the graph (passes/fold.cpp, split_primal): the primal graph, from the primal inputs and
// the captured tensors to the primal outputs plus the residuals; and the tangent graph, from the
// residuals and tangents to the output tangents, the same minimal graph linearize makes.
// linearize(fn, x) is that primal graph run once on values its tracing run already has; a
// program runs it through the runtime at each new point, and binds the residuals it returns to
// a copy of the tangent graph's Executable that shares its plan (Executable::with_constants).
// No tracing and no passes run at a new point.
//
// Tensors the callable captured (a module's weights) are inputs of the primal graph, read as they
// are at each linearize: an optimizer step between two points is seen. Each linearization owns
// its residuals (a residual that is a captured tensor is a copy of it), so earlier ones stay
// valid; one that aliases a caller's primal input is protected by the Executable's check of
// constants written in place.
//
// Guards: new primals must match the example primals in number, shape, dtype, device and
// (ProgramOptions::exact_strides) strides; a mismatch is a one-line jvpc::Error naming the input
// and both values. Ops whose output shapes depend on the input values (nonzero, unique, ...)
// cannot be compiled.
//
// The runtime half (running the primal graph, binding residuals, the guards, captured tensors) is
// runtime/program.h's ProgramExecutable, which an application linking jvpc::runtime alone uses.
//
// Threads: Program::linearize calls on one program are serialised (a captured tensor's new
// version is bound between them); the Linearized they return are independent.
#pragma once

#include "compiler/api/linearize.h"
#include "ir/io/graph_files.h"
#include "ir/io/safetensors.h"
#include "runtime/program.h"

#include <memory>

namespace jvpc {

struct ProgramOptions {
  LinearizeOptions linearize;
  /// New primals must have the example primals' strides exactly (dims of size 1 aside); false:
  /// other layouts are copied into the compiled one.
  bool exact_strides = true;
};

/// A compiled program. Copies share one program (its graphs, plans and captured tensors).
class Program {
 public:
  /// A program from its two graphs (as compile makes them, or load_program reads them).
  explicit Program(ProgramGraphs graphs, const ExecutableOptions& runtime = {}, CompileReport report = {});

  /// Runs the primal graph at `primals` (one per primal input, in the order compile got them)
  /// and returns the primal outputs and the linear map at that point, as linearize(fn, primals)
  /// would. Its report holds the tangent graph's cost (report.tangent) only; its tangent_graph
  /// is the program's, whose residuals are unbound: this point's are jvp_fn->constants().
  /// Under grad mode, where a primal or a captured tensor requires grad, the primal outputs carry
  /// eager's autograd history from this one run (runtime/program.h).
  Linearized linearize(const std::vector<at::Tensor>& primals) const;
  /// The same from the primal graph's outputs at `primals`, computed elsewhere (Python's
  /// backend="inductor": ProgramExecutable::point_from).
  Linearized linearize_from(const std::vector<at::Tensor>& primals, std::vector<at::Tensor> primal_graph_outputs) const;

  /// Primal inputs (and captured tensors, as constants) -> primal outputs, then residuals.
  const Graph& primal_graph() const { return *exec_->primal_graph(); }
  /// Residuals ("r<k>", unbound constants) and tangents -> output tangents.
  const std::shared_ptr<const Graph>& tangent_graph() const { return exec_->tangent_graph(); }
  /// The compile's report: its passes, and the cost of the tangent graph (report.tangent).
  const CompileReport& report() const { return *report_; }
  /// The cost model's figures for one linearize at a new point: the primal graph's.
  const GraphCost& primal_cost() const { return *primal_cost_; }
  const ProgramExecutable& executable() const { return *exec_; }

  /// Writes the program: `path` (JSON: both graphs) and the captured tensors in the safetensors
  /// file beside it (ir/io/graph_files.h, save_program). A primal graph computes the
  /// derivative factors fold would have evaluated (gelu_backward, ...); those are on the list
  /// graph files may use. Other ops off that list need SaveOptions::trusted, and load back only
  /// as trusted.
  void save(const std::string& path, const SaveOptions& options = {}) const;
  /// Reads a program that save() wrote (load_program), under LoadOptions' rules (allowed ops,
  /// memory). Its report has the tangent graph's cost only.
  static Program load(const std::string& path, const LoadOptions& options = {}, const ExecutableOptions& runtime = {});

 private:
  std::shared_ptr<const ProgramExecutable> exec_;
  std::shared_ptr<const CompileReport> report_;
  std::shared_ptr<const GraphCost> primal_cost_;
};

/// Traces `fn` at `example_primals`, optimizes, and splits (see above).
Program compile(const TensorFn& fn, const std::vector<TraceInput>& example_primals, const ProgramOptions& options = {});
/// Compiles a traced graph (e.g. loaded from JSON), evaluating it once at `example_values`.
Program compile(std::unique_ptr<Graph> graph, const std::vector<at::Tensor>& example_values,
                const ProgramOptions& options = {});

}  // namespace jvpc
