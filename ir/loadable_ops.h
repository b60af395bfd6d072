// What a graph read from a file may do: the closed list of ops it may use, and the checks that
// keep those ops to computing.
//
// A graph file is data from a stranger. An ATen op can read or map files (from_file), print,
// read tensor values into host numbers, size its result from tensor contents, or write an
// argument its schema does not mark (batch norm's running statistics). So a loaded graph may
// use only the ops on jvpc's list (loadable_ops.inc): the ops that have a JVP rule, those that
// rules and passes emit, and a few named extras, less the ones refused for the reasons above.
// The list is derived from the rule tables by passes/loadable_ops.cpp, which `jvpc rules
// --loadable` prints and scripts/update-loadable-ops.sh writes here; a test fails when the
// copy is stale. LoadOptions::trusted and SaveOptions::trusted widen it for files you made.
#pragma once

#include "ir/graph.h"

#include <string>
#include <vector>

namespace jvpc {

/// Whether a graph file may use `op` ("aten::bmm") without the trusted option.
bool is_loadable_op(const std::string& op);
/// The list, sorted.
const std::vector<std::string>& loadable_ops();

/// "OP is not on the list of ops graph files may use (...)": how the loader and save say it.
/// An op on the list needs a safety contract too (op_contracts.h); one without is not loadable
/// ("OP has no safety contract ...").
std::string not_loadable(const std::string& op);
/// Throws jvpc::Error naming the first node whose op is off the list (`what` says who refuses:
/// "cannot save", a JSON path).
void check_loadable_ops(const Graph& g, const std::string& what);

/// What `n` writes without its schema saying so (batch norm in training mode with running
/// statistics), or "" if nothing. Such a node would write a constant or an input it does not own.
std::string hidden_write(const Node& n);

/// Throws jvpc::Error where a node reads the contents of an uninitialized allocation (aten::empty
/// and its kin, or a view of one) or the graph returns one: its bytes are whatever the heap held.
void check_initialized(const Graph& g);

/// Throws jvpc::Error where an index operand that is a stored constant (or a view of one) holds
/// an index out of the range its op's contract states (op_contracts.h: gather, scatter,
/// index_select, embedding, ...): at load time, on the CPU, before the graph moves to its
/// device. The runtime checks every index operand again before each kernel runs.
void check_index_constants(const Graph& g);

}  // namespace jvpc
