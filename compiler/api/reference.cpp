#include "compiler/api/reference.h"
#include "ir/checked_math.h"
#include "ir/op.h"

#include "ir/builder.h"
#include "ir/io/limits.h"
#include "ir/ops.h"
#include "ir/verifier.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace jvpc {

std::vector<at::Tensor> forward_ad_jvp(const TensorFn& fn, const std::vector<at::Tensor>& primals,
                                       const std::vector<std::optional<at::Tensor>>& tangents) {
  if (primals.size() != tangents.size()) throw Error("forward_ad_jvp: one tangent (or none) per primal");
  if (c10::InferenceMode::is_enabled()) throw Error("forward_ad_jvp: forward AD is disabled under InferenceMode");
  uint64_t level = torch::autograd::forward_ad::enter_dual_level();
  struct Exit {
    uint64_t level;
    ~Exit() { torch::autograd::forward_ad::exit_dual_level(level); }
  } exit{level};
  try {
    std::vector<at::Tensor> duals;
    for (size_t i = 0; i < primals.size(); ++i)
      duals.push_back(tangents[i] ? at::_make_dual(primals[i], *tangents[i], static_cast<int64_t>(level)) : primals[i]);
    std::vector<at::Tensor> outs = fn(duals);
    std::vector<at::Tensor> result;
    for (const at::Tensor& o : outs) {
      at::Tensor t = std::get<1>(at::_unpack_dual(o, static_cast<int64_t>(level)));
      result.push_back(t.defined() ? t.clone() : at::zeros_like(o));
    }
    return result;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // LibTorch's errors carry a stack of lines
    throw Error(one_line(e));
  }
}

namespace {

// `x` (contiguous) laid out with the strides `want` declares, when those are a permutation of a
// contiguous layout (the fused kernels return [B, Sq, H, D] memory viewed as [B, H, Sq, D]).
Value* with_layout(Builder& b, Value* x, const TensorMeta& want) {
  if (want.is_contiguous()) return x;
  std::vector<int64_t> order(want.sizes.size());  // dims from outermost to innermost in memory
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return want.strides[a] > want.strides[b]; });
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  Value* dense = b.call(ops::clone, {b.call(ops::permute, {x, order}), c10::MemoryFormat::Contiguous});
  return b.call(ops::permute, {dense, inverse});
}

}  // namespace

std::unique_ptr<Graph> with_math_attention(const Graph& src) {
  std::unique_ptr<Graph> g = src.clone();
  Builder b(*g);
  for (Node* n : g->nodes()) {
    if (!is_fused_attention(n->op())) continue;
    const auto& schema = op_info(n->op()).schema().arguments();
    auto find = [&](const char* name) -> const Arg* {
      for (size_t i = 0; i < schema.size(); ++i)
        if (schema[i].name() == name) return &n->arg(i);
      return nullptr;
    };
    for (size_t i = 1; i < n->outputs().size(); ++i)
      if (n->output(i)->has_uses())  // returning it is a use
        throw Error(n->op() + ": output " + std::to_string(i) + " is read, and the math path does not compute it");
    const Arg* dropout = find("dropout_p");
    if (dropout && dropout->value.isDouble() && dropout->value.toDouble() != 0.0)
      throw Error(n->op() + " with dropout is random");
    Value *q = n->tensor_arg(0), *k = n->tensor_arg(1), *v = n->tensor_arg(2);
    const Arg* causal = find("is_causal");
    bool is_causal = causal && causal->value.isBool() && causal->value.toBool();
    if (is_causal && n->is(ops::_scaled_dot_product_flash_attention) && q->meta().sizes[2] != k->meta().sizes[2])
      throw Error(n->op() +
                  ": causal attention with different query and key lengths is aligned to the bottom right, "
                  "the math path to the top left");
    const Arg* mask = find("attn_mask");
    if (!mask) mask = find("attn_bias");
    BArg m = mask && mask->kind == ArgKind::Tensor ? BArg(n->input(static_cast<size_t>(mask->operands[0])))
                                                   : BArg(std::nullopt);
    const Arg* scale = find("scale");
    BArg sc = scale && !scale->value.isNone() ? BArg(scale->value.toDouble()) : BArg(std::nullopt);
    bool gqa = q->meta().sizes[1] != k->meta().sizes[1];
    InsertionGuard at(*g, n);
    Value* out =
        b.emit(ops::_scaled_dot_product_attention_math, {q, k, v, m, 0.0, is_causal, std::nullopt, sc, gqa})[0];
    n->output(0)->replace_all_uses_with(with_layout(b, out, n->output(0)->meta()));
    at.move_to(nullptr);
    g->erase(n);
  }
  verify(*g);
  return g;
}

