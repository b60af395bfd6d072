#include "compiler/cli/cli.h"

#include "examples/examples.h"
#include "examples/flags.h"
#include "compiler/ir/files.h"
#include "compiler/ir/serialize.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdlib>

namespace jvpc::cli {

int exit_code = 0;

std::vector<at::Tensor> random_inputs(const Graph& g, uint64_t seed) {
  check_input_size(g);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> out;
  for (const Input& in : g.inputs()) {
    if (in.role == Role::Constant) continue;
    const TensorMeta& m = in.value->meta();
    at::Tensor t;
    if (c10::isFloatingType(m.dtype)) t = at::randn(m.sizes, gen, at::TensorOptions().dtype(at::kDouble));
    else if (m.dtype == c10::kBool) t = at::rand(m.sizes, gen) < 0.8;
    else t = at::zeros(m.sizes, at::TensorOptions().dtype(m.dtype));
    out.push_back(t.to(m.device, m.dtype));
  }
  return out;
}

std::vector<at::Tensor> inputs_from_file(const Graph& g, const std::string& path) {
  auto file = read_safetensors(path, "inputs file");
  std::vector<at::Tensor> out;
  for (const Input& in : g.inputs()) {
    if (in.role == Role::Constant) continue;
    auto it = file.find(in.name);
    if (it == file.end()) throw Error(printable_path(path) + ": no tensor for input '" + in.name + "'");
    out.push_back(it->second.to(in.value->meta().device));
  }
  return out;
}

std::string traced_inputs_path_for(const std::string& graph_path) {
  std::string c = constants_path_for(graph_path);  // "x.safetensors"
  return c.substr(0, c.size() - std::string(".safetensors").size()) + ".inputs.safetensors";
}

void check_input_size(const Graph& g) {
  int64_t limit = 16LL << 30;
  if (const char* env = std::getenv("JVPC_MAX_INPUT_BYTES")) {
    std::optional<int64_t> v = examples::parse_whole_number(env);
    if (!v || *v < 0) throw Error(std::string("JVPC_MAX_INPUT_BYTES='") + env + "' is not a whole number of bytes");
    limit = *v;
  }
  int64_t total = 0;
  for (const Input& in : g.inputs()) {
    if (in.role == Role::Constant) continue;
    int64_t bytes = in.value->meta().nbytes();
    if (bytes > limit - total)
      throw Error("input '" + in.name + "' (" + in.value->meta().str() + ") would take the inputs past " +
                  std::to_string(limit) + " bytes (JVPC_MAX_INPUT_BYTES)");
    total += bytes;
  }
}

std::vector<std::string> leftover(const CLI::App& sub) { return sub.remaining(); }

std::string examples_help() {
  std::string s = "Examples (each takes its own flags, after its name or before it):\n";
  for (const auto& name : examples::names()) {
    s += "\n" + examples::help(name);
  }
  return s;
}

}  // namespace jvpc::cli
