// jvpc rules: the ops linearize can differentiate (those with a JVP rule).
#include "compiler/cli/cli.h"

#include "passes/jvp_rules/rules.h"

#include <nlohmann/json.hpp>

#include <iostream>

namespace jvpc::cli {

void add_rules(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("rules", "List the ops that have a JVP rule (linearize refuses a graph whose tangents reach any other op)");
  cmd->add_flag("--json", *json, "print a JSON array");
  cmd->callback([json] {
    std::vector<std::string> ops = jvp_rules::registry().ops();
    if (*json) {
      std::cout << nlohmann::json(ops).dump() << "\n";
      return;
    }
    for (const std::string& op : ops) std::cout << op << "\n";
    std::cout << ops.size() << " ops with a JVP rule (passes/jvp_rules/)\n";
  });
}

}  // namespace jvpc::cli
