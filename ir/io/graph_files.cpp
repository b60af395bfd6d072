// Graph files and program files (graph_files.h): saving a graph with its constants as a pair,
// and loading one from a stranger within the limits: the pair checked, memory counted before
// any constant is read, the constants file confined to the graph's folder.
#include "ir/io/graph_files.h"

#include "ir/io/files.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "ir/io/limits.h"
#include "ir/loadable_ops.h"
#include "ir/ops.h"
#include "ir/retarget.h"
#include "ir/io/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/hash.h>

#include <algorithm>
#include <functional>
#include <limits>

namespace jvpc {

using nlohmann::json;

namespace {

// "x.json" -> "x" + suffix; another name keeps its whole name.
std::string beside(const std::string& graph_path, const char* suffix) {
  const std::string ext = ".json";
  if (graph_path.size() > ext.size() && graph_path.compare(graph_path.size() - ext.size(), ext.size(), ext) == 0)
    return graph_path.substr(0, graph_path.size() - ext.size()) + suffix;
  return graph_path + suffix;
}

}  // namespace

std::string constants_path_for(const std::string& graph_path) { return beside(graph_path, ".safetensors"); }
std::string primal_package_path_for(const std::string& program_path) { return beside(program_path, ".primal.pt2"); }
std::string tangent_package_path_for(const std::string& program_path) { return beside(program_path, ".tangent.pt2"); }

namespace {

std::string basename_of(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}

// SHA-1 of bytes, in hex (c10::sha1 leaves the empty string's state unset).
std::string sha1_hex(const std::string& bytes) {
  return bytes.empty() ? "da39a3ee5e6b4b0d3255bfef95601890afd80709" : c10::sha1(bytes).str();
}

// The constants file of a graph file `j`, checked to be the one saved with it: its size (which
// also bounds the read), then its SHA-1, over the bytes as read. A graph file written before
// jvpc recorded them has neither, and its constants file is read unchecked.
std::unordered_map<std::string, at::Tensor> read_constants(const json& j, const std::string& file,
                                                           const std::string& graph_path) {
  const char* what = "constants file";
  bool has_size = j.contains("constants_size"), has_sha1 = j.contains("constants_sha1");
  if (!has_size && !has_sha1) return read_safetensors(file, what);
  int64_t size = 0;
  std::string sha1;
  try {
    At root{j, "$"};
    if (!has_size || !has_sha1) root.fail("constants_size and constants_sha1 come together");
    size = root["constants_size"].integer();
    if (size < 0) root["constants_size"].fail("expected a size of 0 or more");
    sha1 = root["constants_sha1"].str();
    if (sha1.size() != 40 || sha1.find_first_not_of("0123456789abcdef") != std::string::npos)
      root["constants_sha1"].fail("expected 40 lowercase hex digits");
  } catch (const Error& e) {
    throw Error(printable_path(graph_path) + ": " + e.what());
  }
  std::string bytes = read_regular_file(file, what, size);
  if (static_cast<int64_t>(bytes.size()) != size)
    throw Error(std::string(what) + " " + quoted_path(file) + " has " + std::to_string(bytes.size()) +
                " bytes but the graph file records " + std::to_string(size) + ": the two are not from the same save");
  if (sha1_hex(bytes) != sha1)
    throw Error(std::string(what) + " " + quoted_path(file) +
                " is not the one saved with the graph file (its SHA-1 differs from the one the graph file records)");
  return parse_safetensors(bytes, file, what);
}

/// A stored constant that is a view into a shared 1-D entry of the constants file.
at::Tensor view_of_entry(const TensorMeta& m, const json& view,
                         const std::unordered_map<std::string, at::Tensor>& tensors, const std::string& file,
                         const std::string& name) {
  const std::string& entry = view["tensor"].get_ref<const std::string&>();
  int64_t offset = view["offset"].get<int64_t>();
  auto bad = [&](const std::string& why) {
    return Error(printable_path(file) + ": constant '" + name + "' is a view of '" + entry + "' " + why);
  };
  auto it = tensors.find(entry);
  if (it == tensors.end()) throw bad("but that tensor is missing");
  const at::Tensor& base = it->second;
  if (base.dim() != 1 || base.scalar_type() != m.dtype)
    throw bad("but that tensor is " + TensorMeta::of(base).str() + ", not " + c10::toString(m.dtype) + "[n]");
  // The elements the view reaches (LibTorch's own bound, overflow-checked; the verifier has
  // already refused negative strides).
  size_t needed = 0;
  try {
    needed = at::detail::computeStorageNbytes(m.sizes, m.strides, 1, static_cast<size_t>(offset));
  } catch (const c10::Error&) {
    throw bad("past its end");
  }
  if (offset > base.numel() || needed > static_cast<size_t>(base.numel())) throw bad("past its end");
  return base.as_strided(m.sizes, m.strides, offset);
}

// Refuses a graph over its memory limit before any constant is read: constants by their
// declared sizes, those stored as views into one entry of the constants file counted once, as
// the span of it they reach. The limit is that of the device the graph loads onto and runs on:
// LoadOptions::device, else the one the Executable's check uses (execution_device: that of the
// first non-constant input).
void check_memory_before_loading(const Graph& g, const json& j, const LoadOptions& options) {
  c10::Device target = options.device ? *options.device : execution_device(g);
  if (target.is_cuda() && !at::hasCUDA()) return;  // refused below, before anything runs
  MemoryNeed need = memory_needed(g);
  need.constants = 0;
  auto add = [&](int64_t bytes) {
    need.constants = need.constants > kNoMemoryLimit - bytes ? kNoMemoryLimit : need.constants + bytes;
  };
  std::unordered_map<std::string, int64_t> entries;  // view_of tensor -> bytes its views reach
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Input& in = g.inputs()[i];
    if (in.role != Role::Constant) continue;
    const TensorMeta& m = in.value->meta();
    const json& ji = j["inputs"][i];
    bool view = ji.contains("view_of");
    int64_t bytes = kNoMemoryLimit;
    try {
      size_t n = at::detail::computeStorageNbytes(m.sizes, m.strides, c10::elementSize(m.dtype),
                                                  view ? ji["view_of"]["offset"].get<size_t>() : 0);
      if (n < static_cast<size_t>(kNoMemoryLimit)) bytes = static_cast<int64_t>(n);
    } catch (const c10::Error&) {  // past size_t: over any limit
    }
    if (view) {
      int64_t& e = entries[ji["view_of"]["tensor"].get<std::string>()];
      e = std::max(e, bytes);
    } else {
      add(bytes);
    }
  }
  for (const auto& [name, bytes] : entries) add(bytes);
  check_memory_limit(need, options.max_memory, target, "LoadOptions::max_memory, --max-memory");
}

// A graph's constants as safetensors entries: one per storage. A constant alone in its storage is
// stored as itself. Constants that share a storage (the probabilities as [B,H,S,S] and as
// [B·H,S,S]) become views into one 1-D entry that spans them, named after the first of them, so
// that loading shares the memory again.
struct StoredConstants {
  std::vector<std::pair<std::string, at::Tensor>> entries;
  std::unordered_map<std::string, json> view_of;  // constant name -> {"tensor", "offset"}

