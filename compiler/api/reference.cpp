#include "compiler/api/reference.h"

#include "compiler/ir/ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

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

std::vector<at::Tensor> central_differences_jvp(const TensorFn& fn, const std::vector<at::Tensor>& primals,
                                                const std::vector<std::optional<at::Tensor>>& tangents, double h) {
  if (primals.size() != tangents.size()) throw Error("central_differences_jvp: one tangent (or none) per primal");
  auto f64 = [](const at::Tensor& t) { return c10::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t; };
  std::vector<at::Tensor> plus, minus;
  for (size_t i = 0; i < primals.size(); ++i) {
    at::Tensor x = f64(primals[i]);
    plus.push_back(tangents[i] ? x + h * tangents[i]->to(x.device(), at::kDouble) : x);
    minus.push_back(tangents[i] ? x - h * tangents[i]->to(x.device(), at::kDouble) : x);
  }
  std::vector<at::Tensor> fp = fn(plus), fm = fn(minus), result;
  for (size_t i = 0; i < fp.size(); ++i)
    result.push_back(c10::isFloatingType(fp[i].scalar_type()) ? (fp[i] - fm[i]) / (2 * h) : at::zeros_like(fp[i], at::kDouble));
  return result;
}

ErrorStats compare(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& reference) {
  if (got.size() != reference.size()) throw Error("compare: different numbers of tensors");
  double diff2 = 0, ref2 = 0, max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].sizes() != reference[i].sizes()) throw Error("compare: tensor " + std::to_string(i) + " has a different shape");
    at::Tensor a = got[i].detach().to(at::kCPU, at::kDouble), b = reference[i].detach().to(at::kCPU, at::kDouble);
    at::Tensor d = a - b;
    diff2 += d.square().sum().item<double>();
    ref2 += b.square().sum().item<double>();
    if (d.numel()) max_abs = std::max(max_abs, d.abs().max().item<double>());
  }
  ErrorStats s;
  s.max_abs_error = max_abs;
  s.rel_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return s;
}

double tolerance_for(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kDouble: return 1e-10;
    case c10::kFloat: return 1e-5;
    default: return 2e-2;
  }
}

double tolerance_for(const std::vector<at::Tensor>& outputs) {
  double tol = 0;
  for (const at::Tensor& t : outputs)
    if (c10::isFloatingType(t.scalar_type())) tol = std::max(tol, tolerance_for(t.scalar_type()));
  return tol > 0 ? tol : tolerance_for(c10::kFloat);
}

}  // namespace jvpc
