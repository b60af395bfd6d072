// The pass interface and the pipeline that runs passes in order.
//
// A pass rewrites a Graph in place and says whether it changed anything. The pipeline verifies
// its input graph before the first pass and, if any pass changed it, its output after the last.
// With verify_each (which the test suite turns on) it verifies after every pass, as XLA's and
// MLIR's do, so that a broken graph is reported with the name of the pass that broke it; without,
// a broken output is reported with the last pass's name and the way to find the one that broke it.
// Without verify_each, shapes are inferred again only for the nodes the passes added or changed
// (ShapeChecks); every other invariant is checked on the whole graph;
// a pass that throws is told apart from one that left a graph that does not verify. Observers
// see each pass before and after it runs, and the graph a failed pass left: the cost table, IR
// dumps and timing are observers, as in MLIR's PassInstrumentation.
#pragma once

#include "ir/graph.h"

#include <functional>
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
  /// Called once before the first pass, with the pipeline's input graph (verified).
  virtual void start(const Graph&) {}
  virtual void before_pass(const std::string& /*pass*/, const Graph&) {}
  virtual void after_pass(const std::string& /*pass*/, const Graph&, bool /*changed*/) {}
  /// The pass threw, or left a graph that does not verify: `g` is the graph as it left it, and
  /// `error` the one-line message the pipeline throws next.
  virtual void on_failure(const std::string& /*pass*/, const Graph&, const std::string& /*error*/) {}
};

/// Whether pipelines verify the graph after every pass, not only their input and output: the
/// JVPC_VERIFY_EACH environment variable (1), which the test suite sets, or --verify-each.
bool verify_each_by_default();

/// The time one pass took, and the verification after it, in milliseconds: with verify_each, of
/// the graph it left; without, only the last pass's, which is the check of the pipeline's output.
struct PassTime {
  std::string pass;
  double run_ms = 0;
  double verify_ms = 0;
};

class Pipeline {
 public:
  Pipeline& add(std::unique_ptr<Pass> p);
  Pipeline& observe(PassObserver* o);
  /// Verify after every pass, not only the pipeline's output.
  Pipeline& verify_each(bool on) {
    verify_each_ = on;
    return *this;
  }
  /// The caller verified the input graph just now (trace() and evaluate_graph() do), and its
  /// declared shapes are the kernels' own: it is not verified again before the first pass,
  /// except with verify_each.
  Pipeline& input_verified(bool on) {
    input_verified_ = on;
    return *this;
  }
  /// Runs every pass in order; returns whether any changed the graph. Throws jvpc::Error: "pass
  /// 'x': ..." when a pass fails, "after pass 'x', the graph does not verify: ..." when it left a
  /// broken graph (verify_each), "after the passes (the last: 'x'), the graph does not verify: ..."
  /// when the output is broken (without), "the pipeline's input does not verify: ..." before the first.
  bool run(Graph& g);
  std::vector<std::string> pass_names() const;
  /// Per pass of the last run(), in order.
  const std::vector<PassTime>& timings() const { return timings_; }

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
  std::vector<PassObserver*> observers_;
  bool verify_each_ = verify_each_by_default();
  bool input_verified_ = false;
  std::vector<PassTime> timings_;
};

/// A Pass that calls a function.
std::unique_ptr<Pass> make_pass(std::string name, std::function<bool(Graph&)> fn);

/// Prints timings as a table (--timing): per pass, its time and its verification's.
void print_timings(const std::vector<PassTime>& timings, std::ostream& os);

/// Dumps the IR after the named passes ("all" for every pass; `input_name` for the pipeline's
/// input graph), as text, or as JSON: one object per line, {"after", "position", "graph"},
/// position counting the passes run (0: the input), since a pass may run twice.
class IrDump : public PassObserver {
 public:
  IrDump(std::set<std::string> passes, std::string format, std::ostream& out, std::string input_name = "input")
      : passes_(std::move(passes)), format_(std::move(format)), out_(out), input_name_(std::move(input_name)) {}
  void start(const Graph& g) override;
  void after_pass(const std::string& pass, const Graph& g, bool changed) override;
  /// A pass it dumps after that failed: the graph it left, headed "IR after failed pass 'x'".
  void on_failure(const std::string& pass, const Graph& g, const std::string& error) override;

 private:
  void dump(const std::string& after, const Graph& g, bool failed = false);
  std::set<std::string> passes_;
  std::string format_;
  std::ostream& out_;
  std::string input_name_;
  int position_ = 0;
};

}  // namespace jvpc
