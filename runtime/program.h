// The runtime half of a compiled program (compiler/api/program.h): its primal graph and tangent
// graph, run at new points. Depends on the IR and the Executable alone, so an application can load
// a program (ir/io/graph_files.h, load_program) and linearize it without the tracer or passes:
//
//   jvpc::ProgramExecutable prog(jvpc::load_program("prog.json"));   // + prog.safetensors
//   auto point = prog.linearize({x});          // runs the primal graph: f(x) and the residuals
//   at::Tensor y = point.primal_outputs[0];
//   std::vector<at::Tensor> dy = point.jvp_fn->run({dx});   // the tangent graph at x
//
// The primal graph goes from the primal inputs (and captured tensors, as constants) to the primal
// outputs and then one output per residual, named as the tangent graph's constant it binds. The
// tangent graph goes from those residuals (unbound constants) and the tangents to the output
// tangents. linearize() checks the primals (guards: their number, shapes, dtypes, devices and,
// with exact_strides, strides; each a one-line jvpc::Error naming the input and both values), runs
// the primal graph, and binds the residuals to a copy of the tangent graph's Executable that
// shares its plan (Executable::with_constants): nothing is verified or planned at a new point.
//
// Captured tensors are read as they are at each linearize: one written in place since (an
// optimizer step) is bound again, which the Executable otherwise refuses. Every point owns its
// residuals: a residual that is a captured tensor, or a view of one, is a copy (the Executable
// copies results that alias its constants); one that aliases a caller's primal input is the
// caller's, and the tangent Executable refuses to run once it was written in place. Residuals
// carry no autograd history.
//
// Threads: linearize() calls on one ProgramExecutable are serialised (the primal graph's
// Executable may be rebound between them); what they return is independent of each other.
#pragma once

#include "ir/io/graph_files.h"  // ProgramGraphs, load_program
#include "runtime/executable.h"

#include <memory>
#include <mutex>

namespace jvpc {

class ProgramExecutable {
 public:
  /// Checks that the primal graph returns `primal_outputs` values and then one residual per
  /// constant of the tangent graph, named as that constant and with its sizes and dtype; the
  /// tangent graph's constants are unbound (each point binds its own).
  explicit ProgramExecutable(ProgramGraphs graphs, ExecutableOptions options = {});
  ProgramExecutable(const ProgramExecutable&) = delete;
  ProgramExecutable& operator=(const ProgramExecutable&) = delete;

  /// One point's linearization: f(x) and the linear map there (tangents in the tangent graph's
  /// argument order).
  struct Point {
    std::vector<at::Tensor> primal_outputs;
    std::shared_ptr<Executable> jvp_fn;
  };
  /// Runs the primal graph at `primals`, one per primal input in graph order. Under grad mode,
  /// where a primal or a captured tensor requires grad, autograd records that run as it records
  /// eager code: the primal outputs carry eager's history (one forward gives the loss's graph and
  /// the residuals), and the residuals are detached. The state the function writes (BatchNorm's
  /// running statistics) is written into the primals named by state_inputs(), as eager code
  /// writes it.
  Point linearize(const std::vector<at::Tensor>& primals) const;
  /// The point at `primals` from the primal graph's outputs there (`outs`: its primal outputs,
  /// state and residuals, as another backend that ran the primal graph computed them): what
  /// linearize() does after its run (the state written, the residuals laid out, detached and
  /// bound, the outputs that share a residual's storage copied). The primals are not checked.
  Point point_from(const std::vector<at::Tensor>& primals, std::vector<at::Tensor> outs) const;

  /// The primal graph's inputs at `primals`, in graph order: the primals checked as linearize()
  /// checks them (and laid out as it lays them out), and the captured tensors as they are now;
  /// for another backend that runs the primal graph (runtime/aoti_program.h).
  std::vector<at::Tensor> primal_graph_inputs(const std::vector<at::Tensor>& primals) const;

  const std::shared_ptr<const Graph>& primal_graph() const { return primal_; }
  const std::shared_ptr<const Graph>& tangent_graph() const { return tangent_; }
  /// The primal inputs linearize() takes, in order.
  const std::vector<const Input*>& primal_inputs() const { return primal_fn_->arguments(); }
  size_t num_primal_outputs() const { return num_outputs_; }
  bool exact_strides() const { return exact_strides_; }
  /// The primal inputs each call writes the function's state into (ProgramGraphs::state_inputs).
  const std::vector<std::string>& state_inputs() const { return state_inputs_; }

 private:
  std::shared_ptr<const Graph> primal_, tangent_;
  size_t num_outputs_ = 0;
  bool exact_strides_ = true;
  std::vector<std::string> state_inputs_;
  std::vector<size_t> state_argument_;      // per state input: its index among the primals
  std::unique_ptr<Executable> primal_fn_;   // the captured tensors bound as its constants
  std::unique_ptr<Executable> tangent_fn_;  // no residuals bound: each point gets a copy with its own
  std::vector<size_t> residual_output_;     // per tangent-graph constant: its primal-graph output
  struct Captured {
    std::string name;
    at::Tensor tensor;
    std::optional<int64_t> version;  // when bound into primal_fn_
  };
  mutable std::vector<Captured> captured_;
  bool needs_grad(const std::vector<at::Tensor>& primals) const;
  std::vector<at::Tensor> checked(const std::vector<at::Tensor>& primals) const;  // the guards
  mutable std::mutex mu_;  // rebinding a captured tensor's new version, and the run after it
};

}  // namespace jvpc
