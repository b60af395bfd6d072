#include "runtime/aoti_program.h"

#include "ir/graph.h"
#include "ir/io/files.h"

#include <c10/util/hash.h>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <filesystem>
#include <unordered_set>

namespace jvpc {

namespace {

// The package at `path`, which must name `program_sha1` (the program file's bytes) in its
// metadata: a package left beside a program compiled again is refused, not run.
std::unique_ptr<torch::inductor::AOTIModelPackageLoader> load_package(const std::string& path,
                                                                      const std::string& program_sha1) {
  if (!std::filesystem::is_regular_file(path))
    throw Error("AOTInductor package '" + path + "' not found (written by `jvpc compile --aoti -o`)");
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package;
  try {
    package = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw Error("AOTInductor package '" + path + "': " + what.substr(0, what.find('\n')));
  }
  auto metadata = package->get_metadata();
  auto it = metadata.find("jvpc_program_sha1");  // python/jvpc/_aoti.py, METADATA_KEY
  if (it == metadata.end() || it->second != program_sha1)
    throw Error("AOTInductor package '" + path + "' was " +
                (it == metadata.end() ? "not written by jvpc" : "compiled from another program file") +
                ": write it again (jvpc compile --aoti -o)");
  return package;
}

std::string program_sha1(const std::string& path) {
  return c10::sha1(read_regular_file(path, "program file", int64_t{1} << 30)).str();
}

// The package's results, with any that shares an input's storage copied: a point owns its
// residuals and outputs, as the interpreter's do.
std::vector<at::Tensor> run_package(torch::inductor::AOTIModelPackageLoader& package, const char* graph,
                                    const std::vector<at::Tensor>& inputs, size_t outputs) {
  std::unordered_set<const void*> input_storages;
  for (const at::Tensor& t : inputs)
    if (t.has_storage()) input_storages.insert(t.storage().unsafeGetStorageImpl());
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> outs;
  try {
    outs = package.run(inputs);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw Error(std::string("the AOTInductor package of the ") + graph + " graph does not run this program's " + graph +
                " graph (" + std::to_string(inputs.size()) + " inputs): " + what.substr(0, what.find('\n')));
  }
  if (outs.size() != outputs)
    throw Error(std::string("the AOTInductor package of the ") + graph + " graph returned " +
                std::to_string(outs.size()) + " tensors where the program's " + graph + " graph has " +
                std::to_string(outputs) + " outputs");
  for (at::Tensor& out : outs)
    if (out.has_storage() && input_storages.count(out.storage().unsafeGetStorageImpl())) out = out.clone();
  return outs;
}

}  // namespace

AotiProgram::AotiProgram(const std::string& path, const LoadOptions& options) : exec_(load_program(path, options)) {
  const std::string sha1 = program_sha1(path);
  primal_ = load_package(primal_package_path_for(path), sha1);
  tangent_ = load_package(tangent_package_path_for(path), sha1);
}

AotiProgram::~AotiProgram() = default;

ProgramExecutable::Point AotiProgram::linearize(const std::vector<at::Tensor>& primals) const {
  std::vector<at::Tensor> outs =
      run_package(*primal_, "primal", exec_.primal_graph_inputs(primals), exec_.primal_graph()->outputs().size());
  return exec_.point_from(primals, std::move(outs));
}

std::vector<at::Tensor> AotiProgram::jvp(const ProgramExecutable::Point& point,
                                         const std::vector<at::Tensor>& tangents) const {
  std::vector<at::Tensor> t = point.jvp_fn->checked(tangents), in;
  const std::vector<at::Tensor>& residuals = point.jvp_fn->constants();
  size_t a = 0, c = 0;
  for (const Input& i : exec_.tangent_graph()->inputs())
    in.push_back(i.role == Role::Constant ? residuals[c++] : t[a++]);
  return run_package(*tangent_, "tangent", in, exec_.tangent_graph()->outputs().size());
}

}  // namespace jvpc
