// jvpc opt: runs named passes of linearize's pipeline on graphs in the text form and prints the
// text form, as LLVM's and MLIR's opt do; the .ir tests in tests/ir/ are written against it.
//
//   jvpc opt --passes=cse,dce in.ir
//
// Before each graph it prints one comment line per pass, `// PASS: changed` or `// PASS: no
// change`, so that a test can check a pass's changed flag as well as its result. The output is
// itself valid input. With --check-values it also runs the graph before and after the passes on
// the same random inputs and fails unless they compute the same values (to float rounding).
// With --split-input-file, `// -----` lines divide the input into graphs,
// each run on its own, and divide the output the same way.
#include "compiler/cli/cli.h"

#include "compiler/api/reference.h"
#include "ir/io/files.h"
#include "ir/io/limits.h"
#include "ir/printer.h"
#include "ir/text.h"
#include "compiler/cli/flags.h"
#include "passes/linearize_pipeline.h"
#include "runtime/executable.h"

#include <cstdio>
#include <iostream>
#include <sstream>

namespace jvpc::cli {

namespace {

constexpr const char* kSplit = "// -----";
constexpr int64_t kMaxTextBytes = int64_t(64) << 20;

// Standard input, refused past `limit` bytes.
std::string read_stdin(int64_t limit) {
  std::string text;
  char buf[1 << 16];
  while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
    text.append(buf, static_cast<size_t>(std::cin.gcount()));
    if (static_cast<int64_t>(text.size()) > limit)
      throw Error("standard input: more than " + std::to_string(limit) + " bytes of IR text");
  }
  return text;
}

std::vector<std::string> split_input(const std::string& text, bool split) {
  if (!split) return {text};
  std::vector<std::string> parts(1);
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    if (line.rfind(kSplit, 0) == 0)
      parts.emplace_back();
    else
      parts.back() += line + "\n";
  }
  return parts;
}

std::vector<std::string> input_names(const Graph& g) {
  std::vector<std::string> names;
  for (const Input& in : g.inputs())
    if (in.role != Role::Constant) names.push_back(in.name);
  return names;
}

// --check-values: `before` and `after` on the same random inputs; throws unless they agree.
std::string same_values(const Graph& before, const Graph& after, uint64_t seed, const std::string& where) {
  if (input_names(before) != input_names(after))
    throw Error(where + "--check-values: the passes changed the graph's inputs, so its values cannot be compared");
  std::vector<at::Tensor> x = random_inputs(before, seed);
  std::vector<at::Tensor> want = Executable(before.clone(), ExecutableOptions::plain()).run(x);
  std::vector<at::Tensor> got = Executable(after.clone(), ExecutableOptions::plain()).run(x);
  if (got.size() != want.size()) throw Error(where + "--check-values: the passes changed the number of outputs");
  std::vector<at::Tensor> got_f, want_f;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].is_floating_point() || got[i].is_complex()) {
      got_f.push_back(got[i]);
      want_f.push_back(want[i]);
    } else if (!got[i].equal(want[i])) {
      throw Error(where + "--check-values: output " + std::to_string(i) +
                  " differs from the graph's before the passes");
    }
  }
  ErrorStats err = compare(got_f, want_f);
  double tolerance = tolerance_for(got_f);
  char line[160];
  std::snprintf(line, sizeof line, "rel_error %.1e, tolerance %.0e", err.rel_error, tolerance);
  if (!(err.rel_error <= tolerance) || err.nonfinite_got != err.nonfinite_reference)
    throw Error(where + "--check-values: the values differ from the graph's before the passes: " + line);
  return std::string("as before (") + line + ")";
}

}  // namespace

