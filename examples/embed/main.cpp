// Runs a compiled tangent graph (from `jvpc linearize sdpa -o tangent.json`), or a compiled
// program (from `jvpc compile sdpa -o prog.json`), in an application that links only the jvpc
// runtime.
//
//   embed tangent.json [calls]
//   embed --program prog.json    linearizes at two random points, each checked against LibTorch's
//                                forward AD of the primal graph's own outputs
//   embed --program prog.json --aoti
//                                the same through the AOTInductor packages beside the program
//                                (from `jvpc compile --aoti -o prog.json`)
#include "ir/io/graph_files.h"
#include "ir/io/safetensors.h"
#include "runtime/aoti_program.h"
#include "runtime/executable.h"
#include "runtime/program.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>

namespace {

// J·t of the primal graph's first `outputs` outputs at x, by LibTorch's forward AD: the primal
// graph run node by node on dual tensors.
std::vector<at::Tensor> forward_ad(jvpc::Executable& primal, size_t outputs, const std::vector<at::Tensor>& x,
                                   const std::vector<std::optional<at::Tensor>>& t) {
  uint64_t level = torch::autograd::forward_ad::enter_dual_level();
  std::vector<at::Tensor> duals;
  for (size_t i = 0; i < x.size(); ++i)
    duals.push_back(t[i] ? at::_make_dual(x[i], *t[i], static_cast<int64_t>(level)) : x[i]);
  std::vector<at::Tensor> outs = primal.run(duals), result;
  for (size_t i = 0; i < outputs; ++i) {
    at::Tensor d = std::get<1>(at::_unpack_dual(outs[i], static_cast<int64_t>(level)));
    result.push_back(d.defined() ? d.clone() : at::zeros_like(outs[i]));
  }
  torch::autograd::forward_ad::exit_dual_level(level);
  return result;
}

// Linearizes the program at two random points and checks each linear map against forward AD.
int run_program(const std::string& path, bool inductor) {
  std::optional<jvpc::AotiProgram> packaged;
  if (inductor) packaged.emplace(path);                    // + prog.primal.pt2, prog.tangent.pt2
  jvpc::ProgramExecutable prog(jvpc::load_program(path));  // captured tensors: prog.safetensors
  jvpc::Executable reference(jvpc::load_program(path).primal, jvpc::ExecutableOptions::plain());
  bool ok = true;
  for (int point = 0; point < 2; ++point) {
    std::vector<at::Tensor> x;
    for (const jvpc::Input* in : prog.primal_inputs()) {
      const jvpc::TensorMeta& m = in->value->meta();
      x.push_back(at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(m.device))
                      .copy_(at::randn(m.sizes, at::TensorOptions().dtype(m.dtype).device(m.device))));
    }
    jvpc::ProgramExecutable::Point p = packaged ? packaged->linearize(x) : prog.linearize(x);
    std::vector<at::Tensor> t;
    std::vector<std::optional<at::Tensor>> per_primal(x.size());
    for (const jvpc::Input* in : p.jvp_fn->arguments()) {
      const jvpc::TensorMeta& m = in->value->meta();
      t.push_back(at::randn(m.sizes, at::TensorOptions().dtype(m.dtype).device(m.device)));
      for (size_t i = 0; i < x.size(); ++i)
        if (prog.primal_inputs()[i]->name == in->tangent_of) per_primal[i] = t.back();
    }
    std::vector<at::Tensor> dy = packaged ? packaged->jvp(p, t) : p.jvp_fn->run(t);
    std::vector<at::Tensor> want = forward_ad(reference, prog.num_primal_outputs(), x, per_primal);
    double num = 0, den = 0;
    for (size_t i = 0; i < dy.size(); ++i) {
      num += (dy[i].to(at::kDouble) - want[i].to(at::kDouble)).pow(2).sum().item<double>();
      den += want[i].to(at::kDouble).pow(2).sum().item<double>();
    }
    double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    bool pass = rel < 1e-5;
    ok &= pass;
    std::cout << "point " << point << ": " << prog.tangent_graph()->output_names()[0] << " : "
              << jvpc::TensorMeta::of(dy[0]).str() << "  rel_error vs forward AD " << rel
              << (packaged ? " (AOTInductor)" : "") << (pass ? "  PASS" : "  FAIL") << "\n";
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: embed tangent.json [calls] | embed --program prog.json [--aoti]\n";
    return 2;
  }
  if (std::string(argv[1]) == "--program") {
    if (argc != 3 && !(argc == 4 && std::string(argv[3]) == "--aoti")) {
      std::cerr << "usage: embed --program prog.json [--aoti]\n";
      return 2;
    }
    try {
      return run_program(argv[2], argc == 4);
    } catch (const std::exception& e) {
      std::cerr << "embed: error: " << e.what() << "\n";
      return 2;
    }
  }
  int calls = 10;
  if (argc > 2) {
    char* end = nullptr;
    long n = std::strtol(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0' || n < 1 || n > 1000000) {
      std::cerr << "embed: error: calls must be a whole number from 1 to 1000000, not '" << argv[2] << "'\n";
      return 2;
    }
    calls = static_cast<int>(n);
  }
  try {
    jvpc::Executable jvp_fn(jvpc::load(argv[1]));  // residuals come from tangent.safetensors
    std::vector<at::Tensor> tangents;
    for (const jvpc::Input* in : jvp_fn.arguments()) {
      const jvpc::TensorMeta& m = in->value->meta();
      tangents.push_back(at::randn(m.sizes, at::TensorOptions().dtype(m.dtype).device(m.device)));
      std::cout << "input " << in->name << " : " << m.str() << "\n";
    }
    std::vector<at::Tensor> out = jvp_fn(tangents);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) out = jvp_fn(tangents);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
    for (size_t i = 0; i < out.size(); ++i)
      std::cout << jvp_fn.graph().output_names()[i] << " : " << jvpc::TensorMeta::of(out[i]).str() << "  sum "
                << out[i].sum().item<double>() << "\n";
    std::cout << "mean time per call: " << us << " us over " << calls << " calls\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "embed: error: " << e.what() << "\n";
    return 2;
  }
}
