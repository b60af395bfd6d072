// jvpc linearize's checks (linearize_check.h).
#include "compiler/cli/linearize_check.h"

#include "ir/cost/cost_model.h"
#include "ir/cost/kernel_watch.h"
#include "ir/ops.h"
#include "ir/io/limits.h"
#include "ir/retarget.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>

namespace jvpc::cli {

References references_for(const Target& t, const LimitFlags& limits) {
  References r;
  if (t.example) {
    r.forward_ad = t.example->make_fn(examples::Backend::Math);
    r.fused = t.example->fn();
    r.in_float32 = c10::isReducedFloatingType(t.example->dtype);
    return r;
  }
  // The same graph, run node by node through the dispatcher on dual tensors, with fused
  // attention on LibTorch's math path (as for an example) and, in float16 or bfloat16, in
  // float32 on the same values (as for an example).
  for (const Input& in : t.graph->inputs()) r.in_float32 |= c10::isReducedFloatingType(in.value->meta().dtype);
  {  // compiled when the check needs it: in float64 it takes twice the graph's memory
    std::shared_ptr<Graph> g = t.graph->clone();
    std::optional<int64_t> max_memory = limits.memory();
    r.fused = [g, max_memory](const std::vector<at::Tensor>& x) {
      std::unique_ptr<Graph> f64 = g->clone();
      retype_floating(*f64, c10::kDouble);
      ExecutableOptions plain = ExecutableOptions::plain();
      plain.max_memory = max_memory;
      return Executable(std::move(f64), plain).run(x);
    };
  }
  try {
    std::unique_ptr<Graph> ref = with_math_attention(*t.graph);
    if (r.in_float32) retype_floating(*ref, c10::kFloat);
    ExecutableOptions plain = ExecutableOptions::plain();
    plain.max_memory = limits.memory();
    auto exe = std::make_shared<Executable>(std::move(ref), plain);
    r.forward_ad = [exe](const std::vector<at::Tensor>& x) { return exe->run(x); };
  } catch (const Error& e) {
    std::string why = e.what();
    r.forward_ad = [why](const std::vector<at::Tensor>&) -> std::vector<at::Tensor> { throw Error(why); };
  }
  return r;
}

Check check(const References& p, const std::vector<std::string>& primal_names, const Linearized& lin,
            const std::vector<at::Tensor>& primal_values, uint64_t seed, std::optional<double> tolerance,
            const std::string& reference, std::optional<int64_t> max_memory) {
  Check c{};
  int64_t input_bytes = 0, element_bytes = 0;
  for (const at::Tensor& v : primal_values) {
    input_bytes += static_cast<int64_t>(v.nbytes());
    if (c10::isFloatingType(v.scalar_type()))
      element_bytes = std::max<int64_t>(element_bytes, p.in_float32 ? 4 : v.element_size());
  }
  std::vector<int64_t> scores;
  for (const AttentionChoice& a : lin.report.attention) scores.push_back(a.score_elements);
  c.forward_ad_bytes = forward_ad_bytes_estimate(input_bytes, lin.report.forward.peak_bytes, scores,
                                                 std::max<int64_t>(element_bytes, 4));
  c.memory_limit = memory_limit_or_default(max_memory, execution_device(*lin.tangent_graph));
  if (reference == "central-differences") {
    c.central_differences = true;
    c.why = "--check-reference central-differences";
  } else if (reference == "auto" && c.forward_ad_bytes > c.memory_limit) {
    c.central_differences = true;
    c.why = "forward AD of the math path would need about " + human_bytes(c.forward_ad_bytes) +
            ", over the memory limit " + human_bytes(c.memory_limit);
  }
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  std::vector<at::Tensor> tangents;
  std::vector<std::optional<at::Tensor>> ref_tangents(primal_names.size());
  for (const Input* in : lin.jvp_fn->arguments()) {
    const TensorMeta& m = in->value->meta();
    at::Tensor t = at::randn(m.sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(m.device, m.dtype);
    tangents.push_back(t);
    for (size_t i = 0; i < primal_names.size(); ++i)
      if (primal_names[i] == in->tangent_of) ref_tangents[i] = t;
  }
  std::vector<at::Tensor> got = lin.jvp(tangents);
  std::vector<at::Tensor> ref;
  if (c.central_differences) {
    try {
      ref = central_differences_jvp(p.fused, primal_values, ref_tangents);
    } catch (const std::exception& e) {
      throw Error(std::string("cannot check against central differences in float64: ") + one_line(e));
    }
    double tol = 0;
    for (const at::Tensor& t : got)
      if (differentiable_dtype(t.scalar_type()))
        tol = std::max(tol, central_differences_tolerance(c10::toRealValueType(t.scalar_type())));
    c.tolerance = tolerance ? *tolerance : (tol > 0 ? tol : central_differences_tolerance(c10::kFloat));
  } else {
    auto ref_dtype = [&](const at::Tensor& t) {
      return p.in_float32 && c10::isReducedFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t;
    };
    std::vector<at::Tensor> ref_primals;
    for (const auto& v : primal_values) ref_primals.push_back(ref_dtype(v));
    for (auto& t : ref_tangents)
      if (t) t = ref_dtype(*t);
    try {
      ref = forward_ad_jvp(p.forward_ad, ref_primals, ref_tangents);
    } catch (const std::exception& e) {
      throw Error(std::string("cannot check against LibTorch's forward AD: ") + one_line(e));
    }
    c.tolerance = tolerance ? *tolerance : tolerance_for(got);
    c.why = reference == "forward-ad" ? "--check-reference forward-ad"
                                      : "it fits: about " + human_bytes(c.forward_ad_bytes) + " of the memory limit " +
                                            human_bytes(c.memory_limit);
  }
  c.err = compare(got, ref);
  c.passed = c.err.rel_error <= c.tolerance;
  return c;
}

BatchedCheck check_batched(const Linearized& lin, int64_t K, uint64_t seed, std::optional<double> tolerance) {
  using clock = std::chrono::steady_clock;
  BatchedCheck b;
  b.K = K;
  const BatchedLinear& fn = lin.batched(K);
  b.unrolled = fn.unrolled;
  b.model_flops = graph_cost(fn.fn->graph()).matmul_flops;
  b.single_flops = lin.report.tangent.matmul_flops;
  at::Generator gen = at::detail::createCPUGenerator(seed + 2);
  std::vector<at::Tensor> tangents;
  for (const Input* in : fn.fn->arguments()) {
    const TensorMeta& m = in->value->meta();
    tangents.push_back(at::randn(m.sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(m.device, m.dtype));
  }
  lin.jvp_batched(K, tangents);  // the first call checks the kernels' results against the graph
  std::vector<at::Tensor> got;
  {
    KernelWatch watch;
    got = lin.jvp_batched(K, tangents);
    b.matmul_flops = watch.matmul_flops();
  }
  auto t0 = clock::now();  // timed apart from the watch, whose callbacks cost time per kernel
  lin.jvp_batched(K, tangents);
  b.ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  std::vector<std::vector<at::Tensor>> per_output(got.size());
  for (int64_t k = 0; k < K; ++k) {
    std::vector<at::Tensor> one;
    for (const at::Tensor& t : tangents) one.push_back(t.select(0, k).contiguous());
    auto t1 = clock::now();
    std::vector<at::Tensor> single = lin.jvp(one);
    if (k == 1 || K == 1) b.single_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
    if (single.size() != got.size())
      throw Error("the batched map gave " + std::to_string(got.size()) + " outputs, not " +
                  std::to_string(single.size()));
    for (size_t i = 0; i < single.size(); ++i) per_output[i].push_back(single[i]);
  }
  std::vector<at::Tensor> want;
  for (const auto& outs : per_output) want.push_back(at::stack(outs));
  ErrorStats err = compare(got, want);
  b.rel_error = err.rel_error;
  b.tolerance = tolerance ? *tolerance : tolerance_for(got);
  b.passed = b.rel_error <= b.tolerance && b.matmul_flops == b.model_flops;
  return b;
}

}  // namespace jvpc::cli
