// Small graphs for pass tests.
#pragma once

#include "ir/builder.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/passes.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

namespace jvpc::test {

inline int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op() == op;
  return n;
}

/// Runs a copy of `g` on `in` (the pass under test may change `g` afterwards).
inline std::vector<at::Tensor> run(const Graph& g, const std::vector<at::Tensor>& in) {
  return Executable(g.clone()).run(in);
}

}  // namespace jvpc::test
