// A compiled program whose two graphs run as AOTInductor packages: Inductor's fused kernels,
// compiled ahead of time into a shared library, loaded and run from C++ without Python.
//
//   jvpc compile mlp --aoti -o prog.json   # prog.json, prog.safetensors, prog.primal.pt2, prog.tangent.pt2
//
//   jvpc::AotiProgram prog("prog.json");          // the program and the two packages beside it
//   auto point = prog.linearize({x});             // the primal package: f(x) and the residuals
//   std::vector<at::Tensor> dy = prog.jvp(point, {dx});   // the tangent package at x
//
// The program file is read under load_program's rules, and every call is checked as
// ProgramExecutable checks it (the primals' guards, the tangents' shapes). Each package names
// the program file it was compiled from (its SHA-1), and one compiled from another is refused.
// The packages take the graphs' inputs in graph order, captured tensors as they are at each
// call. A package is a shared library: load only packages you made. It computes without
// autograd: the primal outputs carry no history (Python's backend="inductor" is the route for
// training steps).
#pragma once

#include "runtime/program.h"

#include <memory>
#include <string>

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace jvpc {

class AotiProgram {
 public:
  /// `path`, a program written with its packages (primal_package_path_for, tangent_package_path_for).
  explicit AotiProgram(const std::string& path, const LoadOptions& options = {});
  ~AotiProgram();
  AotiProgram(const AotiProgram&) = delete;
  AotiProgram& operator=(const AotiProgram&) = delete;

  /// f(primals) and the residuals there, from the primal package; point.jvp_fn is the
  /// interpreter's linear map at that point (the same residuals), which jvp() checks tangents with.
  ProgramExecutable::Point linearize(const std::vector<at::Tensor>& primals) const;
  /// The output tangents at `point` (tangents in point.jvp_fn->arguments()' order), from the
  /// tangent package.
  std::vector<at::Tensor> jvp(const ProgramExecutable::Point& point, const std::vector<at::Tensor>& tangents) const;

  const ProgramExecutable& executable() const { return exec_; }

 private:
  ProgramExecutable exec_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> primal_, tangent_;
};

}  // namespace jvpc
