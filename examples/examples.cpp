// Example registry, common flags and the SDPA backend switch.
#include "examples/common.h"

#include "compiler/ir/dtypes.h"
#include "compiler/ir/files.h"

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

std::optional<int64_t> parse_whole_number(const std::string& s) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != s.size()) return std::nullopt;
  return v;
}

CLI::Validator whole_number(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        std::optional<int64_t> v = parse_whole_number(s);
        if (!v || *v < lo || *v > hi)
          return "must be a whole number from " + std::to_string(lo) +
                 (hi == std::numeric_limits<int64_t>::max() ? " up" : " to " + std::to_string(hi)) + ", not '" + s +
                 "'";
        return "";
      },
      hi == std::numeric_limits<int64_t>::max() && lo == 1 ? "POSITIVE" : "INT");
}

namespace {
CLI::Validator real_number(bool non_negative) {
  return CLI::Validator(
      [non_negative](std::string& s) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::out_of_range&) {  // underflow (1e-320) is a number; overflow is not finite
          v = std::strtod(s.c_str(), nullptr);
          used = s.size();
        } catch (const std::exception&) {
          used = std::string::npos;
        }
        if (used != s.size() || !std::isfinite(v)) return "must be a finite number, not '" + s + "'";
        if (non_negative && v < 0) return "must be 0 or more, not '" + s + "'";
        return "";
      },
      non_negative ? "NONNEGATIVE" : "");
}
}  // namespace

const CLI::Validator kPositive = whole_number(1, std::numeric_limits<int64_t>::max());
const CLI::Validator kSeed = whole_number(0, 4294967295LL);
const CLI::Validator kFinite = real_number(false);
const CLI::Validator kNonNegative = real_number(true);
const CLI::Validator kFileName(
    [](std::string& s) -> std::string {
      if (s.empty()) return "expects a file name, not ''";
      // Checked before any work: a file that cannot be written fails now, not after the run.
      try {
        check_destination(s);  // a folder that exists, and no directory, FIFO or device in the way
      } catch (const Error& e) {
        return e.what();
      }
      std::filesystem::path dir = std::filesystem::path(s).parent_path();
      if (dir.empty()) dir = ".";
      if (access(dir.c_str(), W_OK) != 0)
        return "cannot write " + quoted_path(s) + ": directory " + quoted_path(dir.string()) + " is not writable";
      return "";
    },
    "FILE");

void add_common_flags(CLI::App& app, Common& c, bool attention) {
  app.add_option("--bsz", c.bsz, "batch size")->capture_default_str()->check(kPositive);
  app.add_option("--seq-len", c.seq_len, "sequence length")->capture_default_str()->check(kPositive);
  app.add_option("--model-dim", c.model_dim, "model width")->capture_default_str()->check(kPositive);
  app.add_option("--dtype", c.dtype, "float16|bfloat16|float32|float64 (default: float16 on CUDA, float32 on CPU)")
      ->check(CLI::IsMember({"float16", "bfloat16", "float32", "float64"}));
  app.add_option("--device", c.device, "cpu|cuda (default: cuda when present)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--seed", c.seed, "seed of the random inputs")->capture_default_str()->check(kSeed);
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
