// jvpc linearize: trace and compile an example or a traced graph, run the linear function on
// random tangents and check it (linearize_check.h), print the compile report; --list-passes
// prints the pipeline (passes/linearize_pipeline.h).
#include "compiler/cli/cli.h"
#include "compiler/cli/linearize_check.h"
#include "compiler/cli/target.h"

#include "compiler/api/linearize.h"
#include "compiler/api/report.h"
#include "ir/io/limits.h"
#include "compiler/api/reference.h"
#include "ir/cost/kernel_watch.h"
#include "ir/io/files.h"
#include "ir/ops.h"
#include "ir/io/graph_files.h"
#include "ir/io/json_text.h"
#include "ir/io/safetensors.h"
#include "examples/examples.h"
#include "compiler/cli/flags.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

namespace jvpc::cli {

namespace {

struct Opts {
  std::string target, report, out, dump_format = "text", device, wrt, inputs, residual_budget;
  std::string check_reference = "auto";
  std::vector<std::string> dump_after, disabled;
  uint64_t seed = 0;
  int64_t tangents = 0;  // --tangents K: also run K tangents in one batched call
  std::optional<double> tolerance;
  LimitFlags limits;
  bool trusted = false, verify_each = false, timing = false, list_passes = false;
  TargetFlags target_flags() const { return {target, device, inputs, seed, trusted, limits}; }
};

// --disable-pass takes the optional passes; --dump-after "trace" (the traced graph), the names of
// the passes that run, or "all".
void check_pass_names(const std::vector<std::string>& names, const std::set<std::string>& disabled) {
  Pipeline p;
  add_linearize_passes(p, {}, nullptr, disabled);  // throws for a pass that cannot be disabled
  std::vector<std::string> known = {"trace"};      // in pipeline order, each once (dce runs twice)
  for (const std::string& k : p.pass_names())
    if (std::find(known.begin(), known.end(), k) == known.end()) known.push_back(k);
  std::string list;
  for (const std::string& k : known) list += k + ", ";
  for (const std::string& n : names)
    if (n != "all" && std::find(known.begin(), known.end(), n) == known.end())
      throw Error("--dump-after: no pass is named '" + n + "' (passes: " + list + "all)");
}

template <typename... A>
std::string format(const char* f, A... a) {
  char line[512];
  std::snprintf(line, sizeof line, f, a...);
  return line;
}

void print_summary(const Target& p, const References& refs, const Linearized& lin, const Check& c) {
  const bool is_graph = p.is_graph;
  const CompileReport& r = lin.report;
  std::cout << "jvpc linearize " << p.description << "\n\n";
  print_cost_rows(r.passes, std::cout);
  std::string ops;
  for (const auto& [op, n] : r.tangent.ops)
    if (is_matmul(op)) ops += (ops.empty() ? "" : ", ") + op + " ×" + std::to_string(n);
  if (ops.empty()) ops = "no matmuls";
  std::string aliased;
  for (const Input& in : lin.tangent_graph->inputs())
    if (!in.aliases.empty() && aliased.find(in.aliases) == std::string::npos)
      aliased += (aliased.empty() ? "" : ", ") + in.aliases;
  auto flops = [](int64_t f) { return format("%14lld  (%s", static_cast<long long>(f), human_count(f).c_str()); };
  std::cout << "\nforward    matmul FLOPs " << flops(r.forward.matmul_flops) << "; cost model of the traced graph)\n"
            << "linearize  matmul FLOPs " << flops(r.linearize_matmul_flops)
            << "; measured: kernels run while tracing and folding)\n"
            << "jvp call   matmul FLOPs " << flops(r.tangent.matmul_flops) << "; " << r.tangent.nodes
            << " nodes: " << ops << ")\n";
  std::cout << "residuals  " << human_bytes(r.tangent.residual_bytes) << " held by the tangent graph";
  if (r.tangent.aliased_input_bytes)
    std::cout << ", plus " << human_bytes(r.tangent.aliased_input_bytes) << " aliasing the inputs (" << aliased << ")";
  std::cout << "; peak " << human_bytes(r.tangent.peak_bytes) << " per call";
  if (r.tangent.workspace_bytes) std::cout << " (+ " << human_bytes(r.tangent.workspace_bytes) << " inside a kernel)";
  std::cout << "\n";
  for (const AttentionChoice& a : r.attention) {
    const AttentionChoice::Form& f = a.o_l_form ? a.o_l : a.p;
    std::cout << "attention  " << (a.o_l_form ? "O(L) form" : "P form   ") << ": residuals "
              << human_bytes(f.residual_bytes) << ", peak " << human_bytes(f.peak_bytes) << ", matmul FLOPs "
              << human_count(f.matmul_flops) << " per call (" << a.reason << ")\n";
  }
  std::string reference =
      is_graph ? "LibTorch forward AD of the graph (attention on the math path" : "LibTorch forward AD (math backend";
  reference += refs.in_float32 ? ", in float32)" : ")";
  if (c.central_differences)
    reference = std::string("central differences in float64 through ") +
                (is_graph ? "the graph's own kernels" : "the example's own kernels");
  std::cout << "reference  " << (c.central_differences ? "central differences in float64" : "LibTorch forward AD")
            << ": " << c.why << "\n";
  std::cout << format("check      vs %s: rel_error %.3e, max_abs_error %.3e, tolerance %.1e: %s\n", reference.c_str(),
                      c.err.rel_error, c.err.max_abs_error, c.tolerance, c.passed ? "PASS" : "FAIL");
  if (c.err.nonfinite_got || c.err.nonfinite_reference)
    std::cout << "           non-finite values: " << c.err.nonfinite_got << " in jvpc's tangents, "
              << c.err.nonfinite_reference << " in the reference's (does the primal overflow its dtype?)\n";
}

void print_batched(const BatchedCheck& b) {
  std::string unrolled;
  for (const std::string& op : b.unrolled) unrolled += (unrolled.empty() ? "" : ", ") + op;
  double ratio = b.single_flops ? static_cast<double>(b.matmul_flops) / static_cast<double>(b.single_flops) : 0.0;
  std::cout << format(
                   "tangents   K=%lld in one batched call: matmul FLOPs %lld (%s; measured, cost model %s, %.2fx one "
                   "call), %.3f ms (one call %.3f ms)\n",
                   static_cast<long long>(b.K), static_cast<long long>(b.matmul_flops),
                   human_count(b.matmul_flops).c_str(), human_count(b.model_flops).c_str(), ratio, b.ms, b.single_ms)
            << "           unrolled (no batching rule): " << (unrolled.empty() ? "none" : unrolled) << "\n"
            << format(
                   "           vs %lld single calls: rel_error %.3e, tolerance %.1e; FLOPs %s the cost model's: %s\n",
                   static_cast<long long>(b.K), b.rel_error, b.tolerance,
                   b.matmul_flops == b.model_flops ? "equal" : "DIFFER from", b.passed ? "PASS" : "FAIL");
}

void write_report(const std::string& path, const Target& p, const References& refs, const Linearized& lin,
                  const Check& c, const std::optional<BatchedCheck>& batched) {
  nlohmann::json rep = report_json(lin);
  rep["config"] = p.description;
  rep["check"] = {{"reference", c.central_differences ? "central_differences" : "forward_ad"},
                  {"reference_reason", c.why},
                  {"forward_ad_bytes_estimate", c.forward_ad_bytes},
                  {"memory_limit", c.memory_limit},
                  {"reference_dtype", c.central_differences ? "float64"
                                      : refs.in_float32     ? "float32"
                                                            : "as traced"},
                  {"max_abs_error", c.err.max_abs_error},
                  {"rel_error", c.err.rel_error},
                  {"tolerance", c.tolerance},
                  {"nonfinite", {{"jvpc", c.err.nonfinite_got}, {"reference", c.err.nonfinite_reference}}},
                  {"passed", c.passed}};
  if (batched)
    rep["batched"] = {{"tangents", batched->K},
                      {"matmul_flops", batched->matmul_flops},
                      {"model_matmul_flops", batched->model_flops},
                      {"single_call_matmul_flops", batched->single_flops},
                      {"ms", batched->ms},
                      {"single_call_ms", batched->single_ms},
                      {"unrolled", batched->unrolled},
                      {"rel_error", batched->rel_error},
                      {"tolerance", batched->tolerance},
                      {"passed", batched->passed}};
  write_file_atomically(path, rep.dump(1) + "\n");
}

}  // namespace

void add_linearize(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "linearize",
      "Linearize an example or a traced graph: compile the tangent graph, run it on random tangents and check it "
      "against LibTorch's forward AD (math attention backend)");
  add_target_option(cmd, o->target, /*required=*/false);  // not with --list-passes
  cmd->add_flag("--list-passes", o->list_passes,
                "print the passes linearize runs, in order, which of them --disable-pass may leave out, and why each "
                "stands where it does; then exit");
  cmd->add_option("--wrt", o->wrt, "comma-separated primal inputs to differentiate (default: the differentiable ones)");
  cmd->add_option("--report", o->report, "write the compile report and the check as JSON")->check(flags::kFileName);
  cmd->add_option("--dump-after", o->dump_after,
                  "print the IR after this pass (repeatable; 'trace' for the traced graph, 'all' for every pass)");
  std::string optional;
  for (const std::string& name : optional_linearize_passes()) optional += (optional.empty() ? "" : ", ") + name;
  cmd->add_option("--disable-pass", o->disabled,
                  "leave this optimization out (repeatable), to see what it does: " + optional);
  cmd->add_option("--dump-format", o->dump_format,
                  "text, or json: one line per dump, {\"after\": PASS, \"position\": N, \"graph\": ...}, among the "
                  "table's lines (constants are not included)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  add_output_option(cmd, o->out, "write the tangent graph as JSON (residuals beside it in .safetensors)");
  add_inputs_option(cmd, o->inputs,
                    "graph file: safetensors file with the primals by name (default: x.inputs.safetensors beside "
                    "x.json, written by `jvpc trace -o`, else random)");
  add_seed_option(cmd, o->seed, "seed of the random tangents (and of random primals, for a graph file)");
  add_device_option(cmd, o->device);
  cmd->add_flag("--trusted", o->trusted, kTrustedHelp);
  cmd->add_flag(
      "--verify-each", o->verify_each,
      "verify the whole graph after every pass, naming the pass that breaks it (by default the pipeline's input and output)");
  cmd->add_flag("--timing", o->timing,
                "print each pass's time and its verification's, then each phase's (trace, passes, verification, "
                "cost table, executable, shape inference, total), after the cost table");
  add_tolerance_option(cmd, o->tolerance);
  cmd->add_option("--residual-budget", o->residual_budget,
                  "bytes the attentions' tangents may hold and allocate per call (residuals plus peak): an attention "
                  "holds its probabilities P (B·H·Lq·Lk, 4 matmuls per call) where that fits, else takes the O(L) "
                  "form (5 matmuls); bytes, or 64MiB, 2GiB, 1.5G; 0: O(L) everywhere; inf: P everywhere (default: "
                  "3/4 of memory, as --max-memory)")
      ->type_name("SIZE");
  cmd->add_option("--check-reference", o->check_reference,
                  "what the tangents are checked against: forward-ad (LibTorch's forward AD, attention on the math "
                  "path: O(L²) memory), central-differences (in float64 through the function's own kernels: O(L) "
                  "memory, tolerance at least 1e-7), or auto: forward-ad where its predicted memory fits the memory "
                  "limit (--max-memory), else central-differences")
      ->check(CLI::IsMember({"auto", "forward-ad", "central-differences"}))
      ->capture_default_str();
  cmd->add_option("--tangents", o->tangents,
                  "also run K random tangents in one batched call (the batched tangent graph): its matmul FLOPs "
                  "and time, checked against K single calls")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->type_name("K");
  add_max_memory(cmd, o->limits);
  add_max_flops(cmd, o->limits);
  cmd->allow_extras();
  cmd->footer(examples_help());
  cmd->callback([o, cmd] {
    if (o->list_passes) {
      if (!o->target.empty()) throw Error("--list-passes takes no target");
      print_linearize_passes(std::cout);
      return;
    }
    if (o->target.empty()) throw Error("target is required: an example (sdpa, mlp, block) or a graph .json");
    o->limits.check();
    Target p = resolve_target(o->target_flags(), leftover(*cmd));
    References refs = references_for(p, o->limits);
    // Every file this run writes, before the work (-o and --report themselves were checked as flags).
    if (!o->out.empty()) check_destination(constants_path_for(o->out));

    LinearizeOptions opts;
    opts.pass_costs = true;  // the summary prints the cost table
    if (cmd->count("--wrt")) opts.wrt = comma_list(o->wrt, "--wrt", /*distinct=*/true);
    opts.disabled_passes = std::set<std::string>(o->disabled.begin(), o->disabled.end());
    if (o->verify_each) opts.verify_each = true;
    if (cmd->count("--residual-budget")) opts.residual_budget = parse_size(o->residual_budget, "--residual-budget");
    check_pass_names(o->dump_after, opts.disabled_passes);  // before tracing: a bad name fails fast
    std::set<std::string> dumps(o->dump_after.begin(), o->dump_after.end());
    IrDump dump(dumps, o->dump_format, std::cout, "trace");
    if (!dumps.empty()) opts.observers.push_back(&dump);
    opts.runtime.max_memory = o->limits.memory();  // the tangent graph's Executable
    std::vector<at::Tensor> primal_values = p.primal_values();
    std::vector<std::string> primal_names;
    for (const TraceInput& in : p.primals) primal_names.push_back(in.name);
    Linearized lin =
        p.graph ? linearize(std::move(p.graph), primal_values, opts) : linearize(p.example->fn(), p.primals, opts);

    check_flops(*lin.tangent_graph, o->limits, "tangent graph");  // before the check runs it
    Check c =
        check(refs, primal_names, lin, primal_values, o->seed, o->tolerance, o->check_reference, o->limits.memory());
    print_summary(p, refs, lin, c);
    std::optional<BatchedCheck> batched;
    if (o->tangents > 0) {
      check_flops(lin.batched(o->tangents).fn->graph(), o->limits, "batched tangent graph");
      batched = check_batched(lin, o->tangents, o->seed, o->tolerance);
      print_batched(*batched);
    }
    if (o->timing) {
      std::cout << "\n";
      print_timings(lin.report.timings, std::cout);
      std::cout << "\n";
      print_phases(lin.report.phases, std::cout);
    }
    if (!o->out.empty()) {
      SaveOptions so;
      so.trusted = o->trusted;
      save(*lin.tangent_graph, o->out, so);
      std::cout << "tangent graph -> " << o->out << "\n";
    }
    if (!o->report.empty()) write_report(o->report, p, refs, lin, c, batched);
    if (!c.passed)
      fail_check(format("rel_error %.3e against %s is over the tolerance %.1e", c.err.rel_error,
                        c.central_differences ? "central differences" : "LibTorch forward AD", c.tolerance));
    if (batched && !batched->passed)
      fail_check(
          format("%lld tangents in one batched call: rel_error %.3e against single calls, tolerance %.1e, "
                 "FLOPs %s the cost model's",
                 static_cast<long long>(batched->K), batched->rel_error, batched->tolerance,
                 batched->matmul_flops == batched->model_flops ? "equal to" : "differ from"));
  });
}

}  // namespace jvpc::cli
