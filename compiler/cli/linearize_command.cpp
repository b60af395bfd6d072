// jvpc linearize: trace and compile, run the linear function on random tangents, and check
// it against LibTorch's forward AD run eagerly on the untraced callable (math SDPA backend),
// or for a graph file on the graph itself with fused attention on the math path. Where that
// reference would not fit in memory (the math path holds B·H·Lq·Lk scores several times over;
// forward_ad_bytes_estimate against the memory limit), the check runs against central
// differences in float64 through the function's own (fused, O(L)) kernels instead, and says so.
#include "compiler/cli/cli.h"

#include "compiler/api/linearize.h"
#include "compiler/ir/limits.h"
#include "compiler/api/reference.h"
#include "compiler/cost/kernel_watch.h"
#include "compiler/ir/files.h"
#include "compiler/ir/ops.h"
#include "compiler/ir/serialize.h"
#include "examples/examples.h"
#include "examples/flags.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

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
  bool trusted = false, verify_each = false, timing = false;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  if (!s.empty() && s.back() == ',') throw Error("--wrt '" + s + "': an empty name");  // getline drops it
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw Error("--wrt '" + s + "': an empty name");
    if (std::find(out.begin(), out.end(), item) != out.end())
      throw Error("--wrt '" + s + "' names '" + item + "' twice");
    out.push_back(item);
  }
  if (out.empty()) throw Error("--wrt '" + s + "' names no input");
  return out;
}

// --disable-pass takes the optional passes; --dump-after "trace" (the traced graph), the names of
// the passes that run, or "all".
void check_pass_names(const std::vector<std::string>& names, const std::set<std::string>& disabled) {
  Pipeline p;
  add_linearize_passes(p, {}, disabled);       // throws for a pass that cannot be disabled
  std::vector<std::string> known = {"trace"};  // in pipeline order, each once (dce runs twice)
  for (const std::string& k : p.pass_names())
    if (std::find(known.begin(), known.end(), k) == known.end()) known.push_back(k);
  std::string list;
  for (const std::string& k : known) list += k + ", ";
  for (const std::string& n : names)
    if (n != "all" && std::find(known.begin(), known.end(), n) == known.end())
      throw Error("--dump-after: no pass is named '" + n + "' (passes: " + list + "all)");
}

// What a linearize run needs, from an example or from a graph file.
struct Problem {
  std::string description;
  std::vector<TraceInput> primals;
  TensorFn fn;         // traced by linearize (examples)
  TensorFn reference;  // run under forward AD
  // The function on its own (fused) attention kernels, for central differences in float64: the
  // check's reference where forward AD of the math path would not fit in memory.
  TensorFn fused;
  std::unique_ptr<Graph> graph;  // graph files: linearized directly
  // Examples in float16/bfloat16: the reference runs on float32 copies of the primals and
  // tangents. It is the truer answer, and LibTorch's forward AD has half-precision gaps of its
  // own (layer_norm's float32 statistics on CUDA meet float16 weights).
  bool reference_in_float32 = false;
};

Problem from_example(const Opts& o, std::vector<std::string> flags) {
  if (!o.device.empty()) flags.insert(flags.end(), {"--device", o.device});  // CLI11 gives it to us, not the example
  examples::Instance ex = examples::make(o.target, flags);
  Problem p;
  p.description = ex.description;
  p.primals = ex.inputs;
  p.fn = ex.fn();
  p.reference = ex.make_fn(examples::Backend::Math);
  p.fused = ex.fn();
  p.reference_in_float32 = c10::isReducedFloatingType(ex.dtype);
  return p;
}

