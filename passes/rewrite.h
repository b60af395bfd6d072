// Helpers every rewrite uses (passes/rewrite.cpp).
#pragma once

#include "ir/graph.h"

#include <c10/util/flat_hash_map.h>

#include <unordered_set>
#include <vector>

namespace jvpc {

/// Erases `n` if it is pure and nothing reads its outputs, then does the same for the nodes
/// that produced its operands. Rewrites call it on what they replace, so that every row of the
/// cost table describes a graph without leftovers.
void erase_if_dead(Graph& g, Node* n);

/// Makes the readers of `n`'s single output read `v` instead, then erases what became dead.
void replace_output(Graph& g, Node* n, Value* v);

/// replace_output where `v` has exactly `n`'s result, layout included (its readers were built
/// for that); otherwise erases `v`'s producer, and what only it read, and returns false.
bool replace_output_if_same_layout(Graph& g, Node* n, Value* v);

/// A set of values (open addressing: no allocation per value).
using ValueSet = ska::flat_hash_set<const Value*>;

/// Values that depend on a tangent input: the rest is primal-only, which fold computes once (a
/// random node's draw included: the linear map is for that one draw, as torch.func's is).
ValueSet tangent_dependent(const Graph& g);

}  // namespace jvpc
