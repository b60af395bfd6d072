// The inputs file beside a traced graph (inputs_file.h).
#include "compiler/api/inputs_file.h"

#include "ir/io/files.h"
#include "ir/io/graph_files.h"
#include "ir/io/safetensors.h"

namespace jvpc {

std::string traced_inputs_path_for(const std::string& graph_path) {
  std::string c = constants_path_for(graph_path);  // "x.safetensors"
  return c.substr(0, c.size() - std::string(".safetensors").size()) + ".inputs.safetensors";
}

void save_traced(const Graph& g, const std::string& graph_path, const SaveOptions& options,
                 const std::vector<std::pair<std::string, at::Tensor>>& inputs) {
  check_destination(constants_path_for(graph_path));  // every file it writes, before any is made
  AtomicFile inputs_file(traced_inputs_path_for(graph_path));
  std::vector<std::pair<std::string, at::Tensor>> cpu;
  for (const auto& [name, t] : inputs) cpu.emplace_back(name, t.cpu());
  write_safetensors(inputs_file, cpu);
  inputs_file.finish();
  save(g, graph_path, options);
  inputs_file.commit();
}

}  // namespace jvpc
