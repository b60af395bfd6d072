// Liveness and aliasing of values over one execution of a graph, in node order. Shared by the
// runtime (to release intermediates after their last use), the cost model and the memory
// limit checks of the loader and the runtime (peak memory).
#pragma once

#include "ir/graph.h"

#include <vector>

namespace jvpc {

/// Per value of the graph it was computed for, in tables indexed by Value::id().
class Liveness {
 public:
  /// Whether `v` is a value (input or node output) of that graph.
  bool covers(const Value* v) const {
    return v->id() >= 0 && static_cast<size_t>(v->id()) < root_.size() && root_[v->id()] != nullptr;
  }
  /// Node position (index in g.nodes()) of v's last read; -1 if never read by a node. Graph
  /// outputs count as read at position num_nodes. Throws for a value the graph does not hold.
  int last_use(const Value* v) const { return last_use_[index(v)]; }
  /// The value whose storage `v` lives in: itself for a fresh allocation or a graph input, the
  /// storage owner of the aliased operand for view ops. Throws as last_use does.
  const Value* storage_root(const Value* v) const { return root_[index(v)]; }

 private:
  friend Liveness analyze_liveness(const Graph& g);
  size_t index(const Value* v) const;
  std::vector<int> last_use_;
  std::vector<const Value*> root_;  // nullptr: not a value of the graph
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