  /// Adds "view_of" to the inputs of `graph_json` (to_json's) that are such views.
  void annotate(json& graph_json) const {
    for (json& ji : graph_json["inputs"]) {
      auto it = view_of.find(ji["name"].get<std::string>());
      if (it != view_of.end()) ji["view_of"] = it->second;
    }
  }
};

// What load() refuses is not written: a graph that saves loads back.
void check_savable(const Graph& g, const std::string& path, const SaveOptions& options) {
  if (!options.trusted) check_loadable_ops(g, "cannot save '" + path + "'");
  try {
    check_initialized(g);
  } catch (const Error& e) {
    throw Error("cannot save '" + path + "': " + e.what());
  }
}

StoredConstants stored_constants(const Graph& g) {
  std::vector<std::vector<const Input*>> groups;
  std::unordered_map<const void*, size_t> group_of;
  for (const Input& in : g.inputs()) {
    if (in.role != Role::Constant || !in.data.defined()) continue;
    in.check_unwritten();  // its bytes would not match the other constants'
    const at::Tensor& t = in.data;
    if (in.name == "__metadata__") throw Error("a constant may not be named '__metadata__' (safetensors reserves it)");
    bool shareable = t.has_storage() && t.strides() == c10::IntArrayRef(in.value->meta().strides);
    const void* key = shareable ? static_cast<const void*>(t.storage().unsafeGetStorageImpl()) : &in;
    auto [it, fresh] = group_of.emplace(key, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(&in);
  }
  StoredConstants c;
  for (const auto& group : groups) {
    const at::Tensor& first = group[0]->data;
    bool one_dtype = std::all_of(group.begin(), group.end(),
                                 [&](const Input* in) { return in->data.scalar_type() == first.scalar_type(); });
    // A constant alone in its storage is stored as itself, unless it has gaps or repeats
    // (a step slice, an expand): then, like a group, as the span of storage it reaches.
    bool dense =
        first.is_non_overlapping_and_dense() && first.strides() == c10::IntArrayRef(group[0]->value->meta().strides);
    if ((group.size() == 1 && dense) || !one_dtype) {
      for (const Input* in : group) c.entries.emplace_back(in->name, in->data);
      continue;
    }
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const Input* in : group) {  // the elements [lo, hi) of the storage the group reaches
      const at::Tensor& t = in->data;
      size_t end = t.numel() ? at::detail::computeStorageNbytes(t.sizes(), t.strides(), 1, t.storage_offset())
                             : static_cast<size_t>(t.storage_offset());
      lo = std::min(lo, t.storage_offset());
      hi = std::max(hi, static_cast<int64_t>(end));
    }
    c.entries.emplace_back(group[0]->name, first.as_strided({hi - lo}, {1}, lo));
    for (const Input* in : group)
      c.view_of[in->name] = {{"tensor", group[0]->name}, {"offset", in->data.storage_offset() - lo}};
  }
  return c;
}

// Writes the JSON file `path` that `make_json` gives (from the constants file's name beside it,
// "" when there are no entries) and the constants file. Both are written in full before either
// replaces its destination, the constants first: a failure leaves the previous pair as it was.
void write_with_constants(const std::string& path, const StoredConstants& c,
                          const std::function<json(const std::string&)>& make_json) {
  std::string cpath = c.entries.empty() ? "" : constants_path_for(path);
  if (!cpath.empty()) check_destination(cpath);  // before the graph's temporary file is made
  AtomicFile graph_file(path);
  std::optional<AtomicFile> constants_file;
  std::string constants;
  if (!c.entries.empty()) {
    constants = safetensors_bytes(c.entries);
    constants_file.emplace(cpath);
    constants_file->write(constants);
    constants_file->finish();
  }
  json j = make_json(cpath.empty() ? "" : basename_of(cpath));
  if (!cpath.empty()) {  // load() takes this constants file, and no other, with this graph
    j["constants_size"] = constants.size();
    j["constants_sha1"] = sha1_hex(constants);
  }
  graph_file.write(j.dump(1) + "\n");
  graph_file.finish();
  // Other processes saving to this folder replace their pairs before or after this one, whole;
  // loaders read a pair under a shared lock.
  FolderLock pair(path, /*exclusive=*/true);
  if (constants_file) constants_file->commit();
  graph_file.commit();
}

// A graph from its JSON `j` in the file `path`, under `options`; its stored constants come from
// the constants file that `top` (the file's top-level object) names and checks.
std::unique_ptr<Graph> graph_from_file_json(const json& j, const json& top, const std::string& path,
                                            const LoadOptions& options, const std::string& which = "") {
  const std::optional<c10::Device>& device = options.device;
  std::unique_ptr<Graph> g;
  std::string constants_file;
  try {
    g = checked_from_json(j, options.trusted);  // also checks every "stored" flag and name read below
    check_memory_before_loading(*g, j, options);
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + which + e.what());
  }
  bool stores = false;
  for (const auto& in : j["inputs"])
    if (in.value("stored", false)) {
      stores = true;
      if (!top.contains("constants_file"))
        throw Error(printable_path(path) + ": " + which + "constant '" + in["name"].get<std::string>() +
                    "' is stored but no constants_file is named");
    }
  if (stores) {
    if (!top["constants_file"].is_string()) throw Error(printable_path(path) + ": constants_file must be a string");
    const std::string& named = top["constants_file"].get_ref<const std::string&>();
    constants_file = confined_file_beside(path, named, "constants file");
  }
  std::unordered_map<std::string, at::Tensor> tensors;
  if (!constants_file.empty()) tensors = read_constants(top, constants_file, path);
  std::unordered_map<std::string, Input*> by_name;
  for (Input& x : g->inputs()) by_name[x.name] = &x;
  for (const auto& jin : j["inputs"]) {
    if (!jin.value("stored", false)) continue;
    const std::string& name = jin["name"].get_ref<const std::string&>();
    Input* in = by_name.at(name);
    const TensorMeta& m = in->value->meta();
    in->aliases.clear();  // the graph now holds its own copy, not a view of the caller's input
    if (jin.contains("view_of")) {
      in->bind(view_of_entry(m, jin["view_of"], tensors, constants_file, name));
      continue;
    }
    auto it = tensors.find(name);
    if (it == tensors.end()) throw Error(printable_path(constants_file) + ": constant '" + name + "' is missing");
    TensorMeta got = TensorMeta::of(it->second);
    if (got.sizes != m.sizes || got.dtype != m.dtype)
      throw Error(printable_path(constants_file) + ": constant '" + name + "' is " + got.str() +
                  " but the graph declares " + TensorMeta::contiguous(m.sizes, m.dtype, c10::kCPU).str());
    at::Tensor t = it->second;
    if (!m.is_contiguous()) {
      if (!on_meta(m).is_non_overlapping_and_dense())
        throw Error(printable_path(path) + ": " + which + "constant '" + name + "' declares overlapping strides");
      t = at::empty_strided(m.sizes, m.strides, t.options()).copy_(t);
    }
    in->bind(t);
  }
  try {  // before anything runs, on the CPU: a bad index on CUDA is a device-side assert
    check_index_constants(*g);
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + which + e.what());
  }
  c10::Device target = device ? *device : c10::Device(c10::kCPU);
  if (!device)
    for (const Input& in : g->inputs()) target = in.value->meta().device;  // the graph's own device
  if (!device && target.is_cuda() && !at::hasCUDA())
    throw Error(printable_path(path) + ": the graph is on " + target.str() +
                " but CUDA is not available (load it for the CPU)");
  retarget(*g, target);
  return g;
}

}  // namespace

