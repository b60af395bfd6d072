// jvpc_bench: measures jvpc's linearize and jvp calls on an example, and LibTorch's own forward
// AD in C++, the way scripts/bench/torch_reference.py measures PyTorch. scripts/bench/bench.sh runs
// both and prints the side-by-side table.
//
//   jvpc_bench sdpa [example flags] [--repeats 50] [--warmup 5] [--compile-runs 31] [--json out.json]
//   jvpc_bench sdpa --seq-len 16384 --lean --warmup 1 --repeats 3   (the long-context benchmark)
//
// Compile time: the forward and linearize timed in interleaved pairs (--compile-runs), medians of
// each and of their differences.
//
// Per phase: matmul FLOPs of one execution (counted from the kernels that ran), the median wall
// time (CUDA events on a GPU), and the peak memory allocated during one call above what was
// allocated before it (the CUDA caching allocator's statistics on a GPU; on a CPU, the running
// sum of the profiler's memory events, as the Python side does).
#include "compiler/api/linearize.h"
#include "ir/op.h"
#include "compiler/api/program.h"
#include "compiler/api/reference.h"
#include "ir/cost/kernel_watch.h"
#include "ir/cost/peak_bytes.h"
#include "ir/io/files.h"
#include "ir/io/limits.h"
#include "ir/ops.h"
#include "examples/examples.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#ifdef JVPC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>

