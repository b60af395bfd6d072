// jvpc: trace, inspect, cost, run and linearize graphs. See `jvpc --help`.
#include "compiler/cli/cli.h"
#include "ir/io/files.h"
#include "ir/io/graph_json.h"
#include "ir/ops.h"
#include "examples/examples.h"

#include <ATen/Context.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <iostream>

int main(int argc, char** argv) {
  jvpc::remove_temporary_files_on_signals();  // a Ctrl-C while writing -o leaves no hidden file
  // One ATen kernel on every OpenMP thread before MKL's first threaded GEMM: on some virtual
  // machines, in a few percent of processes, the first ATen kernel after that GEMM computes
  // otherwise on the second thread, and the check's rel_error moves (docs/design.md, Checking).
  at::ones({int64_t{1} << 16}).exp_();
  CLI::App app("jvpc: a graph-tracing compiler for forward-mode differentiation over LibTorch", "jvpc");
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", [] {
    return std::string("jvpc " JVPC_VERSION " (LibTorch " TORCH_VERSION ", graph schema ") +
           std::to_string(jvpc::kSchemaVersion) + ", CUDA " + (at::hasCUDA() ? "available" : "not available") + ")";
  });
  std::string examples = "Examples (trace and linearize take one by name, then its own flags):\n";
  for (const std::string& name : jvpc::examples::names())
    examples += "  " + name + ": " + jvpc::examples::summary(name) + "\n";
  app.footer(examples +
             "\nStart with:  jvpc linearize sdpa   (the seed's attention: bsz 1, 5 heads, seq 128, head dim 64)\n"
             "Each command has --help. Exit codes: 0 ok, 1 a check failed, 2 bad input.");
  jvpc::cli::add_trace(app);
  jvpc::cli::add_show(app);
  jvpc::cli::add_run(app);
  jvpc::cli::add_cost(app);
  jvpc::cli::add_linearize(app);
  jvpc::cli::add_rules(app);
  jvpc::cli::add_compile(app);
  jvpc::cli::add_jvp(app);
  jvpc::cli::add_opt(app);
  const std::string first = argc > 1 ? argv[1] : "";
  if (!first.empty() && first[0] == '-' && first != "-h" && first != "--help" && first != "--version") {
    std::cerr << "jvpc: error: unknown option '" << jvpc::printable_path(argv[1])
              << "' before the command (see jvpc --help)\n";
    return 2;
  }
  if (argc > 1 && argv[1][0] != '-') {  // CLI11 would only say that a subcommand is required
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found) {
      std::cerr << "jvpc: error: unknown command '" << jvpc::printable_path(argv[1]) << "' (commands: " << known
                << "; see jvpc --help)\n";
      return 2;
    }
  }
  // trace, linearize and compile take an example by name, then its flags; an example's flags may also come
  // first (`jvpc trace --device cpu sdpa`), where CLI11 would take the flag's value for the name.
  if (argc > 2 && (first == "trace" || first == "linearize" || first == "compile")) {
    auto names = jvpc::examples::names();
    for (int i = 2; i < argc; ++i) {
      if (std::find(names.begin(), names.end(), argv[i]) == names.end()) continue;
      if (std::any_of(argv + 2, argv + i, [](const char* a) { return a[0] != '-'; }))
        std::rotate(argv + 2, argv + i, argv + i + 1);
      break;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    std::cerr << "jvpc: error: " << jvpc::printable_path(msg.substr(0, msg.find('\n'))) << " (see jvpc --help)\n";
    return 2;
  } catch (const std::exception& e) {
    // Control characters (from a file name, say) are escaped: raw, they would reach the terminal.
    std::cerr << "jvpc: error: " << jvpc::printable_path(jvpc::one_line(e)) << "\n";
    return 2;
  } catch (...) {
    std::cerr << "jvpc: error: unknown failure\n";
    return 2;
  }
  return jvpc::cli::exit_code;
}
