// The jvpc command-line tool: one function per command, sharing a few helpers.
// Exit codes: 0 success, 1 a check failed (linearize's comparison), 2 bad input or error.
#pragma once

#include "compiler/api/inputs_file.h"
#include "ir/graph.h"
#include "ir/io/graph_files.h"
#include "ir/io/safetensors.h"

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
void add_compile(CLI::App& app);  // program_command.cpp
void add_jvp(CLI::App& app);      // program_command.cpp
void add_opt(CLI::App& app);      // opt_command.cpp

/// --trusted: what it allows (docs/bad-input.md, "Graph files from strangers").
constexpr const char* kTrustedHelp =
    "the graph file is one you made yourself: allow ops off the list of ops graph files may use "
    "(jvpc rules --loadable), in loading and in saving. Never use it on a file from someone else";

/// Writes the AOTInductor packages of the program at `path` beside it: runs jvpc's Python module
/// (python -m jvpc._aoti; the Python is $JVPC_PYTHON, else the one jvpc was built with where it
/// exists, else python3 on PATH), whose output and errors go to the terminal. A failure is a
/// jvpc::Error.
void write_aoti_packages(const std::string& path, bool trusted);

/// The exit code of the command that ran (set by the command's callback).
extern int exit_code;
/// A check failed: says which on stderr, in one line, and makes the exit code 1.
void fail_check(const std::string& what);

/// Random values for the non-constant inputs of `g` (floating: standard normal, bool: random,
/// integer: zeros), seeded, drawn on the CPU and moved to each input's device.
std::vector<at::Tensor> random_inputs(const Graph& g, uint64_t seed);
/// Values for the non-constant inputs of `g`, by name, from a safetensors file ("inputs file").
std::vector<at::Tensor> inputs_from_file(const Graph& g, const std::string& path);
/// Refuses inputs larger than JVPC_MAX_INPUT_BYTES (default 16 GiB) before allocating them,
/// counting what random_inputs() allocates: each input in its own dtype, plus the host copy of
/// an input drawn for another device while it exists.
void check_input_size(const Graph& g);

/// The limits of a command that loads or runs a graph: --max-memory SIZE and --max-flops N.
struct LimitFlags {
  std::optional<std::string> max_memory;  ///< none: the default limit (default_memory_limit in ir/io/limits.h)
  std::string max_flops = "1e15";
  /// The memory limit for LoadOptions and ExecutableOptions: none (the default) or bytes.
  std::optional<int64_t> memory() const;
  /// The FLOP limit (infinity for "inf").
  double flops() const;
  /// Parses both, so that a bad value fails before any work.
  void check() const {
    memory();
    flops();
  }
};
/// LoadOptions for a graph file: onto `device` (none: the file's own), with --max-memory.
LoadOptions load_options(std::optional<c10::Device> device, const LimitFlags& limits);
/// The options `jvpc linearize` and `jvpc compile` both take, declared once for both: the
/// positional target (an example or a graph file), --device and --tolerance.
void add_target_option(CLI::App* cmd, std::string& target, bool required = true);
void add_device_option(CLI::App* cmd, std::string& device);
void add_tolerance_option(CLI::App* cmd, std::optional<double>& tolerance);
/// -o,--output FILE: what the command writes there (a file name checked before any work).
void add_output_option(CLI::App* cmd, std::string& out, const std::string& help);
/// --inputs FILE: a safetensors file with tensors by name.
void add_inputs_option(CLI::App* cmd, std::string& inputs, const std::string& help);
/// --seed N (0 to 2^32 - 1, default 0): what it seeds.
void add_seed_option(CLI::App* cmd, uint64_t& seed, const std::string& help);
/// Adds --max-memory to a command that loads or runs a graph.
void add_max_memory(CLI::App* cmd, LimitFlags& flags);
/// Adds --max-flops to a command that runs a graph.
void add_max_flops(CLI::App* cmd, LimitFlags& flags);
/// FLOPs above which a command prints the cost model's count before it runs a graph.
constexpr double kFlopsWorthSaying = 1e12;
/// Refuses `g` (`what`: "graph", "tangent graph") when the cost model's FLOPs (matmul and
/// other) pass --max-flops, in one line naming both; above kFlopsWorthSaying prints them on one
/// line to stderr, before the graph runs.
void check_flops(const Graph& g, const LimitFlags& flags, const std::string& what = "graph");
/// A flag's comma-separated names (--wrt q,v; --passes cse,dce): at least one, none empty, and
/// with `distinct` none twice; otherwise a jvpc::Error naming the flag.
std::vector<std::string> comma_list(const std::string& s, const std::string& flag, bool distinct);
/// Example flags: the arguments CLI11 left over, in order.
std::vector<std::string> leftover(const CLI::App& sub);
/// Each example's description and flags, for the --help footers of trace and linearize.
std::string examples_help();

}  // namespace jvpc::cli
