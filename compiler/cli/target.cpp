// The target of `jvpc linearize` and `jvpc compile`: an example or a graph file (target.h).
#include "compiler/cli/target.h"

#include "ir/io/files.h"
#include "ir/io/graph_files.h"

#include <filesystem>

namespace jvpc::cli {

std::vector<at::Tensor> Target::primal_values() const {
  std::vector<at::Tensor> out;
  for (const TraceInput& in : primals) out.push_back(in.value);
  return out;
}

bool is_graph_file(const std::string& target) {
  return target.size() >= 5 && target.compare(target.size() - 5, 5, ".json") == 0;
}

Target resolve_target(const TargetFlags& f, std::vector<std::string> example_flags) {
  Target t;
  if (!is_graph_file(f.target)) {
    if (!f.inputs.empty()) throw Error("--inputs is for a graph file; an example makes its own inputs");
    if (!f.device.empty()) example_flags.insert(example_flags.end(), {"--device", f.device});
    t.example = examples::make(f.target, example_flags);
    t.description = t.example->description;
    t.primals = t.example->inputs;
    return t;
  }
  if (!example_flags.empty()) throw Error("unexpected arguments after a graph file: " + example_flags[0]);
  t.is_graph = true;
  std::optional<c10::Device> dev;
  if (!f.device.empty()) dev = c10::Device(f.device);
  LoadOptions lo = load_options(dev, f.limits);
  lo.trusted = f.trusted;
  t.graph = load(f.target, lo);
  check_flops(*t.graph, f.limits);  // the forward runs once at least
  for (const Input& in : t.graph->inputs())
    if (in.role == Role::Tangent)
      throw Error(printable_path(f.target) + ": already has tangent input '" + in.name +
                  "'; this command takes a traced graph");
  std::string inputs = f.inputs;
  if (inputs.empty() && std::filesystem::is_regular_file(traced_inputs_path_for(f.target)))
    inputs = traced_inputs_path_for(f.target);
  std::vector<at::Tensor> values =
      inputs.empty() ? random_inputs(*t.graph, f.seed) : inputs_from_file(*t.graph, inputs);
  t.description = f.target + (inputs.empty() ? " (random primals, seed " + std::to_string(f.seed) + ")"
                                             : " (primals from " + inputs + ")");
  size_t i = 0;
  for (const Input& in : t.graph->inputs())
    if (in.role == Role::Primal) t.primals.push_back({in.name, values.at(i++), in.differentiable});
  return t;
}

}  // namespace jvpc::cli
