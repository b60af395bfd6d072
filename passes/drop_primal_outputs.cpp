// Drops a graph's first outputs: linearize returns f(x) from the tracing run, so its tangent
// graph keeps only the tangent outputs jvp appended after the primal ones.
//
//   return (%out, %dout)          =>   return (%dout)
//
// The nodes only those outputs read are dead then; dce drops them.
#include "passes/passes.h"

namespace jvpc {

bool drop_primal_outputs(Graph& g, size_t n) {
  if (n > g.outputs().size())
    throw Error("drop-primal-outputs: the graph has " + std::to_string(g.outputs().size()) + " outputs, not " +
                std::to_string(n) + " primal outputs and their tangents");
  for (size_t i = 0; i < n; ++i) g.erase_output(0);
  return n > 0;
}

}  // namespace jvpc
