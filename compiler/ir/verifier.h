// The IR verifier: checks the invariants listed in graph.h, and that every node agrees with
// its operator's schema and, where ATen can tell, with the shapes the operator produces.
// Throws jvpc::Error whose one-line message names the offending node or value.
#pragma once

#include "compiler/ir/graph.h"

#include <functional>
#include <string>

namespace jvpc {

struct VerifyOptions {
  /// Check op names, argument counts and argument kinds against the dispatcher's schemas.
  bool check_schemas = true;
  /// Re-infer each node's output sizes and dtypes (Meta kernels) and compare.
  bool check_shapes = true;
  /// Where an op has neither a Meta kernel nor a shape rule, take the declared shape as it is.
  /// Off for graphs from files (untrusted()): such a node is an error, and a declared shape
  /// that depends on values (value_dependent_shape) may not exceed the one inferred.
  bool trust_declared_shapes = true;

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
