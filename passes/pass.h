// The pass interface and the pipeline that runs passes in order.
//
// A pass rewrites a Graph in place and says whether it changed anything. The pipeline verifies
// the graph after every pass (a broken graph is reported with the name of the pass that broke
// it) and then notifies its observers: the cost table and IR dumps are observers, as in MLIR's
// PassInstrumentation.
#pragma once

#include "compiler/ir/graph.h"

#include <iosfwd>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace jvpc {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  /// Rewrites `g`; returns true if it changed.
  virtual bool run(Graph& g) = 0;
};

class PassObserver {
 public:
  virtual ~PassObserver() = default;
  /// Called once before the first pass, with the pipeline's input graph.
  virtual void start(const Graph&) {}
  virtual void after_pass(const std::string& /*pass*/, const Graph&, bool /*changed*/) {}
};

class Pipeline {
 public:
  Pipeline& add(std::unique_ptr<Pass> p);
  Pipeline& observe(PassObserver* o);
  /// Runs every pass in order. Throws jvpc::Error("pass 'x': ...") when a pass fails or leaves
  /// a graph that does not verify.
  void run(Graph& g);
  std::vector<std::string> pass_names() const;

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
  std::vector<PassObserver*> observers_;
};

/// Dumps the IR after the named passes ("all" for every pass; `input_name` for the pipeline's
/// input graph), as text, or as JSON: one object per line, {"after", "position", "graph"},
/// position counting the passes run (0: the input), since a pass may run twice.
class IrDump : public PassObserver {
 public:
  IrDump(std::set<std::string> passes, std::string format, std::ostream& out, std::string input_name = "input")
      : passes_(std::move(passes)), format_(std::move(format)), out_(out), input_name_(std::move(input_name)) {}
  void start(const Graph& g) override;
  void after_pass(const std::string& pass, const Graph& g, bool changed) override;

 private:
  void dump(const std::string& after, const Graph& g);
  std::set<std::string> passes_;
  std::string format_;
  std::ostream& out_;
  std::string input_name_;
  int position_ = 0;
};

}  // namespace jvpc
