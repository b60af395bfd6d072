// The IR verifier: checks the invariants listed in graph.h, and that every node agrees with
// its operator's schema and, where ATen can tell, with the shapes the operator produces.
// Throws jvpc::Error whose one-line message names the offending node or value.
#pragma once

#include "ir/graph.h"

#include <c10/util/flat_hash_map.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace jvpc {

/// The nodes whose declared outputs passed the shape check, each with its stamp then
/// (Node::stamp, which changes with its op's arguments, its operands, and its operands' and
/// outputs' metadata). Shape inference is a function of the first three, so a verify given this
/// record infers again only the nodes a pass added or changed, and of those not the ones whose
/// shapes the Builder inferred and that are unchanged since (Node::shapes_inferred).
class ShapeChecks {
 public:
  /// Whether `n` reads as it did when it last passed, or has the shapes the Builder inferred for
  /// it as it is (Node::shapes_inferred).
  bool unchanged(const Node& n) const;
  void passed(const Node& n);
  /// Takes every node of `g` as checked: for a graph whose shapes the kernels themselves gave
  /// (a tracing run's).
  void trust(const Graph& g);
  void clear() { seen_.clear(); }
  /// From now on passed() records nothing: for a last verification, which none consults after.
  void stop_recording() { recording_ = false; }

 private:
  ska::flat_hash_map<const Node*, uint64_t> seen_;  // node -> its stamp when it passed
  bool recording_ = true;
};

struct VerifyOptions {
  /// Check op names, argument counts and argument kinds against the dispatcher's schemas.
  bool check_schemas = true;
  /// Re-infer each node's output sizes and dtypes (Meta kernels) and compare.
  bool check_shapes = true;
  /// Where an op has neither a Meta kernel nor a shape rule, take the declared shape as it is.
  /// Off for graphs from files (untrusted()): such a node is an error, and a declared shape
  /// that depends on values (value_dependent_shape) may not exceed the one inferred.
  bool trust_declared_shapes = true;
  /// With check_shapes: nodes recorded here as unchanged are not inferred again, and the nodes
  /// that pass are recorded (the pipeline's verification between passes). Null: every node.
  ShapeChecks* shape_checks = nullptr;

  /// What the loader checks of a graph file.
  static VerifyOptions untrusted() {
    VerifyOptions o;
    o.trust_declared_shapes = false;
    return o;
  }
};

void verify(const Graph& g, const VerifyOptions& options = {});

/// "aten::bmm -> %12": how errors name a node.
std::string describe(const Node* n);

}  // namespace jvpc
