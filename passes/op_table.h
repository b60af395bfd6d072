// OpTable: rules keyed by op name, one rule per op. The JVP rules (passes/jvp_rules) and the
// batching rules (passes/batch_rules) each keep one, filled once by their family files.
#pragma once

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

namespace jvpc {

template <class Rule>
class OpTable {
 public:
  void add(const std::string& op, Rule r) { rules_[op] = std::move(r); }
  /// The rule for `op`, or null.
  const Rule* find(const std::string& op) const {
    auto it = rules_.find(op);
    return it == rules_.end() ? nullptr : &it->second;
  }
  /// The ops with a rule, sorted.
  std::vector<std::string> ops() const {
    std::vector<std::string> out;
    for (const auto& entry : rules_) out.push_back(entry.first);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::unordered_map<std::string, Rule> rules_;
};

}  // namespace jvpc
