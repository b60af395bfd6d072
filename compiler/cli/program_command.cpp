// jvpc compile: trace and compile an example (or a traced graph) into a program, check it at a
// point other than the one it was compiled at against LibTorch's forward AD, and write it.
// jvpc jvp: load a program and run it at given primals and tangents (compiler/api/program.h).
#include "compiler/cli/cli.h"
#include "compiler/cli/linearize_check.h"
#include "compiler/cli/target.h"

#include "compiler/api/program.h"
#include "compiler/api/reference.h"
#include "runtime/aoti_program.h"
#include "ir/cost/kernel_watch.h"
#include "ir/cost/peak_bytes.h"
#include "ir/io/files.h"
#include "ir/ops.h"
#include "ir/io/graph_files.h"
#include "ir/io/safetensors.h"
#include "examples/examples.h"
#include "compiler/cli/flags.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

namespace jvpc::cli {

namespace {

std::string flops_line(const char* what, int64_t flops, const std::string& note) {
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %14lld  (%s; %s)\n", what, static_cast<long long>(flops),
                human_count(flops).c_str(), note.c_str());
  return line;
}

void print_tensor(const std::string& name, const at::Tensor& t) {
  at::Tensor d = t.to(at::kCPU, at::kDouble);
  char line[256];
  std::snprintf(line, sizeof line, "%-10s %-24s sum=% .9e  abs_sum=%.9e\n", name.c_str(),
                TensorMeta::of(t).str().c_str(), d.sum().item<double>(), d.abs().sum().item<double>());
  std::cout << line;
}

// Values like `like`'s, drawn from `gen` (floating: a standard normal step away; others as they are).
std::vector<at::Tensor> moved(const std::vector<at::Tensor>& like, at::Generator& gen) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& v : like) {
    if (!v.is_floating_point()) {
      out.push_back(v);
      continue;
    }
    at::Tensor step = at::randn(v.sizes(), gen, at::TensorOptions().dtype(at::kDouble)).to(v.device(), v.scalar_type());
    at::Tensor x = at::empty_strided(v.sizes(), v.strides(), v.options());
    x.copy_(v + 0.5 * step);
    out.push_back(x);
  }
  return out;
}

}  // namespace