Problem from_graph(const Opts& o) {
  std::optional<c10::Device> dev;
  if (!o.device.empty()) dev = c10::Device(o.device);
  Problem p;
  LoadOptions lo = load_options(dev, o.limits);
  lo.trusted = o.trusted;
  p.graph = load(o.target, lo);
  check_flops(*p.graph, o.limits);  // linearize runs the forward once
  for (const Input& in : p.graph->inputs())
    if (in.role == Role::Tangent)
      throw Error(printable_path(o.target) + ": already has tangent input '" + in.name +
                  "'; linearize takes a traced graph");
  // The primals: --inputs, else the traced example's values beside the graph, else random.
  std::string inputs = o.inputs;
  if (inputs.empty() && std::filesystem::is_regular_file(traced_inputs_path_for(o.target)))
    inputs = traced_inputs_path_for(o.target);
  auto values = inputs.empty() ? random_inputs(*p.graph, o.seed) : inputs_from_file(*p.graph, inputs);
  p.description = o.target + (inputs.empty() ? " (random primals, seed " + std::to_string(o.seed) + ")"
                                             : " (primals from " + inputs + ")");
  size_t i = 0;
  for (const Input& in : p.graph->inputs())
    if (in.role == Role::Primal) p.primals.push_back({in.name, values.at(i++), in.differentiable});
  // The reference: the same graph, run node by node through the dispatcher on dual tensors,
  // with fused attention on LibTorch's math path (as for an example) and, in float16 or
  // bfloat16, in float32 on the same values (as for an example).
  for (const Input& in : p.graph->inputs())
    p.reference_in_float32 |= c10::isReducedFloatingType(in.value->meta().dtype);
  {  // compiled when the check needs it: in float64 it takes twice the graph's memory
    std::shared_ptr<Graph> g = p.graph->clone();
    std::optional<int64_t> max_memory = o.limits.memory();
    p.fused = [g, max_memory](const std::vector<at::Tensor>& x) {
      std::unique_ptr<Graph> f64 = g->clone();
      retype_floating(*f64, c10::kDouble);
      ExecutableOptions plain = ExecutableOptions::plain();
      plain.max_memory = max_memory;
      return Executable(std::move(f64), plain).run(x);
    };
  }
  try {
    std::unique_ptr<Graph> ref = with_math_attention(*p.graph);
    if (p.reference_in_float32) retype_floating(*ref, c10::kFloat);
    ExecutableOptions plain = ExecutableOptions::plain();
    plain.max_memory = o.limits.memory();
    auto exe = std::make_shared<Executable>(std::move(ref), plain);
    p.reference = [exe](const std::vector<at::Tensor>& x) { return exe->run(x); };
  } catch (const Error& e) {
    std::string why = e.what();
    p.reference = [why](const std::vector<at::Tensor>&) -> std::vector<at::Tensor> { throw Error(why); };
  }
  return p;
}

// The linear map on random tangents against a reference on the same ones: LibTorch's forward AD
// (of the math path), or where that would not fit in memory (forward_ad_bytes_estimate against
// the memory limit) or with --check-reference central-differences, central differences in
// float64 through the function's own fused kernels, which need O(L) memory.
struct Check {
  ErrorStats err;
  double tolerance;
  bool passed;
  bool central_differences = false;
  std::string why;  // why that reference
  int64_t forward_ad_bytes = 0, memory_limit = 0;
};

