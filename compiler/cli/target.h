// What `jvpc linearize` and `jvpc compile` work on, resolved in one place: an example by name
// with its flags, or a traced graph file with its primal values.
#pragma once

#include "compiler/cli/cli.h"
#include "examples/examples.h"

#include <optional>
#include <string>
#include <vector>

namespace jvpc::cli {

/// The flags that choose a target and its primals.
struct TargetFlags {
  std::string target;  ///< an example's name, or a graph file (.json)
  std::string device;  ///< --device: where a graph file runs, or the example's --device
  std::string inputs;  ///< --inputs: a graph file's primals by name (safetensors)
  uint64_t seed = 0;   ///< --seed: random primals for a graph file without an inputs file
  bool trusted = false;
  LimitFlags limits;
};

struct Target {
  /// One line for the output's header: the example's sizes, dtype, device and backend, or the
  /// file and where its primals came from.
  std::string description;
  std::optional<examples::Instance> example;  ///< an example's callable and inputs
  std::unique_ptr<Graph> graph;               ///< a graph file's traced graph
  /// The primals, by name, in order: the example's inputs, or the graph's primal inputs.
  std::vector<TraceInput> primals;
  bool is_graph = false;  ///< a graph file (`graph` may have been moved out)
  std::vector<at::Tensor> primal_values() const;
};

/// Whether `target` names a graph file rather than an example.
bool is_graph_file(const std::string& target);

/// Resolves the target. A graph file is loaded onto --device with --trusted and --max-memory,
/// refused past --max-flops or when it already has tangent inputs, and takes its primals from
/// --inputs, else from the traced example's inputs file beside it (`jvpc trace -o x.json`
/// writes x.inputs.safetensors), else random with --seed; it takes no example flags. An
/// example is built from `example_flags` (the arguments CLI11 left over) and --device, and
/// takes no --inputs.
Target resolve_target(const TargetFlags& flags, std::vector<std::string> example_flags);

}  // namespace jvpc::cli