void add_compile(CLI::App& app) {
  struct Opts {
    std::string target, out, device, inputs;
    uint64_t seed = 0;
    std::optional<double> tolerance;
    LimitFlags limits;
    bool trusted = false, loose_strides = false, aoti = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "compile",
      "Compile an example or a traced graph into a program (primal graph + tangent graph) that linearizes at any "
      "point by running the primal graph alone; check it at a new point against LibTorch's forward AD; write it");
  add_target_option(cmd, o->target);
  add_output_option(cmd, o->out, "write the program as JSON (captured tensors beside it in .safetensors)");
  add_inputs_option(cmd, o->inputs,
                    "graph file: safetensors file with the example primals by name (default: x.inputs.safetensors "
                    "beside x.json, written by `jvpc trace -o`, else random)");
  add_seed_option(cmd, o->seed, "seed of the new point and the tangents of the check");
  add_device_option(cmd, o->device);
  add_tolerance_option(cmd, o->tolerance);
  cmd->add_flag("--any-strides", o->loose_strides,
                "accept primals of other strides than the example's (copied into its layout); by default a "
                "program takes exactly the example's strides");
  cmd->add_flag("--trusted", o->trusted, kTrustedHelp);
  cmd->add_flag(
      "--aoti", o->aoti,
      "also write both graphs as AOTInductor packages beside -o's file (p.primal.pt2, p.tangent.pt2: "
      "Inductor's fused kernels, compiled ahead of time, for `jvpc jvp --aoti` and C++'s jvpc::AotiProgram), and "
      "check them at the new point too. Takes seconds to minutes, and jvpc's Python module (the Python: "
      "$JVPC_PYTHON, else the one jvpc was built with)");
  add_max_memory(cmd, o->limits);
  add_max_flops(cmd, o->limits);
  cmd->allow_extras();
  cmd->footer(examples_help());
  cmd->callback([o, cmd] {
    o->limits.check();
    const bool aoti = o->aoti;
    if (aoti && o->out.empty()) throw Error("--aoti writes AOTInductor packages beside the program: give -o FILE");
    Target target = resolve_target({o->target, o->device, o->inputs, o->seed, o->trusted, o->limits}, leftover(*cmd));
    References refs = references_for(target, o->limits);
    if (!o->out.empty()) check_destination(constants_path_for(o->out));
    ProgramOptions po;
    po.exact_strides = !o->loose_strides;
    po.linearize.runtime.max_memory = o->limits.memory();
    const std::string& description = target.description;
    std::vector<at::Tensor> example = target.primal_values();
    // The memory line measures the forward: the example's callable, or the graph with its
    // attention on the math path.
    TensorFn forward;
    if (target.example) {
      forward = target.example->fn();
    } else {
      ExecutableOptions plain = ExecutableOptions::plain();
      plain.max_memory = o->limits.memory();
      auto exe = std::make_shared<Executable>(with_math_attention(*target.graph), plain);
      forward = [exe](const std::vector<at::Tensor>& x) { return exe->run(x); };
    }
    std::optional<Program> prog;
    if (target.is_graph)
      prog.emplace(compile(std::move(target.graph), example, po));
    else
      prog.emplace(compile(target.example->fn(), target.primals, po));
    check_flops(*prog->tangent_graph(), o->limits, "tangent graph");

    // The check: a new point, a seeded step away from the example's, against forward AD there.
    at::Generator gen = at::detail::createCPUGenerator(o->seed + 1);
    std::vector<at::Tensor> x2 = moved(example, gen);
    // One linearization there, its matmul FLOPs counted on the kernels that ran and its peak
    // measured, against the forward's own peak at that point.
    const c10::Device device = x2.empty() ? c10::Device(c10::kCPU) : x2[0].device();
    std::optional<Linearized> at_x2;
    int64_t measured = 0;
    int64_t linearize_peak = measured_peak_bytes(
        [&] {
          KernelWatch watch;
          at_x2.emplace(prog->linearize(x2));
          measured = watch.matmul_flops();
        },
        device);
    Linearized& lin = *at_x2;
    int64_t forward_peak = measured_peak_bytes(
        [&] {
          at::NoGradGuard no_grad;
          forward(x2);
        },
        device);
    std::vector<at::Tensor> tangents;
    std::vector<std::optional<at::Tensor>> ref_tangents(example.size());
    const auto primals = prog->executable().primal_inputs();
    for (const Input* in : lin.jvp_fn->arguments()) {
      const TensorMeta& m = in->value->meta();
      tangents.push_back(at::randn(m.sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(m.device, m.dtype));
      for (size_t i = 0; i < primals.size(); ++i)
        if (primals[i]->name == in->tangent_of) ref_tangents[i] = tangents.back();
    }
    std::vector<at::Tensor> got = lin.jvp(tangents);
    std::vector<at::Tensor> want;
    try {
      // In float16 or bfloat16 the reference runs in float32 on the same values, as linearize's.
      auto ref_dtype = [&](const at::Tensor& v) {
        return refs.in_float32 && c10::isReducedFloatingType(v.scalar_type()) ? v.to(at::kFloat) : v;
      };
      std::vector<at::Tensor> ref_x2;
      for (const at::Tensor& v : x2) ref_x2.push_back(ref_dtype(v));
      for (auto& d : ref_tangents)
        if (d) d = ref_dtype(*d);
      want = forward_ad_jvp(refs.forward_ad, ref_x2, ref_tangents);
    } catch (const std::exception& e) {
      throw Error(std::string("cannot check against LibTorch's forward AD: ") + one_line(e));
    }
    ErrorStats err = compare(got, want);
    double tolerance = o->tolerance ? *o->tolerance : tolerance_for(got);
    bool passed = err.rel_error <= tolerance;

    const GraphCost& primal = prog->primal_cost();
    const GraphCost& tangent = prog->report().tangent;
    std::cout << "jvpc compile " << description << "\n\n"
              << "primal graph  " << primal.nodes << " nodes, "
              << prog->primal_graph().outputs().size() - prog->executable().num_primal_outputs()
              << " residuals; tangent graph " << tangent.nodes << " nodes\n"
              << flops_line("linearize matmul FLOPs", primal.matmul_flops, "cost model of the primal graph")
              << flops_line("", measured, "measured: kernels run by linearize at a new point")
              << flops_line("jvp call matmul FLOPs", tangent.matmul_flops, "cost model of the tangent graph")
              << "residuals     " << human_bytes(tangent.residual_bytes) << " per point, plus "
              << human_bytes(tangent.aliased_input_bytes) << " aliasing the inputs\n"
              << "peak          " << human_bytes(linearize_peak)
              << " allocated at once by linearize at a new point (measured); the forward's own peak "
              << human_bytes(forward_peak) << "\n";
    char line[256];
    std::snprintf(line, sizeof line,
                  "check         at a new point vs LibTorch forward AD: rel_error %.3e, max_abs_error %.3e, "
                  "tolerance %.1e: %s\n",
                  err.rel_error, err.max_abs_error, tolerance, passed ? "PASS" : "FAIL");
    std::cout << line;
    if (!o->out.empty()) {
      SaveOptions so;
      so.trusted = o->trusted;
      prog->save(o->out, so);
      std::cout << "program -> " << o->out << "\n";
    }
    if (aoti) {
      write_aoti_packages(o->out, o->trusted);
      LoadOptions lo;
      lo.trusted = o->trusted;
      AotiProgram packaged(o->out, lo);
      ErrorStats perr = compare(packaged.jvp(packaged.linearize(x2), tangents), want);
      bool ppassed = perr.rel_error <= tolerance;
      std::snprintf(line, sizeof line,
                    "check         AOTInductor packages at the new point vs LibTorch forward AD: rel_error %.3e, "
                    "max_abs_error %.3e: %s\n",
                    perr.rel_error, perr.max_abs_error, ppassed ? "PASS" : "FAIL");
      std::cout << line;
      if (!ppassed) {
        std::snprintf(line, sizeof line,
                      "AOTInductor packages at a new point: rel_error %.3e against LibTorch forward AD is over the "
                      "tolerance %.1e",
                      perr.rel_error, tolerance);
        fail_check(line);
      }
    }
    if (!passed) {
      std::snprintf(line, sizeof line,
                    "at a new point: rel_error %.3e against LibTorch forward AD is over the tolerance %.1e",
                    err.rel_error, tolerance);
      fail_check(line);
    }
  });
}

void add_jvp(CLI::App& app) {
  struct Opts {
    std::string file, device, primals, tangents, out;
    uint64_t seed = 0;
    bool trusted = false, aoti = false;
    LimitFlags limits;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "jvp",
      "Run a program from `jvpc compile -o` at given primals and tangents: linearize there (the primal graph "
      "alone), apply the linear map; print the outputs' and output tangents' shapes and checksums");
  cmd->add_option("program", o->file, "program JSON file")->required();
  cmd->add_option("--primals", o->primals,
                  "safetensors file with a tensor per primal input, by name (default: random)");
  cmd->add_option("--tangents", o->tangents,
                  "safetensors file with a tensor per tangent input, by name (dq, ...; default: random)");
  add_output_option(cmd, o->out, "write the outputs and output tangents, by name, as safetensors");
  add_seed_option(cmd, o->seed, "seed of random primals and tangents");
  cmd->add_option("--device", o->device, "cpu or cuda (moves the program there)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--trusted", o->trusted, kTrustedHelp);
  cmd->add_flag("--aoti", o->aoti,
                "run the AOTInductor packages `jvpc compile --aoti` wrote beside the "
                "program (shared libraries: load only packages you made)");
  add_max_memory(cmd, o->limits);
  add_max_flops(cmd, o->limits);
  cmd->callback([o] {
    o->limits.check();
    const bool aoti = o->aoti;
    if (aoti && !o->device.empty())
      throw Error("--device cannot move AOTInductor packages: each was compiled for its program's device");
    if (!o->out.empty()) check_destination(o->out);
    std::optional<c10::Device> dev;
    if (!o->device.empty()) dev = c10::Device(o->device);
    LoadOptions lo = load_options(dev, o->limits);
    lo.trusted = o->trusted;
    ExecutableOptions eo;
    eo.max_memory = o->limits.memory();
    Program prog = Program::load(o->file, lo, eo);
    check_flops(prog.primal_graph(), o->limits, "primal graph");
    check_flops(*prog.tangent_graph(), o->limits, "tangent graph");
    const Graph& primal = prog.primal_graph();
    std::vector<at::Tensor> x =
        o->primals.empty() ? random_inputs(primal, o->seed) : inputs_from_file(primal, o->primals);
    const Graph& tangent = *prog.tangent_graph();
    std::vector<at::Tensor> t =
        o->tangents.empty() ? random_inputs(tangent, o->seed + 1) : inputs_from_file(tangent, o->tangents);
    std::vector<at::Tensor> primal_outputs, dy;
    int64_t lin_flops = 0, jvp_flops = 0;
    if (aoti) {  // Inductor's kernels, which KernelWatch does not see
      AotiProgram packaged(o->file, lo);
      ProgramExecutable::Point point = packaged.linearize(x);
      primal_outputs = point.primal_outputs;
      dy = packaged.jvp(point, t);
    } else {
      KernelWatch lin_watch;
      Linearized lin = prog.linearize(x);
      lin_flops = lin_watch.matmul_flops();
      primal_outputs = lin.primal_outputs;
      KernelWatch jvp_watch;
      dy = lin.jvp(t);
      jvp_flops = jvp_watch.matmul_flops();
    }
    std::vector<std::pair<std::string, at::Tensor>> written;
    for (size_t i = 0; i < primal_outputs.size(); ++i) {
      print_tensor(primal.output_names()[i], primal_outputs[i]);
      written.emplace_back(primal.output_names()[i], primal_outputs[i].cpu());
    }
    for (size_t i = 0; i < dy.size(); ++i) {
      std::string name = tangent.output_names()[i];
      if (std::any_of(written.begin(), written.end(), [&](const auto& w) { return w.first == name; }))
        name = "d" + name;
      print_tensor(name, dy[i]);
      written.emplace_back(name, dy[i].cpu());
    }
    if (aoti)
      std::cout << "matmul FLOPs           not measured: AOTInductor's kernels; the cost models: linearize "
                << prog.primal_cost().matmul_flops << ", jvp " << prog.report().tangent.matmul_flops << "\n";
    else
      std::cout << flops_line(
                       "linearize matmul FLOPs", lin_flops,
                       "measured; the primal graph's cost model: " + std::to_string(prog.primal_cost().matmul_flops))
                << flops_line("jvp matmul FLOPs", jvp_flops, "measured");
    if (!o->out.empty()) write_safetensors(o->out, written);
  });
}

}  // namespace jvpc::cli
