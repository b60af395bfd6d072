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
  /// How errors name a value: "%12" (its id) by default. The loader names values by the ids
  /// of the file they came from.
  std::function<std::string(const Value*)> value_name = {};
};

void verify(const Graph& g, const VerifyOptions& options = {});

/// "aten::bmm -> %12": how errors name a node.
std::string describe(const Node* n);

}  // namespace jvpc
