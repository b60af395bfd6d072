// Shared pieces of the examples: flags every example takes, and seeded random tensors.
#pragma once

#include "examples/examples.h"
#include "compiler/cli/flags.h"

#include <CLI/CLI.hpp>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace jvpc::examples {

struct Common {
  int64_t bsz = 1;
  int64_t seq_len = 128;
  int64_t model_dim = 320;
  std::string dtype;   // default: float16 on CUDA, float32 on CPU
  std::string device;  // default: cuda when present
  std::string backend = "math";
  uint64_t seed = 0;
};

/// --bsz --seq-len --model-dim --dtype --device --seed (and --backend when `attention`).
void add_common_flags(CLI::App& app, Common& c, bool attention);
/// Parses `args` into `app`; bad flags become jvpc::Error.
void parse(CLI::App& app, const std::string& name, const std::vector<std::string>& args);

/// Resolves dtype, device and backend, and names them in `inst`.
void resolve(const Common& c, Instance& inst);

/// Normal(0, scale) values of `sizes`, drawn on the CPU from `gen` (so every device sees the
/// same numbers), then moved to the instance's dtype and device.
at::Tensor randn(at::Generator& gen, at::IntArrayRef sizes, const Instance& inst, double scale = 1.0);

struct Registration {
  std::string name;
  std::string summary;
  std::function<Instance(const std::vector<std::string>&)> make;
  std::function<std::string()> help;
};
const std::vector<Registration>& registry();

Registration sdpa_example();
Registration mlp_example();
Registration block_example();

}  // namespace jvpc::examples
