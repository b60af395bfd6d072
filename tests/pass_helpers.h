// Small graphs for pass tests.
#pragma once

#include "compiler/ir/builder.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verifier.h"
#include "passes/passes.h"
#include "tests/helpers.h"

namespace jvpc::test {

inline int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op() == op;
  return n;
}

}  // namespace jvpc::test
