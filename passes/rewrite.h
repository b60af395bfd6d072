// Helpers every rewrite uses (passes/rewrite.cpp): the driver of local rewrites, and what a
// rewrite calls to replace a node and erase what it left dead.
#pragma once

#include "ir/graph.h"

#include <c10/util/flat_hash_map.h>

#include <functional>
#include <unordered_set>
#include <vector>

namespace jvpc {

class Builder;

/// A local rewrite: looks at `n` and may replace it, building at `b` (whose insertion point is
/// just before `n`); returns true where it changed the graph.
using NodeRewrite = std::function<bool(Node* n, Builder& b)>;

/// The loop of every local rewrite pass: calls `rule` on each node in graph order, as the
/// graph's nodes were when it started, with the builder's insertion point just before the node
/// (what it builds lands before the node it replaces). Returns whether any call rewrote.
/// A rule may replace or erase `n` and erase nodes before it (erase_if_dead does), never a
/// node after it; the nodes it builds are not visited. A rule that needs state across nodes
/// (values recomputed after a change, nodes seen so far) keeps it in its captures.
bool rewrite_nodes(Graph& g, const NodeRewrite& rule);

/// Erases `n` if it is pure and nothing reads its outputs, then does the same for the nodes
/// that produced its operands. Rewrites call it on what they replace, so that every row of the
/// cost table describes a graph without leftovers.
void erase_if_dead(Graph& g, Node* n);
/// The same for several nodes in one walk, the last first (the nodes a failed rewrite built, in
/// the order it built them): a node erased once is never read again, so `nodes` may hold nodes
/// that erasing another one erases.
void erase_if_dead(Graph& g, const std::vector<Node*>& nodes);

/// Makes the readers of `n`'s single output read `v` instead, then erases what became dead.
void replace_output(Graph& g, Node* n, Value* v);

/// replace_output where `v` has exactly `n`'s result, layout included (its readers were built
/// for that); otherwise erases `v`'s producer, and what only it read, and returns false.
bool replace_output_if_same_layout(Graph& g, Node* n, Value* v);
/// Whether `v` has `n`'s result's shape, dtype, device and strides.
bool same_layout(const Value* v, const Value* n);

/// A set of values (open addressing: no allocation per value).
using ValueSet = ska::flat_hash_set<const Value*>;

/// Values that depend on a tangent input: the rest is primal-only, which fold computes once (a
/// random node's draw included: the linear map is for that one draw, as torch.func's is).
ValueSet tangent_dependent(const Graph& g);

}  // namespace jvpc
