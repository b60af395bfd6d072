// Runs a compiled tangent graph (from `jvpc linearize sdpa -o tangent.json`) in an application
// that links only the jvpc runtime.
//
//   embed tangent.json [calls]
#include "compiler/ir/serialize.h"
#include "runtime/executable.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: embed tangent.json [calls]\n";
    return 2;
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
