#include "compiler/cli/cli.h"

#include "examples/examples.h"
#include "compiler/cli/flags.h"
#include "ir/cost/cost_model.h"
#include "ir/io/files.h"
#include "ir/io/limits.h"
#include "ir/io/graph_files.h"
#include "ir/io/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <spawn.h>
#include <unistd.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

namespace jvpc::cli {

int exit_code = 0;

void fail_check(const std::string& what) {
  std::cerr << "jvpc: check failed: " << what << "\n";
  exit_code = 1;
}

extern "C" char** environ;

void write_aoti_packages(const std::string& path, bool trusted) {
  const char* env_python = std::getenv("JVPC_PYTHON");
  std::string python = env_python && *env_python ? env_python : JVPC_BUILD_PYTHON;
  if (python.empty() || (!(env_python && *env_python) && access(python.c_str(), X_OK) != 0))
    python = "python3";  // built elsewhere (a wheel): the Python on PATH
  // The module built beside this CLI comes first on the path (an installed one is found as usual).
  std::vector<std::string> env;
  std::string pythonpath = JVPC_BUILD_PYTHON_PATH;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("PYTHONPATH=", 0) == 0)
      pythonpath += (pythonpath.empty() ? "" : ":") + kv.substr(11);
    else
      env.push_back(kv);
  }
  if (!pythonpath.empty()) env.push_back("PYTHONPATH=" + pythonpath);
  std::vector<std::string> args = {python, "-m", "jvpc._aoti", path};
  if (trusted) args.push_back("--trusted");
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  for (std::string& e : env) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  std::cout.flush();
  pid_t pid = 0;
  if (int err = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), envp.data()))
    throw Error("--aoti: cannot start " + python + " (" + std::strerror(err) +
                "): AOTInductor packages are written by jvpc's Python module; set JVPC_PYTHON to a Python with torch "
                "and jvpc");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error("--aoti: waiting for " + python + ": " + std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("--aoti: " + python + " -m jvpc._aoti " + path + " failed (" +
                (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : "killed") +
                "): see its message above; without jvpc's Python module, set JVPC_PYTHON to a Python with torch and "
                "jvpc");
}

