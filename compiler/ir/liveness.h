// Liveness and aliasing of values over one execution of a graph, in node order. Shared by the
// runtime (to release intermediates after their last use), the cost model and the memory
// limit checks of the loader and the runtime (peak memory).
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

/// Peak bytes of intermediates and outputs alive at once during one execution of `g`, in node
/// order: each fresh output is allocated when its node runs (views allocate nothing), and a
/// storage is freed once the last value living in it is dead. Measured after each node's
/// outputs exist, with its operands still alive. Graph inputs and constants are not counted
/// (see memory_needed in limits.h). Throws jvpc::Error when the bytes pass 2^63. With
/// `workspace`, each node's kernel workspace (workspace_bytes in op_contracts.h) counts on top of
/// what is alive while it runs.
int64_t peak_intermediate_bytes(const Graph& g, const Liveness& live, bool workspace = false);
int64_t peak_intermediate_bytes(const Graph& g);

}  // namespace jvpc
