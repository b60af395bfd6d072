// jvpc rules: the ops linearize can differentiate (those with a JVP rule).
#include "compiler/cli/cli.h"

#include "passes/jvp_rules/rules.h"
#include "passes/loadable_ops.h"

#include <nlohmann/json.hpp>

#include <iostream>

namespace jvpc::cli {

void add_rules(CLI::App& app) {
  struct Opts {
    bool json = false, loadable = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "rules", "List the ops that have a JVP rule (linearize refuses a graph whose tangents reach any other op)");
  cmd->add_flag("--json", o->json, "print a JSON array");
  cmd->add_flag("--loadable", o->loadable,
                "list instead the ops a graph file may use: those with a JVP rule, those rules and passes emit, and "
                "named extras, less those refused for loaded graphs (passes/loadable_ops.cpp)");
  cmd->callback([o] {
    std::vector<std::string> ops = o->loadable ? derive_loadable_ops() : jvp_rules::registry().ops();
    if (o->json) {
      std::cout << nlohmann::json(ops).dump() << "\n";
      return;
    }
    for (const std::string& op : ops) std::cout << op << "\n";
    std::cout << ops.size()
              << (o->loadable ? " ops graph files may use\n" : " ops with a JVP rule (passes/jvp_rules/)\n");
  });
}

}  // namespace jvpc::cli