void add_opt(CLI::App& app) {
  struct Opts {
    std::string file, passes, wrt, residual_budget;
    uint64_t seed = 0;
    bool split = false, verify_each = false, check_values = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "opt",
      "Run passes of linearize's pipeline (jvpc linearize --list-passes) on a graph in the text form and print the "
      "text form, each pass's changed flag first as a comment");
  cmd->add_option("file", o->file, "the graph as text (jvpc show --format text writes it), or - for stdin")->required();
  cmd->add_option("--passes", o->passes,
                  "comma-separated passes to run in order: names from jvpc linearize --list-passes (a name that "
                  "appears twice there means its first row), or row numbers (15: the second dce)")
      ->required();
  cmd->add_flag("--split-input-file", o->split, "the input holds several graphs divided by `// -----` lines");
  cmd->add_option("--wrt", o->wrt, "jvp: comma-separated primal inputs to differentiate (default: the differentiable)");
  cmd->add_option("--residual-budget", o->residual_budget,
                  "attention-form: bytes the attentions' tangents may take (as jvpc linearize's; 0: O(L), inf: P)")
      ->type_name("SIZE");
  add_seed_option(cmd, o->seed, "fold: seed of the random primal values it evaluates the graph at");
  cmd->add_flag("--check-values", o->check_values,
                "run the graph before and after the passes on the same random inputs; fail unless the values agree "
                "(within the dtype's tolerance, as jvpc linearize's check)");
  cmd->add_flag(
      "--verify-each", o->verify_each,
      "verify the whole graph after every pass, naming the pass that breaks it (by default the pipeline's input and output)");
  cmd->callback([o, cmd] {
    std::vector<std::string> names = comma_list(o->passes, "--passes", /*distinct=*/false);
    for (const std::string& n : names) linearize_pass(n);  // a bad name fails before any work
    std::string text;
    if (o->file == "-")
      text = read_stdin(kMaxTextBytes);
    else
      text = read_regular_file(o->file, "IR text file", kMaxTextBytes);
    std::vector<std::string> graphs = split_input(text, o->split);
    for (size_t i = 0; i < graphs.size(); ++i) {
      std::string where = graphs.size() > 1 ? "graph " + std::to_string(i + 1) + ": " : "";
      std::unique_ptr<Graph> g;
      try {
        g = parse_text(graphs[i]);
      } catch (const Error& e) {
        throw Error(where + e.what());
      }
      std::vector<std::string> wrt;
      if (!o->wrt.empty()) wrt = comma_list(o->wrt, "--wrt", /*distinct=*/true);
      std::optional<int64_t> budget;
      if (cmd->count("--residual-budget")) budget = parse_size(o->residual_budget, "--residual-budget");
      const LinearizeConfig config = LinearizeConfig::of(wrt, g->outputs().size(), budget, /*split=*/false);
      // fold evaluates what the tangent reads at random primals (the text holds no values).
      auto state = std::make_shared<LinearizeState>();
      std::vector<at::Tensor> primal_values = random_inputs(*g, o->seed);
      size_t k = 0;
      for (const Input& in : g->inputs())
        if (in.role != Role::Constant) {
          if (in.role == Role::Primal) state->known[in.value->id()] = primal_values.at(k);
          ++k;
        }
      Pipeline p;
      p.verify_each(o->verify_each || verify_each_by_default());
      std::vector<std::string> ran;
      std::vector<bool> changed;
      for (const std::string& n : names) {
        const LinearizePass& lp = linearize_pass(n);
        ran.push_back(lp.name);
        p.add(make_pass(lp.name, [&config, state, &lp, &changed](Graph& gr) {
          bool c = lp.run(gr, config, *state);
          changed.push_back(c);
          return c;
        }));
      }
      std::unique_ptr<Graph> before = o->check_values ? g->clone() : nullptr;
      try {
        p.run(*g);
      } catch (const Error& e) {
        throw Error(where + e.what());
      }
      std::string same;
      if (before) same = same_values(*before, *g, o->seed + 1, where);
      if (i > 0) std::cout << kSplit << "\n";
      for (size_t j = 0; j < ran.size(); ++j)
        std::cout << "// " << ran[j] << ": " << (changed.at(j) ? "changed" : "no change") << "\n";
      if (!same.empty()) std::cout << "// values: " << same << "\n";
      std::cout << to_text(*g) << "\n";
    }
  });
}

}  // namespace jvpc::cli
