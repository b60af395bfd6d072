// Example registry, common flags and the SDPA backend switch.
#include "examples/common.h"

#include "ir/dtypes.h"
#include "ir/io/files.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>
#include <limits>

namespace jvpc::examples {

Backend parse_backend(const std::string& s) {
  if (s == "math") return Backend::Math;
  if (s == "flash") return Backend::Flash;
  if (s == "efficient") return Backend::Efficient;
  if (s == "cudnn") return Backend::CuDNN;
  if (s == "auto") return Backend::Auto;
  throw Error("unknown --backend '" + s + "' (math, flash, efficient, cudnn or auto)");
}

BackendScope::BackendScope(Backend b) {
  auto& ctx = at::globalContext();
  flash_ = ctx.userEnabledFlashSDP();
  efficient_ = ctx.userEnabledMemEfficientSDP();
  math_ = ctx.userEnabledMathSDP();
  cudnn_ = ctx.userEnabledCuDNNSDP();
  if (b == Backend::Auto) return;
  ctx.setSDPUseFlash(b == Backend::Flash);
  ctx.setSDPUseMemEfficient(b == Backend::Efficient);
  ctx.setSDPUseMath(b == Backend::Math);
  ctx.setSDPUseCuDNN(b == Backend::CuDNN);
}

BackendScope::~BackendScope() {
  auto& ctx = at::globalContext();
  ctx.setSDPUseFlash(flash_);
  ctx.setSDPUseMemEfficient(efficient_);
  ctx.setSDPUseMath(math_);
  ctx.setSDPUseCuDNN(cudnn_);
}

void add_common_flags(CLI::App& app, Common& c, bool attention) {
  app.add_option("--bsz", c.bsz, "batch size")->capture_default_str()->check(flags::kPositive);
  app.add_option("--seq-len", c.seq_len, "sequence length")->capture_default_str()->check(flags::kPositive);
  app.add_option("--model-dim", c.model_dim, "model width")->capture_default_str()->check(flags::kPositive);
  app.add_option("--dtype", c.dtype, "float16|bfloat16|float32|float64 (default: float16 on CUDA, float32 on CPU)")
      ->check(CLI::IsMember({"float16", "bfloat16", "float32", "float64"}));
  app.add_option("--device", c.device, "cpu|cuda (default: cuda when present)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--seed", c.seed, "seed of the random inputs")->capture_default_str()->check(flags::kSeed);
  if (attention)
    app.add_option("--backend", c.backend,
                   "SDPA kernels allowed: math|flash|efficient|cudnn|auto (efficient and cudnn: CUDA only)")
        ->capture_default_str()
        ->check(CLI::IsMember({"math", "flash", "efficient", "cudnn", "auto"}));
}

void parse(CLI::App& app, const std::string& name, const std::vector<std::string>& args) {
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 takes arguments reversed
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    throw Error("example '" + name + "': " + e.what());
  }
}

void resolve(const Common& c, Instance& inst) {
  std::string device = c.device.empty() ? (at::hasCUDA() ? "cuda" : "cpu") : c.device;
  if (device == "cuda" && !at::hasCUDA()) throw Error("--device cuda: CUDA is not available on this machine");
  inst.device = c10::Device(device);
  std::string dtype = c.dtype.empty() ? (device == "cuda" ? "float16" : "float32") : c.dtype;
  inst.dtype = dtype_from_python_name(dtype);
  inst.backend = parse_backend(c.backend);
  if (device == "cpu" && (inst.backend == Backend::Efficient || inst.backend == Backend::CuDNN))
    throw Error("--backend " + c.backend + ": that SDPA kernel runs on CUDA only (on the CPU: math, flash or auto)");
  inst.description += " " + dtype + " " + device;
}

at::Tensor randn(at::Generator& gen, at::IntArrayRef sizes, const Instance& inst, double scale) {
  at::Tensor t = at::randn(sizes, gen, at::TensorOptions().dtype(at::kDouble));
  if (scale != 1.0) t.mul_(scale);
  return t.to(inst.device, inst.dtype);
}

const std::vector<Registration>& registry() {
  static const std::vector<Registration> r = {sdpa_example(), mlp_example(), block_example()};
  return r;
}

std::vector<std::string> names() {
  std::vector<std::string> n;
  for (const auto& r : registry()) n.push_back(r.name);
  return n;
}

namespace {
const Registration& find(const std::string& name) {
  for (const auto& r : registry())
    if (r.name == name) return r;
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown example '" + name + "' (known: " + known + ")");
}
}  // namespace

Instance make(const std::string& name, const std::vector<std::string>& args) { return find(name).make(args); }

std::string help(const std::string& name) { return find(name).help(); }

std::string summary(const std::string& name) { return find(name).summary; }

}  // namespace jvpc::examples