std::vector<at::Tensor> central_differences_jvp(const TensorFn& fn, const std::vector<at::Tensor>& primals,
                                                const std::vector<std::optional<at::Tensor>>& tangents, double h) {
  if (primals.size() != tangents.size()) throw Error("central_differences_jvp: one tangent (or none) per primal");
  auto f64 = [](const at::Tensor& t) {
    if (c10::isComplexType(t.scalar_type())) return t.to(at::kComplexDouble);
    return c10::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t;
  };
  std::vector<at::Tensor> plus, minus;
  for (size_t i = 0; i < primals.size(); ++i) {
    at::Tensor x = f64(primals[i]);
    plus.push_back(tangents[i] ? x + h * tangents[i]->to(x.device(), x.scalar_type()) : x);
    minus.push_back(tangents[i] ? x - h * tangents[i]->to(x.device(), x.scalar_type()) : x);
  }
  std::vector<at::Tensor> fp = fn(plus), fm = fn(minus), result;
  for (size_t i = 0; i < fp.size(); ++i)
    result.push_back(differentiable_dtype(fp[i].scalar_type()) ? (fp[i] - fm[i]) / (2 * h)
                                                               : at::zeros_like(fp[i], at::kDouble));
  return result;
}

int64_t forward_ad_bytes_estimate(int64_t input_bytes, int64_t forward_peak_bytes,
                                  const std::vector<int64_t>& attention_score_elements, int64_t element_bytes) {
  // Saturating: an estimate past 2^63 is no-limit large.
  auto add = checked::add_saturating;  // kNoMemoryLimit where it overflows
  auto mul = checked::mul_saturating;
  int64_t total = mul(2, add(input_bytes, forward_peak_bytes));
  for (int64_t scores : attention_score_elements) total = add(total, mul(6, mul(scores, element_bytes)));
  return total;
}

double central_differences_tolerance(c10::ScalarType dtype) { return std::max(tolerance_for(dtype), 1e-7); }

at::Tensor real_pairs(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU);
  if (c10::isComplexType(c.scalar_type())) return at::view_as_real(c.to(at::kComplexDouble).resolve_conj());
  return c.to(at::kDouble);
}

ErrorStats compare(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& reference) {
  if (got.size() != reference.size()) throw Error("compare: different numbers of tensors");
  double diff2 = 0, ref2 = 0, max_abs = 0;
  ErrorStats s;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].sizes() != reference[i].sizes())
      throw Error("compare: tensor " + std::to_string(i) + " has a different shape");
    at::Tensor a = real_pairs(got[i]), b = real_pairs(reference[i]);
    s.nonfinite_got += a.numel() - a.isfinite().sum().item<int64_t>();
    s.nonfinite_reference += b.numel() - b.isfinite().sum().item<int64_t>();
    at::Tensor d = a - b;
    diff2 += d.square().sum().item<double>();
    ref2 += b.square().sum().item<double>();
    if (d.numel()) max_abs = std::max(max_abs, d.abs().max().item<double>());
  }
  s.max_abs_error = max_abs;
  s.rel_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (s.nonfinite_got || s.nonfinite_reference) s.rel_error = s.max_abs_error = std::nan("");
  return s;
}

double tolerance_for(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kDouble:
      return 1e-10;
    case c10::kFloat:
      return 1e-5;
    default:
      return 2e-2;
  }
}

double tolerance_for(const std::vector<at::Tensor>& outputs) {
  double tol = 0;
  for (const at::Tensor& t : outputs)
    if (differentiable_dtype(t.scalar_type()))
      tol = std::max(tol, tolerance_for(c10::toRealValueType(t.scalar_type())));
  return tol > 0 ? tol : tolerance_for(c10::kFloat);
}

}  // namespace jvpc