void save(const Graph& g, const std::string& path, const SaveOptions& options) {
  check_savable(g, path, options);
  StoredConstants c = stored_constants(g);
  write_with_constants(path, c, [&](const std::string& constants_file) {
    json j = to_json(g, constants_file);
    c.annotate(j);
    return j;
  });
}

void save_program(const Graph& primal, const Graph& tangent, size_t primal_outputs, bool exact_strides,
                  const std::vector<std::string>& state_inputs, const std::string& path, const SaveOptions& options) {
  check_savable(primal, path, options);
  check_savable(tangent, path, options);
  for (const Input& in : tangent.inputs())
    if (in.role == Role::Constant && in.data.defined())
      throw Error("cannot save '" + path + "': the tangent graph's constant '" + in.name +
                  "' is bound (a program's residuals are made at each point)");
  if (primal_outputs + state_inputs.size() > primal.outputs().size())
    throw Error("cannot save '" + path + "': too many primal outputs");
  StoredConstants c = stored_constants(primal);
  write_with_constants(path, c, [&](const std::string& constants_file) {
    json j = {{"format", "jvpc-program"}, {"schema_version", kSchemaVersion}};
    if (!constants_file.empty()) j["constants_file"] = constants_file;
    j["primal_outputs"] = primal_outputs;
    j["exact_strides"] = exact_strides;
    if (!state_inputs.empty()) j["state_inputs"] = state_inputs;
    j["primal"] = to_json(primal);
    c.annotate(j["primal"]);
    j["tangent"] = to_json(tangent);
    return j;
  });
}

