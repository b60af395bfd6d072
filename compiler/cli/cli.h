// The jvpc command-line tool: one function per command, sharing a few helpers.
// Exit codes: 0 success, 1 a check failed (linearize's comparison), 2 bad input or error.
#pragma once

#include "compiler/ir/graph.h"

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace jvpc::cli {

void add_trace(CLI::App& app);
void add_show(CLI::App& app);
void add_run(CLI::App& app);
void add_cost(CLI::App& app);
void add_linearize(CLI::App& app);
void add_rules(CLI::App& app);

/// --trusted: what it allows (docs/bad-input.md, "Graph files from strangers").
constexpr const char* kTrustedHelp =
    "the graph file is one you made yourself: allow ops off the list of ops graph files may use "
    "(jvpc rules --loadable), in loading and in saving. Never use it on a file from someone else";

/// The exit code of the command that ran (set by the command's callback).
extern int exit_code;

/// Random values for the non-constant inputs of `g` (floating: standard normal, bool: random,
/// integer: zeros), seeded, drawn on the CPU and moved to each input's device.
std::vector<at::Tensor> random_inputs(const Graph& g, uint64_t seed);
/// Values for the non-constant inputs of `g`, by name, from a safetensors file ("inputs file").
std::vector<at::Tensor> inputs_from_file(const Graph& g, const std::string& path);
/// Where `jvpc trace -o x.json` writes the example's input values: "x.inputs.safetensors".
std::string traced_inputs_path_for(const std::string& graph_path);
/// Refuses inputs larger than JVPC_MAX_INPUT_BYTES (default 16 GiB) before allocating them.
void check_input_size(const Graph& g);
/// Example flags: the arguments CLI11 left over, in order.
std::vector<std::string> leftover(const CLI::App& sub);
/// Each example's description and flags, for the --help footers of trace and linearize.
std::string examples_help();

}  // namespace jvpc::cli
