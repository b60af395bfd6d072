// Liveness and aliasing of values over one execution of a graph, in node order. Shared by the
// runtime (to release intermediates after their last use) and the cost model (peak memory).
#pragma once

#include "compiler/ir/graph.h"

#include <unordered_map>

namespace jvpc {

struct Liveness {
  /// Node position (index in g.nodes()) of each value's last read; -1 if never read by a node.
  /// Graph outputs count as read at position num_nodes.
  std::unordered_map<const Value*, int> last_use;
  /// The value whose storage each value lives in: itself for a fresh allocation or a graph
  /// input, the storage owner of the aliased operand for view ops.
  std::unordered_map<const Value*, const Value*> storage_root;
};

Liveness analyze_liveness(const Graph& g);

}  // namespace jvpc