std::vector<at::Tensor> random_inputs(const Graph& g, uint64_t seed) {
  check_input_size(g);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> out;
  for (const Input& in : g.inputs()) {
    if (in.role == Role::Constant) continue;
    const TensorMeta& m = in.value->meta();
    // Drawn in the input's own dtype, so that what is allocated is what check_input_size counted.
    at::TensorOptions dtype = at::TensorOptions().dtype(m.dtype);
    at::Tensor t;
    if (c10::isFloatingType(m.dtype))
      t = at::randn(m.sizes, gen, dtype);
    else if (m.dtype == c10::kBool)
      t = at::empty(m.sizes, dtype).bernoulli_(0.8, gen);
    else
      t = at::zeros(m.sizes, dtype);
    out.push_back(t.to(m.device));
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

void check_input_size(const Graph& g) {
  int64_t limit = 16LL << 30;
  if (const char* env = std::getenv("JVPC_MAX_INPUT_BYTES")) {
    std::optional<int64_t> v = flags::parse_whole_number(env);
    if (!v || *v < 0) throw Error(std::string("JVPC_MAX_INPUT_BYTES='") + env + "' is not a whole number of bytes");
    limit = *v;
  }
  int64_t total = 0;
  for (const Input& in : g.inputs()) {
    if (in.role == Role::Constant) continue;
    const TensorMeta& m = in.value->meta();
    int64_t bytes = m.nbytes();
    // An input for another device is drawn on the CPU first: both copies exist for a moment.
    int64_t room = limit - total;
    if (bytes > (m.device.is_cpu() ? room : room / 2))
      throw Error("input '" + in.name + "' (" + m.str() + ") would take the inputs past " + std::to_string(limit) +
                  " bytes (JVPC_MAX_INPUT_BYTES)" + (m.device.is_cpu() ? "" : ", counting its copy on the CPU"));
    total += bytes;
  }
}

std::optional<int64_t> LimitFlags::memory() const {
  if (!max_memory) return std::nullopt;
  return parse_size(*max_memory, "--max-memory");
}

void add_target_option(CLI::App* cmd, std::string& target, bool required) {
  cmd->add_option("target", target, "an example (sdpa, mlp, block) or a graph .json from `jvpc trace`")
      ->required(required);
}

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "cpu or cuda: where a graph file runs, or the example's --device")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

void add_output_option(CLI::App* cmd, std::string& out, const std::string& help) {
  cmd->add_option("-o,--output", out, help)->check(flags::kFileName);
}

void add_inputs_option(CLI::App* cmd, std::string& inputs, const std::string& help) {
  cmd->add_option("--inputs", inputs, help);
}

void add_seed_option(CLI::App* cmd, uint64_t& seed, const std::string& help) {
  cmd->add_option("--seed", seed, help)->capture_default_str()->check(flags::kSeed);
}

void add_tolerance_option(CLI::App* cmd, std::optional<double>& tolerance) {
  cmd->add_option("--tolerance", tolerance,
                  "largest rel_error that passes (default by dtype: float64 1e-10, float32 1e-5, float16/bfloat16 "
                  "2e-2)")
      ->check(flags::kNonNegative);
}

void add_max_memory(CLI::App* cmd, LimitFlags& flags) {
  cmd->add_option("--max-memory", flags.max_memory,
                  "refuse a graph whose constants, inputs and peak of intermediates (by the cost model) pass SIZE, "
                  "before anything is allocated: bytes, or 64MiB, 2GiB, 1.5G, 10GB, or inf (default: 3/4 of the "
                  "smaller of RAM and the cgroup's memory limit, or of the GPU's memory for --device cuda)")
      ->type_name("SIZE");
}

void add_max_flops(CLI::App* cmd, LimitFlags& flags) {
  cmd->add_option("--max-flops", flags.max_flops,
                  "refuse a graph whose FLOPs by the cost model (matmul and other, as `jvpc cost` counts them) pass N "
                  "(1e15, 2000000, or inf); above 1e12 the count is printed to stderr before the graph runs")
      ->type_name("N")
      ->capture_default_str();
}

double LimitFlags::flops() const {
  if (max_flops == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const char* s = max_flops.c_str();
  double limit = std::strtod(s, &end);
  if (max_flops.empty() || *end != '\0' || !std::isfinite(limit) || limit < 0 ||
      std::isspace(static_cast<unsigned char>(*s)))
    throw Error("--max-flops: '" + max_flops + "' is not a number of FLOPs (such as 1e15 or 2000000, or inf)");
  return limit;
}

LoadOptions load_options(std::optional<c10::Device> device, const LimitFlags& limits) {
  LoadOptions o;
  o.device = device;
  o.max_memory = limits.memory();
  return o;
}

void check_flops(const Graph& g, const LimitFlags& flags, const std::string& what) {
  double limit = flags.flops();
  GraphCost c;
  try {
    c = graph_cost(g);
  } catch (const Error& e) {  // counts past 2^63
    if (std::isinf(limit)) return;
    throw Error(what + " is past any FLOP limit by the cost model (" + e.what() + "), more than --max-flops " +
                flags.max_flops + " allows");
  }
  double flops = static_cast<double>(c.matmul_flops) + static_cast<double>(c.other_flops);
  char count[160];
  std::snprintf(count, sizeof count, "%.0f FLOPs by the cost model (%.3g: matmul %lld, other %lld)", flops, flops,
                static_cast<long long>(c.matmul_flops), static_cast<long long>(c.other_flops));
  if (flops > limit) throw Error(what + " needs " + count + ", more than --max-flops " + flags.max_flops + " allows");
  if (flops > kFlopsWorthSaying) std::cerr << "jvpc: " << what << " costs " << count << "; running it\n";
}

std::vector<std::string> comma_list(const std::string& s, const std::string& flag, bool distinct) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  if (!s.empty() && s.back() == ',') throw Error(flag + " '" + s + "': an empty name");  // getline drops it
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) throw Error(flag + " '" + s + "': an empty name");
    if (distinct && std::find(out.begin(), out.end(), item) != out.end())
      throw Error(flag + " '" + s + "' names '" + item + "' twice");
    out.push_back(item);
  }
  if (out.empty()) throw Error(flag + " '" + s + "' names nothing");
  return out;
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