Check check(const Problem& p, const Linearized& lin, const std::vector<at::Tensor>& primal_values, uint64_t seed,
            std::optional<double> tolerance, const std::string& reference, std::optional<int64_t> max_memory) {
  Check c{};
  int64_t input_bytes = 0, element_bytes = 0;
  for (const at::Tensor& v : primal_values) {
    input_bytes += static_cast<int64_t>(v.nbytes());
    if (c10::isFloatingType(v.scalar_type()))
      element_bytes = std::max<int64_t>(element_bytes, p.reference_in_float32 ? 4 : v.element_size());
  }
  std::vector<int64_t> scores;
  for (const AttentionChoice& a : lin.report.attention) scores.push_back(a.score_elements);
  c.forward_ad_bytes = forward_ad_bytes_estimate(input_bytes, lin.report.forward.peak_bytes, scores,
                                                 std::max<int64_t>(element_bytes, 4));
  c.memory_limit = memory_limit_or_default(max_memory, execution_device(*lin.tangent_graph));
  if (reference == "central-differences") {
    c.central_differences = true;
    c.why = "--check-reference central-differences";
  } else if (reference == "auto" && c.forward_ad_bytes > c.memory_limit) {
    c.central_differences = true;
    c.why = "forward AD of the math path would need about " + human_bytes(c.forward_ad_bytes) +
            ", over the memory limit " + human_bytes(c.memory_limit);
  }
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  std::vector<at::Tensor> tangents;
  std::vector<std::optional<at::Tensor>> ref_tangents(p.primals.size());
  for (const Input* in : lin.jvp_fn->arguments()) {
    const TensorMeta& m = in->value->meta();
    at::Tensor t = at::randn(m.sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(m.device, m.dtype);
    tangents.push_back(t);
    for (size_t i = 0; i < p.primals.size(); ++i)
      if (p.primals[i].name == in->tangent_of) ref_tangents[i] = t;
  }
  std::vector<at::Tensor> got = lin.jvp(tangents);
  std::vector<at::Tensor> ref;
  if (c.central_differences) {
    try {
      ref = central_differences_jvp(p.fused, primal_values, ref_tangents);
    } catch (const std::exception& e) {
      throw Error(std::string("cannot check against central differences in float64: ") + one_line(e));
    }
    double tol = 0;
    for (const at::Tensor& t : got)
      if (differentiable_dtype(t.scalar_type()))
        tol = std::max(tol, central_differences_tolerance(c10::toRealValueType(t.scalar_type())));
    c.tolerance = tolerance ? *tolerance : (tol > 0 ? tol : central_differences_tolerance(c10::kFloat));
  } else {
    auto ref_dtype = [&](const at::Tensor& t) {
      return p.reference_in_float32 && c10::isReducedFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t;
    };
    std::vector<at::Tensor> ref_primals;
    for (const auto& v : primal_values) ref_primals.push_back(ref_dtype(v));
    for (auto& t : ref_tangents)
      if (t) t = ref_dtype(*t);
    try {
      ref = forward_ad_jvp(p.reference, ref_primals, ref_tangents);
    } catch (const std::exception& e) {
      throw Error(std::string("cannot check against LibTorch's forward AD: ") + one_line(e));
    }
    c.tolerance = tolerance ? *tolerance : tolerance_for(got);
    c.why = reference == "forward-ad" ? "--check-reference forward-ad"
                                      : "it fits: about " + human_bytes(c.forward_ad_bytes) + " of the memory limit " +
                                            human_bytes(c.memory_limit);
  }
  c.err = compare(got, ref);
  c.passed = c.err.rel_error <= c.tolerance;
  return c;
}

template <typename... A>
std::string format(const char* f, A... a) {
  char line[512];
  std::snprintf(line, sizeof line, f, a...);
  return line;
}

void print_summary(const Problem& p, const Linearized& lin, const Check& c, bool is_graph) {
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
  reference += p.reference_in_float32 ? ", in float32)" : ")";
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

// --tangents K: K random tangents in one batched call (Linearized::jvp_batched), its matmul FLOPs
// measured on the kernels that ran and its time, checked against K single calls.
struct BatchedCheck {
  int64_t K = 0;
  int64_t matmul_flops = 0, model_flops = 0, single_flops = 0;
  double ms = 0, single_ms = 0;  // one batched call; one single call
  std::vector<std::string> unrolled;
  double rel_error = 0, tolerance = 0;
  bool passed = false;
};

BatchedCheck check_batched(const Linearized& lin, int64_t K, uint64_t seed, std::optional<double> tolerance) {
  using clock = std::chrono::steady_clock;
  BatchedCheck b;
  b.K = K;
  const BatchedLinear& fn = lin.batched(K);
  b.unrolled = fn.unrolled;
  b.model_flops = graph_cost(fn.fn->graph()).matmul_flops;
  b.single_flops = lin.report.tangent.matmul_flops;
  at::Generator gen = at::detail::createCPUGenerator(seed + 2);
  std::vector<at::Tensor> tangents;
  for (const Input* in : fn.fn->arguments()) {
    const TensorMeta& m = in->value->meta();
    tangents.push_back(at::randn(m.sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(m.device, m.dtype));
  }
  lin.jvp_batched(K, tangents);  // the first call checks the kernels' results against the graph
  std::vector<at::Tensor> got;
  {
    KernelWatch watch;
    got = lin.jvp_batched(K, tangents);
    b.matmul_flops = watch.matmul_flops();
  }
  auto t0 = clock::now();  // timed apart from the watch, whose callbacks cost time per kernel
  lin.jvp_batched(K, tangents);
  b.ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  std::vector<std::vector<at::Tensor>> per_output(got.size());
  for (int64_t k = 0; k < K; ++k) {
    std::vector<at::Tensor> one;
    for (const at::Tensor& t : tangents) one.push_back(t.select(0, k).contiguous());
    auto t1 = clock::now();
    std::vector<at::Tensor> single = lin.jvp(one);
    if (k == 1 || K == 1) b.single_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
    if (single.size() != got.size())
      throw Error("the batched map gave " + std::to_string(got.size()) + " outputs, not " +
                  std::to_string(single.size()));
    for (size_t i = 0; i < single.size(); ++i) per_output[i].push_back(single[i]);
  }
  std::vector<at::Tensor> want;
  for (const auto& outs : per_output) want.push_back(at::stack(outs));
  ErrorStats err = compare(got, want);
  b.rel_error = err.rel_error;
  b.tolerance = tolerance ? *tolerance : tolerance_for(got);
  b.passed = b.rel_error <= b.tolerance && b.matmul_flops == b.model_flops;
  return b;
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

void write_report(const std::string& path, const Problem& p, const Linearized& lin, const Check& c,
                  const std::optional<BatchedCheck>& batched) {
  const CompileReport& r = lin.report;
  nlohmann::json rep;
  rep["config"] = p.description;
  rep["passes"] = nlohmann::json::array();
  for (const auto& row : r.passes) {
    nlohmann::json j = to_json(row.cost);
    j.erase("ops");
    j["name"] = row.pass;
    rep["passes"].push_back(j);
  }
  rep["timing_ms"] = nlohmann::json::array();
  for (const PassTime& t : r.timings)
    rep["timing_ms"].push_back({{"pass", t.pass}, {"run", t.run_ms}, {"verify", t.verify_ms}});
  rep["forward"] = to_json(r.forward);
  rep["linearize"] = {{"matmul_flops", r.linearize_matmul_flops}, {"matmul_flops_by_op", r.linearize_matmul_by_op}};
  rep["jvp"] = to_json(r.tangent);
  rep["jvp"]["tangents"] = lin.tangent_names();
  rep["attention"] = nlohmann::json::array();
  for (const AttentionChoice& a : r.attention) {
    auto form = [](const AttentionChoice::Form& f) {
      return nlohmann::json{
          {"residual_bytes", f.residual_bytes}, {"peak_bytes", f.peak_bytes}, {"matmul_flops", f.matmul_flops}};
    };
    const AttentionChoice::Form& f = a.o_l_form ? a.o_l : a.p;
    rep["attention"].push_back({{"node", a.node},
                                {"choice", a.o_l_form ? "O(L)" : "P"},
                                {"reason", a.reason},
                                {"residual_bytes", f.residual_bytes},
                                {"peak_bytes", f.peak_bytes},
                                {"matmul_flops", f.matmul_flops},
                                {"forms", {{"P", form(a.p)}, {"O(L)", form(a.o_l)}}}});
  }
  rep["check"] = {{"reference", c.central_differences ? "central_differences" : "forward_ad"},
                  {"reference_reason", c.why},
                  {"forward_ad_bytes_estimate", c.forward_ad_bytes},
                  {"memory_limit", c.memory_limit},
                  {"reference_dtype", c.central_differences    ? "float64"
                                      : p.reference_in_float32 ? "float32"
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
  add_target_option(cmd, o->target);
  cmd->add_option("--wrt", o->wrt, "comma-separated primal inputs to differentiate (default: the differentiable ones)");
  cmd->add_option("--report", o->report, "write the compile report and the check as JSON")->check(examples::kFileName);
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
  cmd->add_option("-o,--output", o->out, "write the tangent graph as JSON (residuals beside it in .safetensors)")
      ->check(examples::kFileName);
  cmd->add_option("--inputs", o->inputs,
                  "graph file: safetensors file with the primals by name (default: x.inputs.safetensors beside "
                  "x.json, written by `jvpc trace -o`, else random)");
  cmd->add_option("--seed", o->seed, "seed of the random tangents (and of random primals, for a graph file)")
      ->capture_default_str()
      ->check(examples::kSeed);
  add_device_option(cmd, o->device);
  cmd->add_flag("--trusted", o->trusted, kTrustedHelp);
  cmd->add_flag("--verify-each", o->verify_each,
                "verify the whole graph after every pass (by default only after passes that changed it)");
  cmd->add_flag("--timing", o->timing, "print each pass's time and its verification's, after the cost table");
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
    o->limits.check();
    bool is_graph = ends_with(o->target, ".json");
    Problem p = is_graph ? from_graph(*o) : from_example(*o, leftover(*cmd));
    if (is_graph && !leftover(*cmd).empty())
      throw Error("unexpected arguments after a graph file: " + leftover(*cmd)[0]);
    if (!is_graph && !o->inputs.empty()) throw Error("--inputs is for a graph file; an example makes its own inputs");
    // Every file this run writes, before the work (-o and --report themselves were checked as flags).
    if (!o->out.empty()) check_destination(constants_path_for(o->out));

    LinearizeOptions opts;
    if (cmd->count("--wrt")) opts.wrt = split_names(o->wrt);
    opts.disabled_passes = std::set<std::string>(o->disabled.begin(), o->disabled.end());
    if (o->verify_each) opts.verify_each = true;
    if (cmd->count("--residual-budget")) opts.residual_budget = parse_size(o->residual_budget, "--residual-budget");
    check_pass_names(o->dump_after, opts.disabled_passes);  // before tracing: a bad name fails fast
    std::set<std::string> dumps(o->dump_after.begin(), o->dump_after.end());
    IrDump dump(dumps, o->dump_format, std::cout, "trace");
    if (!dumps.empty()) opts.observers.push_back(&dump);
    opts.runtime.max_memory = o->limits.memory();  // the tangent graph's Executable
    std::vector<at::Tensor> primal_values;
    for (const auto& in : p.primals) primal_values.push_back(in.value);
    Linearized lin = p.graph ? linearize(std::move(p.graph), primal_values, opts) : linearize(p.fn, p.primals, opts);

    check_flops(*lin.tangent_graph, o->limits, "tangent graph");  // before the check runs it
    Check c = check(p, lin, primal_values, o->seed, o->tolerance, o->check_reference, o->limits.memory());
    print_summary(p, lin, c, is_graph);
    std::optional<BatchedCheck> batched;
    if (o->tangents > 0) {
      check_flops(lin.batched(o->tangents).fn->graph(), o->limits, "batched tangent graph");
      batched = check_batched(lin, o->tangents, o->seed, o->tolerance);
      print_batched(*batched);
    }
    if (o->timing) {
      std::cout << "\n";
      print_timings(lin.report.timings, std::cout);
    }
    if (!o->out.empty()) {
      SaveOptions so;
      so.trusted = o->trusted;
      save(*lin.tangent_graph, o->out, so);
      std::cout << "tangent graph -> " << o->out << "\n";
    }
    if (!o->report.empty()) write_report(o->report, p, lin, c, batched);
    exit_code = c.passed && (!batched || batched->passed) ? 0 : 1;
  });
}

}  // namespace jvpc::cli
