// Where the list of ops graph files may use comes from (compiler/ir/loadable_ops.h holds the
// copy that loaders check): the rule tables, what rules and passes emit, and named extras.
#pragma once

#include <string>
#include <vector>

namespace jvpc {

/// The ops that have a JVP rule, plus those rules and passes emit, plus the extras, less the ops
/// refused for loaded graphs; sorted. `jvpc rules --loadable` prints it.
std::vector<std::string> derive_loadable_ops();

/// Why a graph file may not use `op` although it has a JVP rule ("" if it may).
std::string refused_for_loading(const std::string& op);

}  // namespace jvpc