namespace {

using nlohmann::json;

bool on_cuda = false;

void sync_device() {
#ifdef JVPC_WITH_CUDA
  if (on_cuda) c10::cuda::getCurrentCUDAStream().synchronize();
#endif
}

// Seconds for one call of fn.
double time_once(const std::function<void()>& fn) {
#ifdef JVPC_WITH_CUDA
  if (on_cuda) {
    at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
    auto stream = c10::cuda::getCurrentCUDAStream();
    start.record(stream);
    fn();
    end.record(stream);
    end.synchronize();
    return start.elapsed_time(end) / 1e3;
  }
#endif
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// As Python's statistics.median: the mean of the two middle values of an even count.
double median(std::vector<double> t) {
  if (t.empty()) return 0.0;
  std::sort(t.begin(), t.end());
  size_t m = t.size() / 2;
  return t.size() % 2 ? t[m] : (t[m - 1] + t[m]) / 2;
}

double median_time(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  sync_device();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(time_once(fn));
  return median(t);
}

// Peak bytes allocated during fn, above what was allocated before it (ir/cost/peak_bytes.h).
int64_t peak_bytes(const std::function<void()>& fn) {
  return jvpc::measured_peak_bytes(fn, on_cuda ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU));
}

int64_t matmul_flops(const std::function<void()>& fn, bool nested = false) {
  jvpc::KernelWatch watch(nested);
  fn();
  return watch.matmul_flops();
}

// The tangents, drawn as the Python side draws them: float64 normals from one CPU generator
// seeded 1, in input order, then cast and moved.
std::vector<at::Tensor> random_like(const std::vector<const jvpc::Input*>& args) {
  at::Generator gen = at::detail::createCPUGenerator(1);
  std::vector<at::Tensor> out;
  for (const jvpc::Input* in : args) {
    const auto& m = in->value->meta();
    out.push_back(at::randn(m.sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(m.device, m.dtype));
  }
  return out;
}

std::string device_name(const c10::Device& d) {
  if (d.is_cuda()) {
#ifdef JVPC_WITH_CUDA
    return at::cuda::getDeviceProperties(d.index() < 0 ? 0 : d.index())->name;
#endif
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "cpu";
}

// The cost model's figures for a tangent graph, as the lean and --jvpc-only outputs give them.
json predicted(const jvpc::GraphCost& c) {
  return {{"jvp_matmul_flops", c.matmul_flops},
          {"residual_bytes", c.residual_bytes},
          {"aliased_input_bytes", c.aliased_input_bytes},
          {"peak_bytes", c.peak_bytes},
          {"workspace_bytes", c.workspace_bytes}};
}

// Prints the measurements and writes them to json_out, if given (whole or not at all).
int print(const json& out, const std::string& json_out) {
  std::cout << out.dump(1) << "\n";
  if (!json_out.empty()) jvpc::write_file_atomically(json_out, out.dump(1) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("jvpc_bench: time and count jvpc's linearize and jvp calls, and LibTorch's forward AD", "jvpc_bench");
  std::string example, json_out, residual_budget;
  int repeats = 50, warmup = 5, fresh = 5, compile_runs = 31;
  bool jvpc_only = false;
  app.add_option("example", example, "sdpa, mlp or block")->required();
  app.add_option("--repeats", repeats, "timed calls per phase (median reported)")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed calls first")->capture_default_str();
  app.add_option("--fresh", fresh, "fresh linearize runs timed (median reported)")->capture_default_str();
  app.add_option("--compile-runs", compile_runs, "interleaved forward and linearize pairs timed (medians reported)")
      ->capture_default_str();
  app.add_option("--json", json_out, "write the measurements as JSON");
  app.add_option("--residual-budget", residual_budget,
                 "jvpc linearize's --residual-budget (attention's P or O(L) form): bytes, 64MiB, 0, inf")
      ->type_name("SIZE");
  app.add_flag("--jvpc-only", jvpc_only,
               "measure jvpc's phases only (no LibTorch forward AD, forward or matmul floor): for long sequences");
  bool lean = false;
  app.add_flag("--lean", lean,
               "one linearize, --warmup untimed and --repeats timed jvp calls, nothing counted or profiled "
               "(scripts/bench/bench.sh --long)");
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    jvpc::examples::Instance ex = jvpc::examples::make(example, app.remaining());
    on_cuda = ex.device.is_cuda();
    std::vector<at::Tensor> primals;
    for (const auto& in : ex.inputs) primals.push_back(in.value);
    jvpc::TensorFn fn = ex.fn();
    json phases;

    // linearize: FLOPs and peak of one run, time as the median of fresh runs.
    jvpc::LinearizeOptions lin_opts;
    if (!residual_budget.empty()) lin_opts.residual_budget = jvpc::parse_size(residual_budget, "--residual-budget");
    auto linearize_once = [&] { return jvpc::linearize(fn, ex.inputs, lin_opts); };
    if (lean) {
      // One linearize, --warmup untimed calls, --repeats timed ones; nothing counted or
      // profiled (the caller measures the process's peak RSS).
      double lin_s = 0;
      std::optional<jvpc::Linearized> l;
      lin_s = time_once([&] { l = linearize_once(); });
      std::cerr << "jvpc_bench: linearized in " << lin_s << " s" << std::endl;
      std::vector<at::Tensor> tangents = random_like(l->jvp_fn->arguments());
      // A line per call: a caller that stops this process still knows how far it got.
      for (int i = 0; i < warmup; ++i)
        std::cerr << "jvpc_bench: warm-up call in " << time_once([&] { l->jvp(tangents); }) << " s" << std::endl;
      std::vector<double> t;
      for (int i = 0; i < repeats; ++i) {
        t.push_back(time_once([&] { l->jvp(tangents); }));
        std::cerr << "jvpc_bench: timed call in " << t.back() << " s" << std::endl;
      }
      json attention = json::array();
      for (const jvpc::AttentionChoice& a : l->report.attention)
        attention.push_back({{"choice", a.o_l_form ? "O(L)" : "P"}, {"reason", a.reason}});
      const jvpc::GraphCost& c = l->report.tangent;
      json out = {{"example", example},      {"config", ex.description}, {"linearize_s", lin_s},     {"jvp_times_s", t},
                  {"jvp_time_s", median(t)}, {"attention", attention},   {"predicted", predicted(c)}};
      return print(out, json_out);
    }
    jvpc::Linearized lin = linearize_once();
    int64_t lin_peak = peak_bytes([&] { linearize_once(); });
    std::vector<double> lin_times;
    for (int i = 0; i < fresh; ++i) lin_times.push_back(time_once([&] { linearize_once(); }));
    phases["linearize"] = {
        {"matmul_flops", lin.report.linearize_matmul_flops}, {"time_s", median(lin_times)}, {"peak_bytes", lin_peak}};

    std::vector<at::Tensor> tangents = random_like(lin.jvp_fn->arguments());
    // A CUDA-graph replay launches the captured kernels without ATen's per-op callbacks, and
    // the capture fires them without running anything. Where jvp_fn replays, FLOPs and peak
    // memory are therefore measured on an eager executable of the same tangent graph: a call
    // executes each kernel once either way (the first call runs eagerly, then captures).
    bool graphed = lin.jvp_fn->cuda_graph_enabled();
    jvpc::Executable eager(lin.tangent_graph, jvpc::ExecutableOptions::eager());
    auto eager_call = [&] { eager.run(tangents); };
    // The first call of a fresh linearization (it captures a CUDA graph on a GPU): FLOPs of one,
    // time as the median of `fresh` others, as the Python side does.
    std::vector<double> first_times;
    int64_t first_flops = 0;
    for (int i = 0; i <= fresh; ++i) {
      jvpc::Linearized l = linearize_once();
      sync_device();
      if (i == 0)
        first_flops = matmul_flops(graphed ? std::function<void()>(eager_call) : [&] { l.jvp(tangents); });
      else
        first_times.push_back(time_once([&] { l.jvp(tangents); }));
    }
    phases["jvp_fn_first"] = {{"matmul_flops", first_flops}, {"time_s", median(first_times)}};
    auto call = [&] { lin.jvp(tangents); };
    call();
    std::function<void()> counted = graphed ? std::function<void()>(eager_call) : call;
    phases["jvp_fn_later"] = {{"matmul_flops", matmul_flops(counted)},
                              {"time_s", median_time(call, warmup, repeats)},
                              {"peak_bytes", peak_bytes(counted)}};

    for (const jvpc::AttentionChoice& a : lin.report.attention)
      phases["attention"].push_back({{"choice", a.o_l_form ? "O(L)" : "P"}, {"reason", a.reason}});
    if (jvpc_only) {
      const jvpc::GraphCost& c = lin.report.tangent;
      json out = {{"example", example}, {"config", ex.description}, {"phases", phases}, {"predicted", predicted(c)}};
      return print(out, json_out);
    }
    // LibTorch's forward AD in C++, on the untraced callable (math backend), and the plain forward.
    std::vector<std::optional<at::Tensor>> ad_tangents(ex.inputs.size());
    {
      size_t k = 0;
      for (size_t i = 0; i < ex.inputs.size(); ++i)
        if (ex.inputs[i].differentiable) ad_tangents[i] = tangents.at(k++);
    }
    jvpc::TensorFn math = ex.make_fn(jvpc::examples::Backend::Math);
    auto forward_ad = [&] { jvpc::forward_ad_jvp(math, primals, ad_tangents); };
    try {  // LibTorch's forward AD has gaps of its own (float16 layer_norm on CUDA): report them
      phases["forward_ad"] = {{"matmul_flops", matmul_flops(forward_ad, /*nested=*/true)},
                              {"time_s", median_time(forward_ad, warmup, repeats)},
                              {"peak_bytes", peak_bytes(forward_ad)}};
    } catch (const std::exception& e) {
      phases["forward_ad"] = {{"unavailable", "failed: " + jvpc::one_line(e)}};
    }
    auto forward = [&] {
      at::NoGradGuard no_grad;
      fn(primals);
    };
    phases["forward"] = {{"matmul_flops", matmul_flops(forward)},
                         {"time_s", median_time(forward, warmup, repeats)},
                         {"peak_bytes", peak_bytes(forward)}};

    // `once` (a linearize) against the forward in interleaved pairs in this process, so that both
    // meet the same machine state: the medians of the forward, of `once` and of their differences.
    struct Paired {
      double forward_s, time_s, minus_forward_s;
    };
    auto paired_with_forward = [&](const std::function<jvpc::Linearized()>& once) {
      std::vector<double> fwd, t, diff;
      for (int i = 0; i < warmup; ++i) {
        forward();
        once();
      }
      for (int i = 0; i < compile_runs; ++i) {
        std::optional<jvpc::Linearized> result;  // freed after the clock stops
        double f = time_once(forward), l = time_once([&] { result = once(); });
        fwd.push_back(f);
        t.push_back(l);
        diff.push_back(l - f);
      }
      return Paired{median(fwd), median(t), median(diff)};
    };

    // Compile time: the linearize call (trace, passes, fold, the executable), as its caller pays it.
    Paired compile = paired_with_forward(linearize_once);
    phases["compile"] = {{"forward_s", compile.forward_s},
                         {"linearize_s", compile.time_s},
                         {"linearize_minus_forward_s", compile.minus_forward_s},
                         {"runs", compile_runs}};

    // Linearize at a new point with a compiled program (compiler/api/program.h): the primal graph
    // alone, against the plain forward in interleaved pairs in this process; its matmul FLOPs
    // counted on the kernels that ran, and its peak beside the forward's and the residuals.
    {
      jvpc::ProgramOptions po;
      po.linearize = lin_opts;
      jvpc::Program prog = jvpc::compile(fn, ex.inputs, po);
      std::vector<at::Tensor> x2;
      for (const at::Tensor& p : primals)
        x2.push_back(
            p.is_floating_point() ? at::empty_strided(p.sizes(), p.strides(), p.options()).copy_(p * 0.5 + 0.25) : p);
      auto prog_once = [&] { return prog.linearize(x2); };
      Paired paired = paired_with_forward(prog_once);
      std::optional<jvpc::Linearized> held;
      phases["program_linearize"] = {{"matmul_flops", matmul_flops([&] { prog_once(); })},
                                     {"predicted_matmul_flops", prog.primal_cost().matmul_flops},
                                     {"time_s", paired.time_s},
                                     {"forward_s", paired.forward_s},
                                     {"minus_forward_s", paired.minus_forward_s},
                                     {"peak_bytes", peak_bytes([&] { held = prog_once(); })},
                                     {"forward_peak_bytes", peak_bytes(forward)},
                                     {"residual_bytes", prog.report().tangent.residual_bytes},
                                     {"runs", compile_runs}};
    }

    // The tangent graph's matrix products alone (cuBLAS or the CPU BLAS, same shapes and dtype):
    // the floor a fused kernel could approach.
    std::vector<std::pair<at::Tensor, at::Tensor>> products;
    for (const jvpc::Node* n : lin.tangent_graph->nodes()) {
      size_t a = n->is(jvpc::ops::bmm) || n->is(jvpc::ops::mm) ? 0 : 1;
      if (!n->is(jvpc::ops::bmm) && !n->is(jvpc::ops::mm) && !n->is(jvpc::ops::baddbmm) && !n->is(jvpc::ops::addmm))
        continue;
      auto operand = [&](size_t i) {
        const auto& m = n->tensor_arg(i)->meta();
        return at::randn(m.sizes, at::TensorOptions().dtype(m.dtype).device(m.device));
      };
      products.emplace_back(operand(a), operand(a + 1));
    }
    auto matmuls_alone = [&] {
      for (const auto& [x, y] : products) (void)(x.dim() == 3 ? at::bmm(x, y) : at::mm(x, y));
    };
    phases["matmuls_alone"] = {{"matmul_flops", matmul_flops(matmuls_alone)},
                               {"time_s", median_time(matmuls_alone, warmup, repeats)},
                               {"kernels", static_cast<int64_t>(products.size())}};

    const jvpc::GraphCost& t = lin.report.tangent;
    json out = {
        {"config", ex.description},
        {"runtime", "jvpc (LibTorch " TORCH_VERSION ")"},
        {"device", device_name(ex.device)},
        {"phases", phases},
        {"residual_bytes", t.residual_bytes},
        {"aliased_input_bytes", t.aliased_input_bytes},
        {"residual_tensors", static_cast<int64_t>(lin.tangent_graph->inputs().size() - lin.jvp_fn->arguments().size())},
        {"predicted",
         {{"jvp_matmul_flops", t.matmul_flops},
          {"jvp_peak_bytes", t.peak_bytes},
          {"jvp_nodes", t.nodes},
          {"cuda_graph", lin.jvp_fn->replaying_cuda_graph()}}},
        {"counted_on", graphed ? "an eager run of the tangent graph (jvp_fn replays a CUDA graph)" : "jvp_fn"}};
    return print(out, json_out);
  } catch (const std::exception& e) {
    std::cerr << "jvpc_bench: error: " << jvpc::one_line(e) << "\n";
    return 2;
  }
}
