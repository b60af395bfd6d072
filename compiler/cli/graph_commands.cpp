// jvpc trace | show | run | cost
#include "compiler/cli/cli.h"
#include "ir/op.h"

#include "ir/cost/cost_model.h"
#include "ir/io/files.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ir/io/graph_files.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "ir/io/safetensors.h"
#include "examples/examples.h"
#include "compiler/cli/flags.h"
#include "passes/cost_table.h"
#include "runtime/executable.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <memory>

namespace jvpc::cli {

namespace {

LoadOptions cpu_options(bool trusted, const LimitFlags& limits) {
  LoadOptions o = load_options(c10::Device(c10::kCPU), limits);
  o.trusted = trusted;
  return o;
}

// The graphs of a file `show` and `cost` print: a graph file's one graph (titled by the file), or
// a program's primal and tangent graphs (`jvpc compile -o`, Program.save).
struct Titled {
  std::string title;
  std::unique_ptr<Graph> graph;
};
std::vector<Titled> graphs_in(const std::string& path, const LoadOptions& options) {
  std::vector<Titled> out;
  try {
    out.push_back({path, load(path, options)});
    return out;
  } catch (const Error& e) {
    // load() refuses a program by name; anything else is the file's error.
    if (std::string(e.what()).find("is a compiled program") == std::string::npos) throw;
  }
  ProgramGraphs p = load_program(path, options);
  size_t residuals = p.primal->outputs().size() - p.primal_outputs;
  out.push_back({"primal graph: the function's outputs (" + std::to_string(p.primal_outputs) +
                     "), then its residuals (" + std::to_string(residuals) + ")",
                 std::move(p.primal)});
  out.push_back({"tangent graph", std::move(p.tangent)});
  return out;
}

// The attentions in the O(L) form (jvpc::attention_tangent): what each computes per call.
nlohmann::json attention_json(const Graph& g) {
  nlohmann::json attention = nlohmann::json::array();
  for (const Node* n : g.nodes()) {
    if (!n->is(ops::jvpc_attention_tangent)) continue;
    AttentionTangentShape a = attention_tangent_shape(*n);
    NodeCost nc = node_cost(*n);
    attention.push_back({{"node", describe(n)},
                         {"choice", "O(L)"},
                         {"scores", std::vector<int64_t>{a.B, a.H, a.Lq, a.Lk}},
                         {"causal", a.causal},
                         {"blocks", std::vector<int64_t>{a.block_q, a.block_k}},
                         {"matmul_flops", nc.matmul_flops},
                         {"workspace_bytes", nc.workspace_bytes}});
  }
  return attention;
}

nlohmann::json cost_json(const Graph& g) {
  nlohmann::json j = to_json(graph_cost(g));
  j["attention"] = attention_json(g);
  return j;
}

// What `jvpc cost` prints under a graph's row: its ops, attentions, uncosted ops, and with
// --nodes every node's cost.
void print_cost_details(const Graph& g, bool nodes) {
  GraphCost c = graph_cost(g);
  std::cout << "ops:";
  for (const auto& [op, n] : c.ops) std::cout << " " << op << "×" << n;
  std::cout << "\n";
  for (const auto& a : attention_json(g))
    std::cout << "attention " << a["node"].get<std::string>() << ": O(L) form, scores " << a["scores"].dump()
              << (a["causal"].get<bool>() ? " causal" : "") << ", blocks " << a["blocks"].dump() << ", matmul FLOPs "
              << a["matmul_flops"].get<int64_t>() << " per call, workspace "
              << human_bytes(a["workspace_bytes"].get<int64_t>()) << "\n";
  if (!c.uncosted_ops.empty()) {
    std::cout << "uncosted ops (no FLOP convention; counted as 1 FLOP per output element):";
    for (const auto& [op, n] : c.uncosted_ops) std::cout << " " << op << "×" << n;
    std::cout << "\n";
  }
  if (nodes)
    for (const Node* n : g.nodes()) {
      NodeCost nc = node_cost(*n);
      std::cout << "  " << to_text(*n) << "\n      matmul " << nc.matmul_flops << "  other " << nc.other_flops
                << "  transcendental " << nc.transcendentals << "  bytes " << nc.bytes
                << (nc.note ? std::string("  (") + nc.note + ")" : "") << "\n";
    }
}

void print_cost(const Graph& g, const std::string& title, bool json, bool nodes) {
  if (json) {
    std::cout << cost_json(g).dump(1) << "\n";
    return;
  }
  CostTable t(title);
  t.start(g);
  t.print(std::cout);
  print_cost_details(g, nodes);
}

}  // namespace

void add_trace(CLI::App& app) {
  struct Opts {
    std::string example, out, format = "text";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd =
      app.add_subcommand("trace", "Trace an example into a jvpc graph (kernel level, as the dispatcher runs it)");
  cmd->add_option("example", o->example, "example to trace: sdpa, mlp or block")->required();
  add_output_option(cmd, o->out,
                    "write the graph as JSON (x.json: constants in x.safetensors, the example's input values in "
                    "x.inputs.safetensors)");
  cmd->add_option("--format", o->format, "without -o: print the graph as text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->allow_extras();
  cmd->footer(examples_help());
  cmd->callback([o, cmd] {
    if (!o->out.empty())  // every file trace writes, before the work (-o itself was checked as a flag)
      for (const std::string& p : {constants_path_for(o->out), traced_inputs_path_for(o->out)}) check_destination(p);
    examples::Instance ex = examples::make(o->example, leftover(*cmd));
    Trace t = trace(ex.fn(), ex.inputs, TraceOptions::graph_only());
    GraphCost c = graph_cost(*t.graph);
    if (o->out.empty()) {
      std::cout << (o->format == "json" ? to_json(*t.graph).dump(1) + "\n" : to_text(*t.graph));
      return;
    }
    std::vector<std::pair<std::string, at::Tensor>> values;  // what `jvpc linearize x.json` checks at
    for (const TraceInput& in : ex.inputs) values.emplace_back(in.name, in.value);
    save_traced(*t.graph, o->out, {}, values);
    std::cout << "traced " << ex.description << ": " << c.nodes << " nodes, " << human_count(c.matmul_flops)
              << " matmul FLOPs -> " << o->out << "\n";
  });
}

void add_show(CLI::App& app) {
  struct Opts {
    std::string file, format = "text";
    bool trusted = false;
    LimitFlags limits;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd =
      app.add_subcommand("show", "Print a graph file, or a program's two graphs, as text, JSON or Graphviz dot");
  cmd->add_option("graph", o->file, "graph JSON file, or a program (jvpc compile -o)")->required();
  cmd->add_option("--format", o->format, "text, json or dot (render dot with: dot -Tpng)")
      ->check(CLI::IsMember({"text", "json", "dot"}))
      ->capture_default_str();
  cmd->add_flag("--trusted", o->trusted, kTrustedHelp);
  add_max_memory(cmd, o->limits);
  cmd->callback([o] {
    std::vector<Titled> graphs = graphs_in(o->file, cpu_options(o->trusted, o->limits));
    bool program = graphs.size() > 1;
    if (o->format == "json" && program) {
      std::cout << nlohmann::json{{"primal", to_json(*graphs[0].graph)}, {"tangent", to_json(*graphs[1].graph)}}.dump(1)
                << "\n";
      return;
    }
    for (const Titled& t : graphs) {
      if (o->format == "json")
        std::cout << to_json(*t.graph).dump(1) << "\n";
      else if (o->format == "dot")
        std::cout << to_dot(*t.graph, t.title);
      else
        std::cout << (program ? "// " + t.title + "\n" : "") << to_text(*t.graph);
    }
  });
}

void add_run(CLI::App& app) {
  struct Opts {
    std::string file, device, inputs;
    uint64_t seed = 0;
    bool no_cuda_graph = false, trusted = false;
    LimitFlags limits;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "run", "Run a graph on random inputs (or inputs from a file); print output shapes and checksums");
  cmd->add_option("graph", o->file, "graph JSON file")->required();
  cmd->add_option("--device", o->device, "cpu or cuda (moves the graph and its constants there)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_seed_option(cmd, o->seed, "seed of the random inputs");
  add_inputs_option(cmd, o->inputs, "safetensors file with a tensor per non-constant input, by name");
  cmd->add_flag("--no-cuda-graph", o->no_cuda_graph, "run node by node on CUDA instead of replaying a CUDA graph");
  cmd->add_flag("--trusted", o->trusted, kTrustedHelp);
  add_max_memory(cmd, o->limits);
  add_max_flops(cmd, o->limits);
  cmd->callback([o] {
    o->limits.check();
    std::optional<c10::Device> dev;
    if (!o->device.empty()) dev = c10::Device(o->device);
    LoadOptions lo = load_options(dev, o->limits);
    lo.trusted = o->trusted;
    std::shared_ptr<const Graph> g(load(o->file, lo));
    check_flops(*g, o->limits);
    ExecutableOptions eo = o->no_cuda_graph ? ExecutableOptions::eager() : ExecutableOptions{};
    eo.max_memory = o->limits.memory();
    Executable exe(g, eo);
    std::vector<at::Tensor> inputs = o->inputs.empty() ? random_inputs(*g, o->seed) : inputs_from_file(*g, o->inputs);
    auto outs = exe.run(inputs);
    for (size_t i = 0; i < outs.size(); ++i) {
      at::Tensor d = outs[i].to(at::kCPU, at::kDouble);
      char line[256];
      std::snprintf(line, sizeof line, "%-10s %-24s sum=% .9e  abs_sum=%.9e\n", g->output_names()[i].c_str(),
                    TensorMeta::of(outs[i]).str().c_str(), d.sum().item<double>(), d.abs().sum().item<double>());
      std::cout << line;
    }
  });
}

void add_cost(CLI::App& app) {
  struct Opts {
    std::string file;
    bool json = false, nodes = false, trusted = false;
    LimitFlags limits;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "cost",
      "FLOPs, bytes and memory of a graph, or of a program's two graphs (matmul FLOPs as FlopCounterMode "
      "counts them)");
  cmd->add_option("graph", o->file, "graph JSON file, or a program (jvpc compile -o)")->required();
  cmd->add_flag("--json", o->json, "print a JSON object");
  cmd->add_flag("--nodes", o->nodes, "also print the cost of every node");
  cmd->add_flag("--trusted", o->trusted, kTrustedHelp);
  add_max_memory(cmd, o->limits);
  cmd->callback([o] {
    std::vector<Titled> graphs = graphs_in(o->file, cpu_options(o->trusted, o->limits));
    if (graphs.size() == 1) {
      print_cost(*graphs[0].graph, o->file, o->json, o->nodes);
      return;
    }
    // A program: a row per graph, then each graph's ops (and nodes); --json: {"primal", "tangent"}.
    if (o->json) {
      std::cout
          << nlohmann::json{{"primal", cost_json(*graphs[0].graph)}, {"tangent", cost_json(*graphs[1].graph)}}.dump(1)
          << "\n";
      return;
    }
    print_cost_rows({{"primal graph", graph_cost(*graphs[0].graph)}, {"tangent graph", graph_cost(*graphs[1].graph)}},
                    std::cout);
    for (const Titled& t : graphs) {
      std::cout << "\n" << t.title << "\n";
      print_cost_details(*t.graph, o->nodes);
    }
  });
}

}  // namespace jvpc::cli
