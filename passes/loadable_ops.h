// Where the list of ops graph files may use comes from (ir/loadable_ops.h holds the
// copy that loaders check): the rule tables, what rules and passes emit, and named extras.
#pragma once

#include <string>
#include <vector>

namespace jvpc {

/// The ops that have a JVP rule, plus those rules and passes emit, plus the extras; sorted. `jvpc rules --loadable` prints it.
std::vector<std::string> derive_loadable_ops();

}  // namespace jvpc
