// Graph files and program files: a graph's JSON form (graph_json.h) in one file, and its
// constants in a safetensors file beside it (safetensors.h).
//
//   {"format": "jvpc-graph", "schema_version": 1,
//    "constants_file": "tangent.safetensors", "constants_size": 655432,
//    "constants_sha1": "3f786850e387550fdab836ed7e6dc881de23001b",
//    "inputs": [...], "nodes": [...], "outputs": [...]}
//
// Constants with data have "stored": true and are a tensor of the same name in the safetensors
// file. Constants that share a storage in memory are stored once: each has
// "view_of": {"tensor": NAME, "offset": N}, a view with its declared sizes and strides into the
// 1-D tensor NAME, from element N. A loaded constant is the graph's own copy, so "aliases"
// (the caller's input it was a view of) is dropped on loading.
//
// "constants_size" and "constants_sha1" (hex) are those of the constants file's bytes as saved:
// load() refuses a constants file of another size or hash, so that a graph and a constants file
// from two different saves never load as a pair. Graph files written before jvpc recorded them
// have neither key, and their constants file is read unchecked (save them again to add them).
#pragma once

#include "ir/graph.h"

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

namespace jvpc {

/// How a graph file is read. A graph file is data from a stranger: by default it may use only
/// the ops on jvpc's list of loadable ops, and must fit the memory limit.
struct LoadOptions {
  /// Move the graph there (see retarget()); by default it stays on the device the file names.
  std::optional<c10::Device> device;
  /// Admit ops off the list of loadable ops. For files you made yourself; never on by default.
  bool trusted = false;
  /// Refuse a graph whose constants, inputs and peak of intermediates (memory_needed in
  /// limits.h, from the declared sizes, before any constant is read) pass this many bytes on
  /// the device it loads onto. None: default_memory_limit() of that device (3/4 of its
  /// memory); kNoMemoryLimit: no limit.
  std::optional<int64_t> max_memory;
};

struct SaveOptions {
  /// Save a graph that uses ops off the list of loadable ops (it loads back only as trusted).
  bool trusted = false;
};

/// Writes `path` and, when the graph holds constant data, the safetensors file beside it.
/// Both are written in full to temporary files before either replaces its destination (see
/// AtomicFile in ir/io/files.h): a failure is an error naming the reason and leaves the
/// previous pair as it was.
void save(const Graph& g, const std::string& path, const SaveOptions& options = {});
/// Reads a graph and its constants. The constants file must hold every stored constant with the
/// declared shape and dtype.
/// Its "constants_file" must be a plain file name in the graph file's folder (a symlink there must
/// lead to a file in that folder), and both files must be regular files (no FIFO, device, ...).
std::unique_ptr<Graph> load(const std::string& path, const LoadOptions& options = {});
/// load() onto `device` (none: the file's own device), with the default options otherwise.
std::unique_ptr<Graph> load(const std::string& path, std::optional<c10::Device> device);

/// A compiled program's two graphs (compiler/api/program.h, runtime/program.h): the primal graph,
/// from primal inputs and captured tensors to the primal outputs and then the residuals, and the
/// tangent graph, from residuals (unbound constants) and tangents to the output tangents.
struct ProgramGraphs {
  std::unique_ptr<Graph> primal, tangent;
  /// How many of the primal graph's outputs are the function's outputs (the rest: the state,
  /// then the residuals).
  size_t primal_outputs = 0;
  /// New primals must have the example primals' strides (dims of size 1 aside); false: other
  /// layouts are copied into the compiled one.
  bool exact_strides = true;
  /// The state the function writes (TraceInput::state): the primal graph's outputs after the
  /// function's are their new values, one per name here, the primal input it is written into.
  std::vector<std::string> state_inputs;
};
/// Writes a program: `path`, one JSON file ({"format": "jvpc-program", "primal_outputs",
/// "exact_strides", "state_inputs" (where there is state), "primal": graph, "tangent": graph},
/// each graph as to_json writes it), and the
/// primal graph's constants (the captured tensors) in the safetensors file beside it, the two
/// written in full before either replaces its destination, as save() does. The tangent graph's
/// constants must be unbound.
void save_program(const Graph& primal, const Graph& tangent, size_t primal_outputs, bool exact_strides,
                  const std::vector<std::string>& state_inputs, const std::string& path,
                  const SaveOptions& options = {});
/// Reads a program save_program wrote, under load()'s rules for each of its graphs (allowed
/// ops, shapes re-derived, memory limit, the constants file's size and hash).
ProgramGraphs load_program(const std::string& path, const LoadOptions& options = {});

/// The safetensors file that goes with a graph file: "x.json" -> "x.safetensors".
std::string constants_path_for(const std::string& graph_path);
/// The AOTInductor packages of a program's two graphs (`jvpc compile --aoti`):
/// "p.json" -> "p.primal.pt2" and "p.tangent.pt2".
std::string primal_package_path_for(const std::string& program_path);
std::string tangent_package_path_for(const std::string& program_path);

}  // namespace jvpc