std::unique_ptr<Graph> load(const std::string& path, std::optional<c10::Device> device) {
  LoadOptions o;
  o.device = device;
  return load(path, o);
}

std::unique_ptr<Graph> load(const std::string& path, const LoadOptions& options) {
  FolderLock pair(path, /*exclusive=*/false);  // the graph file and its constants from one save
  std::string text = read_regular_file(path, "graph file", int64_t{1} << 30);
  json j;
  ReleaseOnExit free_j{j};
  try {
    j = parse_json(text);
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + e.what());
  }
  if (j.is_object() && j.contains("format") && j["format"] == "jvpc-program")
    throw Error(printable_path(path) + ": is a compiled program, not a graph (load it with load_program)");
  return graph_from_file_json(j, j, path, options);
}

ProgramGraphs load_program(const std::string& path, const LoadOptions& options) {
  FolderLock pair(path, /*exclusive=*/false);  // the program file and its constants from one save
  std::string text = read_regular_file(path, "program file", int64_t{1} << 30);
  json j;
  ReleaseOnExit free_j{j};
  ProgramGraphs p;
  try {
    j = parse_json(text);
    At root{j, "$"};
    if (!j.is_object()) root.fail("expected a JSON object");
    if (!root.has("format") || root["format"].str() != "jvpc-program")
      root.fail("format is not \"jvpc-program\" (not a compiled program?)");
    int64_t version = root["schema_version"].integer();
    if (version != kSchemaVersion)
      root.fail("schema_version " + std::to_string(version) + " is not supported (this jvpc reads version " +
                std::to_string(kSchemaVersion) + ")");
    int64_t outputs = root["primal_outputs"].integer();
    if (outputs < 1) root["primal_outputs"].fail("expected 1 or more");
    p.primal_outputs = static_cast<size_t>(outputs);
    p.exact_strides = root["exact_strides"].boolean();
    if (root.has("state_inputs")) {
      At names = root["state_inputs"];
      if (!names.j.is_array()) names.fail("expected a list of primal input names");
      for (size_t i = 0; i < names.j.size(); ++i) p.state_inputs.push_back(names[i].str());
    }
    for (const char* graph : {"primal", "tangent"})
      if (!root[graph].j.is_object()) root[graph].fail("expected an object (a graph)");
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + e.what());
  }
  p.primal = graph_from_file_json(j["primal"], j, path, options, "primal graph: ");
  p.tangent = graph_from_file_json(j["tangent"], j, path, options, "tangent graph: ");
  if (p.primal_outputs + p.state_inputs.size() > p.primal->outputs().size())
    throw Error(printable_path(path) + ": primal_outputs is " + std::to_string(p.primal_outputs) + " and " +
                std::to_string(p.state_inputs.size()) + " state outputs follow, but the primal graph returns " +
                std::to_string(p.primal->outputs().size()) + " values");
  return p;
}

}  // namespace jvpc
