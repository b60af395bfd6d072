// The table of rule cases (rule_cases.h).
#include "tests/rule_cases.h"

#include "tests/helpers.h"

#include "examples/examples.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

namespace jvpc::test {

namespace {

Fn sdpa(examples::Backend b, bool causal, bool mask, bool float_mask = false) {
  return [=](const std::vector<at::Tensor>& x) {
    examples::BackendScope scope(b);
    std::optional<at::Tensor> m;
    if (mask) m = x.at(3).gt(0);        // a boolean mask derived from a tensor
    if (float_mask) m = x.at(3) * 0.5;  // a differentiated float mask
    return std::vector<at::Tensor>{at::scaled_dot_product_attention(x[0], x[1], x[2], m, 0.0, causal)};
  };
}

at::Tensor eye(const at::Tensor& like) {  // the identity, broadcasting against `like`'s last two dims
  return at::eye(like.size(-1), like.options());
}
// aten::cholesky(A, upper=False), through the dispatcher: LibTorch 2.15 has neither the op nor
// at::cholesky (its case is left out there).
at::Tensor legacy_cholesky(const at::Tensor& a) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::cholesky", "").typed<at::Tensor(const at::Tensor&, bool)>();
  return op.call(a, false);
}
Fn cdist(double p) {
  return one([p](auto& x) { return at::cdist(x[0], x[1], p); });
}
Fn distances(double p) {  // cdist as a vector norm of all pairs' differences
  return one([p](auto& x) { return at::linalg_vector_norm(x[0].unsqueeze(-2) - x[1].unsqueeze(-3), p, {-1}); });
}
/// scatter_reduce of src [5, 4] into self [3, 4] along dim 0, rows 0 and 2 receiving two each
/// and row 1 one.
Fn scatter_reduce(std::string reduce, bool include_self) {
  return one([=](auto& x) {
    at::Tensor index = at::tensor({0, 2, 0, 1, 2}, at::kLong).unsqueeze(1).expand({5, 4});
    return x[0].scatter_reduce(0, index, x[1], reduce, include_self);
  });
}
/// linalg_svd's U, S and Vh, each pair of singular vectors signed so that U's first row is positive.
Fn svd(bool full_matrices) {
  return [=](const std::vector<at::Tensor>& x) {
    auto [U, S, Vh] = at::linalg_svd(x[0], full_matrices);
    at::Tensor sign = U.select(-2, 0).sign();  // [.., m or k]
    int64_t k = S.size(-1);
    at::Tensor s_k = sign.narrow(-1, 0, k);
    at::Tensor u_sign = full_matrices ? sign : s_k, vh_sign = s_k.unsqueeze(-1);
    if (full_matrices && Vh.size(-2) > k)
      vh_sign = at::cat({vh_sign, at::ones_like(Vh.select(-1, 0).narrow(-1, k, Vh.size(-2) - k)).unsqueeze(-1)}, -2);
    return std::vector<at::Tensor>{U * u_sign.unsqueeze(-2), S, Vh * vh_sign};
  };
}
/// linalg_svd(full_matrices=true): the first k singular vectors (signed as in svd()), S, and the
/// projector onto the rest (U₂·U₂ᵀ, or V₂·V₂ᵀ for a wide matrix), which is unique.
Fn svd_full_projector() {
  return [](const std::vector<at::Tensor>& x) {
    auto [U, S, Vh] = at::linalg_svd(x[0], true);
    int64_t k = S.size(-1);
    at::Tensor U1 = U.narrow(-1, 0, k), Vh1 = Vh.narrow(-2, 0, k), sign = U1.select(-2, 0).sign();
    at::Tensor rest = U.size(-1) > k
                          ? at::matmul(U.narrow(-1, k, U.size(-1) - k), U.narrow(-1, k, U.size(-1) - k).mT())
                          : at::matmul(Vh.narrow(-2, k, Vh.size(-2) - k).mT(), Vh.narrow(-2, k, Vh.size(-2) - k));
    return std::vector<at::Tensor>{U1 * sign.unsqueeze(-2), S, Vh1 * sign.unsqueeze(-1), rest};
  };
}
/// embedding_bag's sum or mean of each bag's rows (per-sample weighted) by index_select.
Fn bags(at::Tensor indices, std::vector<int64_t> offsets, int64_t mode, bool weighted = false) {
  return one([=](auto& x) {
    std::vector<at::Tensor> out;
    for (size_t b = 0; b < offsets.size(); ++b) {
      int64_t end = b + 1 < offsets.size() ? offsets[b + 1] : indices.numel();
      at::Tensor rows = x[0].index_select(0, indices.slice(0, offsets[b], end));
      if (weighted) rows = rows * x[1].slice(0, offsets[b], end).unsqueeze(1);
      out.push_back(rows.size(0) == 0 ? at::zeros({x[0].size(1)}, x[0].options())
                    : mode == 1       ? rows.mean(0)
                    : mode == 2       ? std::get<0>(rows.max(0))
                                      : rows.sum(0));
    }
    return at::stack(out);
  });
}
Fn embedding_bag(at::Tensor indices, std::vector<int64_t> offsets, int64_t mode, bool weighted = false) {
  return one([=](auto& x) {
    return std::get<0>(at::embedding_bag(x[0], indices, at::tensor(offsets, at::kLong), false, mode, false,
                                         weighted ? std::optional<at::Tensor>(x[1]) : std::nullopt));
  });
}

}  // namespace

Fn one(std::function<at::Tensor(const std::vector<at::Tensor>&)> f) {
  return [f](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{f(x)}; };
}

namespace {

// The tensors of a kernel's tuple of results, as a case's results.
template <class... T>
std::vector<at::Tensor> all_of(const std::tuple<T...>& r) {
  return std::apply([](const auto&... t) { return std::vector<at::Tensor>{t...}; }, r);
}

// A callable of one result that seeds the default generator first: every evaluation draws alike.
Fn seeded(std::function<at::Tensor(const std::vector<at::Tensor>&)> f) {
  return [f](const std::vector<at::Tensor>& x) {
    at::manual_seed(kRandomCaseSeed);
    return std::vector<at::Tensor>{f(x)};
  };
}

}  // namespace

std::vector<RuleCase> cases() {
  using B = examples::Backend;
  std::vector<RuleCase> c = {
      {"aten::add.Tensor", {{3, 4}, {4}}, one([](auto& x) { return at::add(x[0], x[1], 2.5); })},
      {"aten::sub.Tensor", {{3, 4}, {3, 4}}, one([](auto& x) { return at::sub(x[0], x[1], 0.5); })},
      {"aten::add.Scalar", {{5}}, one([](auto& x) { return at::add(x[0], 3.0); })},
      {"aten::sub.Scalar", {{5}}, one([](auto& x) { return at::sub(x[0], 3.0); })},
      {"aten::rsub.Scalar", {{5}}, one([](auto& x) { return at::rsub(x[0], 3.0, 2.0); })},
      {"aten::mul.Tensor", {{3, 4}, {3, 4}}, one([](auto& x) { return x[0] * x[1]; })},
      {"aten::mul.Scalar", {{3, 4}}, one([](auto& x) { return x[0] * 0.7; })},
      {"aten::div.Tensor", {{3, 4}, {3, 4}}, one([](auto& x) { return x[0] / x[1]; }), nullptr, true},
      {"aten::div.Scalar", {{3, 4}}, one([](auto& x) { return x[0] / 3.0; })},
      {"aten::neg", {{6}}, one([](auto& x) { return -x[0]; })},
      {"aten::exp", {{6}}, one([](auto& x) { return x[0].exp(); })},
      {"aten::log", {{6}}, one([](auto& x) { return x[0].log(); }), nullptr, true},
      {"aten::reciprocal", {{6}}, one([](auto& x) { return x[0].reciprocal(); }), nullptr, true},
      {"aten::tanh", {{6}}, one([](auto& x) { return x[0].tanh(); })},
      {"aten::sigmoid", {{6}}, one([](auto& x) { return x[0].sigmoid(); })},
      {"aten::relu", {{6}}, one([](auto& x) { return x[0].relu(); })},
      {"aten::gelu", {{6}}, one([](auto& x) { return at::gelu(x[0]); })},
      {"aten::gelu", {{6}}, one([](auto& x) { return at::gelu(x[0], "tanh"); })},
      {"aten::silu", {{6}}, one([](auto& x) { return at::silu(x[0]); })},
      {"aten::sqrt", {{6}}, one([](auto& x) { return x[0].sqrt(); }), nullptr, true},
      {"aten::rsqrt", {{6}}, one([](auto& x) { return x[0].rsqrt(); }), nullptr, true},
      {"aten::erf", {{6}}, one([](auto& x) { return x[0].erf(); })},
      {"aten::sin", {{6}}, one([](auto& x) { return x[0].sin(); })},
      {"aten::erfc", {{6}}, one([](auto& x) { return x[0].erfc(); })},
      {"aten::erfinv", {{6}}, one([](auto& x) { return (x[0].tanh() * 0.9).erfinv(); })},
      {"aten::lgamma", {{6}}, one([](auto& x) { return x[0].lgamma(); }), nullptr, true},
      {"aten::digamma", {{6}}, one([](auto& x) { return x[0].digamma(); }), nullptr, true},
      {"aten::polygamma", {{6}}, one([](auto& x) { return at::polygamma(2, x[0]); }), nullptr, true},
      {"aten::special_log_ndtr", {{6}}, one([](auto& x) { return at::special_log_ndtr(x[0] * 3); })},
      {"aten::special_ndtri", {{6}}, one([](auto& x) { return at::special_ndtri(x[0].sigmoid()); })},
      {"aten::exp2", {{6}}, one([](auto& x) { return x[0].exp2(); })},
      {"aten::logaddexp", {{6}, {6}}, one([](auto& x) { return at::logaddexp(x[0], x[1]); })},
      {"aten::logaddexp2", {{6}, {6}}, one([](auto& x) { return at::logaddexp2(x[0], x[1]); })},
      {"aten::nan_to_num", {{8}}, one([](auto& x) { return at::nan_to_num(x[0].log(), 0.0, 1.0, -1.0); })},  // NaN where x < 0
      {"aten::nansum", {{2, 8}}, one([](auto& x) { return at::nansum(x[0].log(), {1}); })},
      {"aten::remainder.Tensor", {{6}, {6}}, one([](auto& x) { return at::remainder(x[0] * 3, x[1]); }), nullptr, true},
      {"aten::fmod.Tensor", {{6}, {6}}, one([](auto& x) { return at::fmod(x[0] * 3, x[1]); }), nullptr, true},
      {"aten::div.Tensor_mode", {{6}, {6}}, one([](auto& x) { return at::div(x[0] * 3, x[1], "floor") + x[0]; }), nullptr, true},
      {"aten::special_xlog1py", {{6}, {6}}, one([](auto& x) { return at::special_xlog1py(x[0], x[1]); }), nullptr, true},
      {"aten::sgn", {{6}}, one([](auto& x) { return x[0].sgn() + x[0]; })},
      {"aten::mvlgamma", {{6}}, one([](auto& x) { return at::mvlgamma(x[0] + 2, 3); }), nullptr, true},
      {"aten::remainder.Scalar_Tensor", {{6}}, one([](auto& x) { return at::remainder(2.5, x[0]); }), nullptr, true, 0},  // (no forward AD)
      {"aten::special_xlog1py.self_scalar", {{6}}, one([](auto& x) { return at::special_xlog1py(1.5, x[0]); }), nullptr, true},
      {"aten::special_xlog1py.other_scalar", {{6}}, one([](auto& x) { return at::special_xlog1py(x[0], 0.5); })},
      {"aten::logaddexp", {{4}, {4}}, one([](auto& x) {  // +inf on one side: the other's share is 0, not NaN
         return at::logaddexp(x[0].masked_fill(at::arange(4) == 0, INFINITY), x[1]) * (at::arange(4) != 0) + x[0];
       }), one([](auto& x) { return at::logaddexp(x[0], x[1]) * (at::arange(4) != 0) + x[0]; })},
      {"aten::cos", {{6}}, one([](auto& x) { return x[0].cos(); })},
      {"aten::abs", {{6}}, one([](auto& x) { return x[0].abs(); })},
      {"aten::pow.Tensor_Scalar", {{6}}, one([](auto& x) { return x[0].pow(3); })},
      {"aten::pow.Tensor_Scalar", {{6}}, one([](auto& x) { return x[0].pow(0.5); }), nullptr, true},
      {"aten::where.self", {{4, 4}, {4, 4}}, one([](auto& x) { return at::where(x[0] > x[1], x[0], x[1]); })},
      {"aten::masked_fill.Scalar", {{4, 4}}, one([](auto& x) { return x[0].masked_fill(x[0] > 0, 2.0); })},
      {"aten::_to_copy", {{4}}, one([](auto& x) { return at::_to_copy(x[0], at::kDouble); })},
      {"aten::clone", {{4}}, one([](auto& x) { return x[0].clone(); })},
      {"aten::tril", {{4, 4}}, one([](auto& x) { return x[0].tril(); })},
      {"aten::triu", {{4, 4}}, one([](auto& x) { return x[0].triu(1); })},
      {"aten::sum", {{3, 4}}, one([](auto& x) { return x[0].sum(); })},
      {"aten::sum.dim_IntList", {{3, 4}}, one([](auto& x) { return x[0].sum(-1, true); })},
      {"aten::mean", {{3, 4}}, one([](auto& x) { return x[0].mean(); })},
      {"aten::mean.dim", {{3, 4}}, one([](auto& x) { return x[0].mean(0); })},
      {"aten::mm", {{3, 5}, {5, 4}}, one([](auto& x) { return at::mm(x[0], x[1]); })},
      {"aten::bmm", {{2, 3, 5}, {2, 5, 4}}, one([](auto& x) { return at::bmm(x[0], x[1]); })},
      {"aten::addmm", {{4}, {3, 5}, {5, 4}}, one([](auto& x) { return at::addmm(x[0], x[1], x[2], 0.5, 2.0); })},
      {"aten::baddbmm", {{2, 3, 4}, {2, 3, 5}, {2, 5, 4}}, one([](auto& x) { return at::baddbmm(x[0], x[1], x[2], 1.5, 0.5); })},
      {"aten::addmm", {{4}, {3, 5}, {5, 4}}, one([](auto& x) { return at::addmm(x[0], x[1], x[2]); })},  // alpha 1: bias first
      {"aten::baddbmm", {{3, 4}, {2, 3, 5}, {2, 5, 4}}, one([](auto& x) { return at::baddbmm(x[0], x[1], x[2], 2.0); })},
      {"aten::addbmm", {{3, 4}, {2, 3, 5}, {2, 5, 4}}, one([](auto& x) { return at::addbmm(x[0], x[1], x[2], 0.5, 2.0); })},
      {"aten::addbmm", {{4}, {2, 3, 5}, {2, 5, 4}}, one([](auto& x) { return at::addbmm(x[0], x[1], x[2]); })},
      {"aten::addmv", {{3}, {3, 5}, {5}}, one([](auto& x) { return at::addmv(x[0], x[1], x[2], 2.0, 0.5); })},
      {"aten::addr", {{3, 5}, {3}, {5}}, one([](auto& x) { return at::addr(x[0], x[1], x[2], 1.0, -1.5); })},
      // (LibTorch has no forward AD for cdist's kernels; the reference is a norm of the differences)
      {"aten::_cdist_forward", {{2, 4, 3}, {2, 5, 3}}, cdist(2.0), distances(2.0)},
      {"aten::_cdist_forward", {{2, 1, 4, 3}, {3, 5, 3}}, cdist(2.0), distances(2.0)},  // batch broadcast
      {"aten::_cdist_forward", {{4, 3}, {5, 3}}, cdist(1.0), distances(1.0)},
      {"aten::_cdist_forward", {{4, 3}, {5, 3}}, cdist(3.0), distances(3.0)},
      {"aten::_cdist_forward", {{2, 4, 3}, {2, 5, 3}}, cdist(INFINITY), distances(INFINITY)},
      {"aten::_cdist_forward", {{4, 3}, {5, 3}}, cdist(0.5), distances(0.5)},
      {"aten::_euclidean_dist", {{30, 3}, {26, 3}}, cdist(2.0), distances(2.0)},  // over 25 rows
      {"aten::_euclidean_dist", {{2, 30, 3}, {26, 3}}, cdist(2.0), distances(2.0)},
      // solves and factorizations, on matrices kept well conditioned (+ 3I) or positive definite
      {"aten::linalg_inv_ex", {{3, 3}}, one([](auto& x) { return at::linalg_inv(x[0] + 3 * eye(x[0])); })},
      {"aten::linalg_inv_ex", {{2, 3, 3}}, one([](auto& x) { return at::linalg_inv(x[0] + 3 * eye(x[0])); })},
      {"aten::_linalg_solve_ex", {{3, 3}, {3, 2}}, one([](auto& x) { return at::linalg_solve(x[0] + 3 * eye(x[0]), x[1]); })},
      {"aten::_linalg_solve_ex", {{2, 3, 3}, {3}}, one([](auto& x) { return at::linalg_solve(x[0] + 3 * eye(x[0]), x[1]); })},
      {"aten::_linalg_solve_ex", {{3, 3}, {2, 3}}, one([](auto& x) {  // X·A = B
         return at::linalg_solve(x[0] + 3 * eye(x[0]), x[1], /*left=*/false);
       })},
      {"aten::_linalg_solve_ex", {{3, 3}, {3, 4}}, one([](auto& x) { return at::linalg_solve(x[0].detach() + 3 * eye(x[0]), x[1]); }),
       nullptr, false, 99, false},  // A not differentiated (differences see through detach)
      {"aten::_linalg_det", {{3, 3}}, one([](auto& x) { return at::linalg_det(x[0].mT()); })},  // factored as it is
      {"aten::linalg_solve_triangular", {{3, 3}, {3, 2}}, one([](auto& x) { return at::linalg_solve_triangular(x[0] + 3 * eye(x[0]), x[1], true); })},
      {"aten::linalg_solve_triangular", {{3, 3}, {2, 3}}, one([](auto& x) {
         return at::linalg_solve_triangular(x[0] + 3 * eye(x[0]), x[1], /*upper=*/false, /*left=*/false);
       })},
      {"aten::linalg_solve_triangular", {{2, 3, 3}, {2, 3, 2}}, one([](auto& x) {
         return at::linalg_solve_triangular(x[0], x[1], /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
       })},
      {"aten::_linalg_det", {{3, 3}}, one([](auto& x) { return at::linalg_det(x[0]); })},
      {"aten::_linalg_det", {{2, 4, 4}}, one([](auto& x) { return at::linalg_det(x[0]); })},
      {"aten::_linalg_slogdet", {{3, 3}}, one([](auto& x) { return std::get<1>(at::linalg_slogdet(x[0])); })},
      {"aten::_linalg_slogdet", {{3, 3}}, one([](auto& x) { return std::get<1>(at::linalg_slogdet(x[0].mT())); })},
      {"aten::_linalg_slogdet", {{2, 3, 3}}, one([](auto& x) { return at::logdet(x[0].matmul(x[0].mT()) + eye(x[0])); })},
      {"aten::linalg_cholesky_ex", {{3, 3}}, one([](auto& x) { return at::linalg_cholesky(x[0].matmul(x[0].mT()) + 3 * eye(x[0])); })},
      {"aten::linalg_cholesky_ex", {{2, 3, 3}}, one([](auto& x) {
         return at::linalg_cholesky(x[0].matmul(x[0].mT()) + 3 * eye(x[0]), /*upper=*/true);
       })},
      {"aten::linalg_matrix_exp", {{3, 3}}, one([](auto& x) { return at::linalg_matrix_exp(x[0] * 0.5); })},
      {"aten::linalg_matrix_exp", {{2, 4, 4}}, one([](auto& x) { return at::matrix_exp(x[0].mT()); })},
      {"aten::cholesky", {{3, 3}}, one([](auto& x) { return legacy_cholesky(x[0].matmul(x[0].mT()) + 3 * eye(x[0])); }),
       one([](auto& x) { return at::linalg_cholesky(x[0].matmul(x[0].mT()) + 3 * eye(x[0])); })},  // (no forward AD for the legacy op)
      {"aten::cholesky_solve", {{3, 2}, {3, 3}}, one([](auto& x) {
         return at::cholesky_solve(x[0], at::linalg_cholesky(x[1].matmul(x[1].mT()) + 3 * eye(x[1])));
       })},
      {"aten::cholesky_solve", {{2, 3, 2}, {3, 3}}, one([](auto& x) {  // upper, a triangle the op reads alone
         return at::cholesky_solve(x[0], x[1].triu(1) + 3 * eye(x[1]) + x[1].tril(-1) * 5, /*upper=*/true);
       }), one([](auto& x) {  // (LibTorch's forward AD takes the whole matrix's tangent: the reference masks it)
         return at::cholesky_solve(x[0], x[1].triu(1) + 3 * eye(x[1]), /*upper=*/true);
       })},
      {"aten::cholesky_solve", {{2, 2}, {2, 2, 2}}, one([](auto& x) {  // b broadcast against a batch of factors:
         return at::cholesky_solve(x[0], x[1].tril() + 3 * eye(x[1]));  // LibTorch's forward AD is wrong here
       }), nullptr, false, /*ad_outputs=*/0},                             // (pytorch#196694)
      {"aten::linalg_lstsq", {{2, 5, 3}, {1, 5, 2}}, [](auto& x) {  // broadcast batch, gelss
         auto r = at::linalg_lstsq(x[0], x[1], std::nullopt, "gelss");
         return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r)};
       }},
      {"aten::_linalg_eigh", {{4, 4}}, [](auto& x) {
         auto r = at::linalg_eigh(x[0] + x[0].mT());
         return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r) * std::get<1>(r).select(-2, 0).sign().unsqueeze(-2)};
       }},
      {"aten::_linalg_eigh", {{2, 3, 3}}, one([](auto& x) { return at::linalg_eigvalsh(x[0] + x[0].mT(), "U"); })},
      // singular vectors up to sign: the references fix each pair's sign by U's first row
      {"aten::_linalg_svd", {{4, 3}}, svd(false)},
      {"aten::_linalg_svd", {{3, 5}}, svd(false)},
      {"aten::_linalg_svd", {{2, 3, 3}}, svd(true)},
      // full_matrices: the extra columns of U (rows of Vᵀ) keep the basis orthogonal; LibTorch gives
      // them 0, so their projector is checked against central differences only
      {"aten::_linalg_svd", {{4, 3}}, svd_full_projector(), nullptr, false, /*ad_outputs=*/3},
      {"aten::_linalg_svd", {{2, 3, 5}}, svd_full_projector(), nullptr, false, /*ad_outputs=*/3},
      {"aten::_linalg_svd", {{4, 3}}, one([](auto& x) { return at::linalg_svdvals(x[0]); })},  // no vectors computed
      {"aten::_linalg_svd", {{2, 3, 5}}, one([](auto& x) { return at::linalg_matrix_norm(x[0], "nuc"); })},
      {"aten::linalg_pinv.atol_rtol_tensor", {{4, 3}}, one([](auto& x) { return at::linalg_pinv(x[0]); })},
      {"aten::linalg_pinv.atol_rtol_tensor", {{2, 3, 5}}, one([](auto& x) { return at::linalg_pinv(x[0]); })},
      {"aten::linalg_qr", {{4, 3}}, [](auto& x) { auto [q, r] = at::linalg_qr(x[0]); return std::vector<at::Tensor>{q, r}; }},
      {"aten::linalg_qr", {{2, 3, 5}}, [](auto& x) { auto [q, r] = at::linalg_qr(x[0]); return std::vector<at::Tensor>{q, r}; }},
      {"aten::linalg_qr", {{3, 3}}, [](auto& x) { auto [q, r] = at::linalg_qr(x[0], "complete"); return std::vector<at::Tensor>{q, r}; }},
      {"aten::linalg_qr", {{5, 3}}, one([](auto& x) { return std::get<1>(at::linalg_qr(x[0], "r")); }),  // (LibTorch refuses mode 'r')
       nullptr, false, /*ad_outputs=*/0},
      {"aten::linalg_lu_factor_ex", {{3, 3}}, one([](auto& x) { return std::get<0>(at::linalg_lu_factor(x[0])); })},
      {"aten::linalg_lu_factor_ex", {{2, 4, 4}}, one([](auto& x) { return std::get<0>(at::linalg_lu_factor(x[0])); })},
      {"aten::linalg_lu_factor_ex", {{5, 3}}, one([](auto& x) { return std::get<0>(at::linalg_lu_factor(x[0])); })},
      {"aten::linalg_lu_factor_ex", {{2, 3, 5}}, one([](auto& x) { return std::get<0>(at::linalg_lu_factor(x[0])); })},
      {"aten::linalg_lu", {{5, 3}}, [](auto& x) { auto [p, l, u] = at::linalg_lu(x[0]); return std::vector<at::Tensor>{l, u}; }},
      {"aten::linalg_lu", {{2, 3, 5}}, [](auto& x) { auto [p, l, u] = at::linalg_lu(x[0]); return std::vector<at::Tensor>{l, u}; }},
      {"aten::linalg_lstsq", {{5, 3}, {5, 2}}, one([](auto& x) { return std::get<0>(at::linalg_lstsq(x[0], x[1])); })},
      {"aten::linalg_lstsq", {{2, 5, 3}, {2, 5}}, one([](auto& x) { return std::get<0>(at::linalg_lstsq(x[0], x[1])); })},  // vector b
      {"aten::linalg_lstsq", {{5, 3}, {5, 2}}, [](auto& x) {  // gelsd: residuals and singular values too
         auto r = at::linalg_lstsq(x[0], x[1], std::nullopt, "gelsd");
         return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r), std::get<3>(r)};
       }, nullptr, false, /*ad_outputs=*/2},  // (LibTorch's singular values have no tangent)
      // (LibTorch's forward AD of cholesky_inverse is wrong, pytorch#196682: the references invert L·Lᵀ)
      {"aten::linalg_lu_solve", {{3, 3}, {3, 2}}, one([](auto& x) {  // through LU and B
         auto [LU, piv] = at::linalg_lu_factor(x[0] + 3 * eye(x[0]));
         return at::linalg_lu_solve(LU, piv, x[1]);
       })},
      {"aten::linalg_lu_solve", {{2, 4, 4}, {2, 3, 4}}, one([](auto& x) {  // through B alone
         auto [LU, piv] = at::linalg_lu_factor(x[0].detach() + 3 * eye(x[0]));
         return at::linalg_lu_solve(LU, piv, x[1], /*left=*/false, /*adjoint=*/true);
       }), nullptr, false, 99, /*central_differences=*/false},
      {"aten::lu_unpack", {{4, 3}}, [](auto& x) {
         auto [LU, piv] = at::linalg_lu_factor(x[0]);
         auto [P, L, U] = at::lu_unpack(LU, piv);
         return std::vector<at::Tensor>{L, U};
       }},
      // lstsq and pinv that drop a small singular value (rcond, rtol): the tangent is that of the
      // truncated problem (LibTorch's differentiates the full one: differences only)
      {"aten::linalg_lstsq", {{5, 3}, {5, 2}}, one([](auto& x) {
         at::Tensor a = x[0] * at::tensor({1.0, 1.0, 0.0}, at::kDouble) + 1e-9 * x[0];
         return std::get<0>(at::linalg_lstsq(a, x[1], 1e-3, "gelsd"));
       }), nullptr, false, /*ad_outputs=*/0},
      {"aten::linalg_lstsq", {{5, 2}, {5, 2}}, one([](auto& x) {  // rank-deficient (gelsd: no residuals then)
         return std::get<0>(at::linalg_lstsq(at::cat({x[0], x[0].narrow(1, 0, 1)}, 1), x[1], 1e-3, "gelsd"));
       }), nullptr, false, /*ad_outputs=*/0},
      {"aten::linalg_pinv.atol_rtol_tensor", {{4, 4}}, one([](auto& x) {  // hermitian: the lower triangle
         return at::linalg_pinv(x[0], std::optional<at::Tensor>(), std::optional<at::Tensor>(), /*hermitian=*/true);
       }), nullptr, false, /*ad_outputs=*/0},  // (LibTorch's forward AD takes the whole tangent)
      {"aten::linalg_pinv.atol_rtol_tensor", {{5, 3}}, one([](auto& x) {
         at::Tensor a = x[0] * at::tensor({1.0, 1.0, 0.0}, at::kDouble) + 1e-9 * x[0];
         return at::linalg_pinv(a, std::nullopt, at::scalar_tensor(1e-3, at::kDouble));
       }), nullptr, false, /*ad_outputs=*/0},
      {"aten::cholesky_inverse", {{3, 3}}, one([](auto& x) { return at::cholesky_inverse(x[0].tril() + 3 * eye(x[0])); }),
       one([](auto& x) { at::Tensor l = x[0].tril() + 3 * eye(x[0]); return at::linalg_inv(l.matmul(l.mT())); })},
      {"aten::cholesky_inverse", {{2, 3, 3}}, one([](auto& x) {  // upper, a triangle the op reads alone
         return at::cholesky_inverse(x[0] + 3 * eye(x[0]), /*upper=*/true);
       }), one([](auto& x) { at::Tensor u = x[0].triu() + 3 * eye(x[0]); return at::linalg_inv(u.mT().matmul(u)); })},
      // scatter_reduce: sums and means linear; amax and amin the tangents of the extremes
      {"aten::scatter_reduce.two", {{3, 4}, {5, 4}}, scatter_reduce("sum", false)},
      {"aten::scatter_reduce.two", {{3, 4}, {5, 4}}, scatter_reduce("mean", true)},
      {"aten::scatter_reduce.two", {{3, 4}, {5, 4}}, scatter_reduce("amax", true)},
      {"aten::scatter_reduce.two", {{3, 4}, {5, 4}}, scatter_reduce("amin", false)},
      {"aten::scatter_reduce.two", {{3, 4}, {2, 4}}, one([](auto& x) {  // ties: each row twice into one
         at::Tensor index = at::tensor({0, 0, 2, 2}, at::kLong).unsqueeze(1).expand({4, 4});
         return x[0].scatter_reduce(0, index, at::cat({x[1], x[1]}), "amax", false);
       })},
      {"aten::scatter_reduce.two", {{3, 4}, {5, 6}}, one([](auto& x) {  // an index smaller than src
         at::Tensor index = at::tensor({0, 2, 0, 1}, at::kLong).unsqueeze(1).expand({4, 3});
         return x[0].scatter_reduce(0, index, x[1], "amin", true);
       }), nullptr, false, /*ad_outputs=*/0},  // (LibTorch's forward AD fails on this shape)
      {"aten::index_fill.int_Scalar", {{4, 3}}, one([](auto& x) { return x[0].index_fill(0, at::tensor({0, 2}, at::kLong), 2.0); })},
      {"aten::index_fill.int_Tensor", {{4, 3}, {}}, one([](auto& x) { return x[0].index_fill(0, at::tensor({0, 2}, at::kLong), x[1]); })},
      {"aten::linalg_cross", {{4, 3}, {4, 3}}, one([](auto& x) { return at::linalg_cross(x[0], x[1]); })},
      {"aten::_euclidean_dist", {{30, 3}}, one([](auto& x) { return at::cdist(x[0], x[0]).clamp_min(1e-3); }),  // one set: one matmul
       one([](auto& x) { return at::linalg_vector_norm(x[0].unsqueeze(-2) - x[0].unsqueeze(-3), 2, {-1}).clamp_min(1e-3); })},
      {"aten::dot", {{5}, {5}}, one([](auto& x) { return at::dot(x[0], x[1]); })},
      {"aten::mv", {{3, 5}, {5}}, one([](auto& x) { return at::mv(x[0], x[1]); })},
      {"aten::convolution", {{2, 3, 6, 6}, {4, 3, 3, 3}, {4}}, one([](auto& x) { return at::conv2d(x[0], x[1], x[2], 1, 1); })},
      {"aten::convolution", {{2, 3, 9}, {5, 3, 3}}, one([](auto& x) { return at::conv1d(x[0], x[1], {}, 2); })},
      {"aten::convolution", {{2, 4, 5, 5}, {6, 2, 3, 3}, {6}}, one([](auto& x) { return at::conv2d(x[0], x[1], x[2], 1, 1, 1, 2); })},
      {"aten::convolution", {{2, 3, 4, 4}, {3, 5, 3, 3}, {5}}, one([](auto& x) {
         return at::conv_transpose2d(x[0], x[1], x[2], 2, 1, 1);
       })},
      {"aten::convolution", {{1, 2, 5, 6, 7}, {3, 2, 2, 3, 3}}, one([](auto& x) { return at::conv3d(x[0], x[1], {}, 1, 1, 2); })},
      {"aten::as_strided", {{2, 3, 4, 4}}, one([](auto& x) {  // squeeze-and-excitation on channels-last
         at::Tensor cl = x[0].contiguous(at::MemoryFormat::ChannelsLast);
         return cl * at::adaptive_avg_pool2d(cl, {1, 1});
       })},
      {"aten::as_strided", {{4, 6}}, one([](auto& x) { return (x[0] * 2).as_strided({3, 4}, {4, 1}); })},
      {"aten::native_group_norm", {{2, 4, 3, 3}}, one([](auto& x) {  // channels-last; LibTorch's
         return at::group_norm(x[0].contiguous(at::MemoryFormat::ChannelsLast), 2);  // forward AD fails there: the
       }), one([](auto& x) { return at::group_norm(x[0], 2); })},                  // reference runs contiguous
      {"aten::view", {{3, 4}}, one([](auto& x) { return x[0].view({2, 6}); })},
      {"aten::view", {{3, 4}}, one([](auto& x) { return x[0].t().reshape({12}); })},
      {"aten::expand", {{3, 1}}, one([](auto& x) { return x[0].expand({2, 3, 4}); })},
      {"aten::transpose.int", {{2, 3, 4}}, one([](auto& x) { return x[0].transpose(0, 2); })},
      {"aten::t", {{3, 4}}, one([](auto& x) { return x[0].t(); })},
      {"aten::permute", {{2, 3, 4}}, one([](auto& x) { return x[0].permute({2, 0, 1}); })},
      {"aten::unsqueeze", {{3, 4}}, one([](auto& x) { return x[0].unsqueeze(1); })},
      {"aten::squeeze.dim", {{3, 1, 4}}, one([](auto& x) { return x[0].squeeze(1); })},
      {"aten::select.int", {{3, 4}}, one([](auto& x) { return x[0].select(1, 2); })},
      {"aten::slice.Tensor", {{6, 4}}, one([](auto& x) { return x[0].slice(0, 1, 5, 2); })},
      {"aten::split.Tensor", {{6, 4}}, [](auto& x) { auto p = x[0].split(2, 0); return std::vector<at::Tensor>(p.begin(), p.end()); }},
      {"aten::unbind.int", {{3, 4}}, [](auto& x) { auto p = x[0].unbind(1); return std::vector<at::Tensor>(p.begin(), p.end()); }},
      {"aten::cat", {{2, 4}, {3, 4}}, one([](auto& x) { return at::cat({x[0], x[1]}, 0); })},
      {"aten::stack", {{2, 4}, {2, 4}}, one([](auto& x) { return at::stack({x[0], x[1]}, 1); })},
      {"aten::index_select", {{5, 4}}, one([](auto& x) { return x[0].index_select(0, at::tensor({4, 0, 2}, at::kLong)); })},
      {"aten::index_select", {{}}, one([](auto& x) { return x[0].index_select(0, at::tensor({0}, at::kLong)); })},  // 0-dim
      {"aten::fmax", {{3, 4}, {4}}, one([](auto& x) { return at::fmax(x[0], x[1]); })},
      {"aten::fmin", {{3, 4}, {4}}, one([](auto& x) { return at::fmin(x[0], x[1]); })},
      {"aten::cummax", {{3, 5}}, one([](auto& x) { return std::get<0>(at::cummax(x[0], 1)); })},
      {"aten::cummin", {{3, 5}}, one([](auto& x) { return std::get<0>(at::cummin(x[0], 0)); })},
      {"aten::copysign.Tensor", {{3, 4}, {4}}, one([](auto& x) { return at::copysign(x[0], x[1]); })},
      {"aten::deg2rad", {{6}}, one([](auto& x) { return at::deg2rad(x[0]); })},
      {"aten::rad2deg", {{6}}, one([](auto& x) { return at::rad2deg(x[0]); })},
      {"aten::ldexp.Tensor", {{3, 4}, {4}}, one([](auto& x) { return at::ldexp(x[0], x[1]); })},
      {"aten::i0", {{6}}, one([](auto& x) { return at::i0(x[0]); })},
      {"aten::frexp.Tensor", {{6}}, one([](auto& x) { return std::get<0>(at::frexp(x[0] * 5)); })},
      {"aten::dist", {{3, 4}, {3, 4}}, one([](auto& x) { return at::dist(x[0], x[1]); })},
      {"aten::dist", {{3, 4}, {4}}, one([](auto& x) { return at::dist(x[0], x[1], 1.5); })},  // broadcast
      {"aten::dist", {{3, 4}, {3, 4}}, one([](auto& x) { return at::dist(x[0], x[1], INFINITY); })},
      {"aten::dist", {{4}, {3, 4}}, one([](auto& x) { return at::dist(x[0], x[1], 1); })},
      {"aten::vdot", {{5}, {5}}, one([](auto& x) { return at::vdot(x[0], x[1]); })},
      {"aten::block_diag", {{2, 3}, {1, 2}}, one([](auto& x) { return at::block_diag({x[0], x[1]}); })},
      {"aten::alias_copy", {{4}}, one([](auto& x) { return at::alias_copy(x[0]); })},
      {"aten::copysign.Scalar", {{6}}, one([](auto& x) { return at::copysign(x[0], -1.5); })},
      {"aten::median", {{3, 4}}, one([](auto& x) { return x[0].median(); })},
      {"aten::nanmedian", {{3, 4}}, one([](auto& x) { return x[0].nanmedian(); })},
      {"aten::_trilinear", {{3, 4}, {3, 5}, {2, 4, 5}}, one([](auto& x) { return at::bilinear(x[0], x[1], x[2]); })},
      {"aten::max_pool2d_with_indices_backward", {{1, 2, 2, 2}, {1, 2, 4, 4}}, one([](auto& x) {
         at::Tensor idx = std::get<1>(at::max_pool2d_with_indices(x[1], {2, 2}, {2, 2}));
         return at::max_pool2d_with_indices_backward(x[0], x[1], {2, 2}, {2, 2}, {0, 0}, {1, 1}, false, idx);
       })},
      {"aten::max_pool3d_with_indices_backward", {{1, 2, 1, 2, 2}, {1, 2, 2, 4, 4}}, one([](auto& x) {
         at::Tensor idx = std::get<1>(at::max_pool3d_with_indices(x[1], {2, 2, 2}, {2, 2, 2}));
         return at::max_pool3d_with_indices_backward(x[0], x[1], {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, false, idx);
       })},
      {"aten::rsub.Tensor", {{3, 4}, {4}}, one([](auto& x) { return at::rsub(x[0], x[1], 2.0); })},
      {"aten::alias", {{3, 4}}, one([](auto& x) { return at::alias(x[0]) * 2.0; })},
      {"aten::detach", {{3, 4}}, one([](auto& x) { return x[0].detach() * x[0]; }), nullptr, false, 99, false},
      {"aten::fill.Scalar", {{3, 4}}, one([](auto& x) { return x[0].clone().fill_(2.0) * x[0]; })},
      {"aten::zero", {{3, 4}}, one([](auto& x) { return x[0].clone().zero_() + x[0]; })},
      {"aten::copy", {{3, 4}, {4}}, one([](auto& x) { return x[0].clone().copy_(x[1]) * x[0]; })},
      {"aten::diagonal", {{3, 4, 5}}, one([](auto& x) { return x[0].diagonal(1, 0, 2); })},
      {"aten::squeeze", {{3, 1, 4, 1}}, one([](auto& x) { return x[0].squeeze(); })},
      {"aten::squeeze.dims", {{3, 1, 4, 1}}, one([](auto& x) { return x[0].squeeze({1, 3}); })},
      {"aten::split_with_sizes", {{6, 4}}, [](auto& x) { auto p = x[0].split_with_sizes({2, 4}, 0); return std::vector<at::Tensor>(p.begin(), p.end()); }},
      {"aten::unsafe_split.Tensor", {{4, 6}}, [](auto& x) { auto p = x[0].unsafe_chunk(3, 1); return std::vector<at::Tensor>(p.begin(), p.end()); }},
      {"aten::unsafe_split_with_sizes", {{6, 4}}, [](auto& x) {
         auto p = at::unsafe_split_with_sizes(x[0], {1, 5}, 0);
         return std::vector<at::Tensor>(p.begin(), p.end());
       }},
      {"aten::unfold", {{7, 3}}, one([](auto& x) { return x[0].unfold(0, 3, 2); })},
      {"aten::repeat", {{2, 3}}, one([](auto& x) { return x[0].repeat({2, 1, 2}); })},
      {"aten::flip", {{3, 4}}, one([](auto& x) { return x[0].flip({0, 1}); })},
      {"aten::roll", {{3, 4}}, one([](auto& x) { return x[0].roll({1, -2}, {0, 1}); })},
      {"aten::gather", {{3, 4}}, one([](auto& x) { return x[0].gather(1, at::tensor({0, 3, 3, 1, 2, 0}, at::kLong).view({3, 2})); })},
      {"aten::index.Tensor", {{5, 4}}, one([](auto& x) { return x[0].index({at::tensor({4, 0, 4}, at::kLong)}); })},
      {"aten::index.Tensor", {{5, 4, 3}}, one([](auto& x) {  // indices [None, i, j]: absent entries
         return x[0].index({at::indexing::Slice(), at::tensor({3, 0}, at::kLong), at::tensor({2, 1}, at::kLong)});
       })},
      {"aten::where.self", {{4, 4}}, one([](auto& x) { return at::where(x[0] > 0, x[0], 0.0); })},  // where.ScalarOther
      {"aten::where.self", {{4, 4}}, one([](auto& x) { return at::where(x[0] > 0, 0.5, x[0].sin()); })},  // where.ScalarSelf
      {"aten::masked_fill.Tensor", {{3, 4}, {}}, one([](auto& x) { return x[0].masked_fill(x[0] > 0, x[1]); })},
      {"aten::masked_fill.Tensor", {{3, 4}}, one([](auto& x) { return x[0].masked_fill(x[0] > 0, at::scalar_tensor(2.0, at::kDouble)); })},
      {"aten::zeros_like", {{3, 4}}, one([](auto& x) { return at::zeros_like(x[0]).add_(x[0]).mul_(x[0]); })},
      {"aten::ones_like", {{3, 4}}, one([](auto& x) { return at::ones_like(x[0]) * x[0]; })},
      {"aten::empty_like", {{3, 4}}, one([](auto& x) { return at::empty_like(x[0]).copy_(x[0].sin()); })},
      {"aten::full_like", {{3, 4}}, one([](auto& x) { return at::full_like(x[0], 2.0) * x[0]; })},
      {"aten::new_zeros", {{3, 4}}, one([](auto& x) { return x[0].new_zeros({4}) + x[0]; })},
      {"aten::new_ones", {{3, 4}}, one([](auto& x) { return x[0].new_ones({4}) * x[0]; })},
      {"aten::new_empty", {{3, 4}}, one([](auto& x) { return x[0].new_empty({4}).fill_(3.0) * x[0]; })},
      {"aten::new_full", {{3, 4}}, one([](auto& x) { return x[0].new_full({4}, 3.0) * x[0]; })},
      // Random ops: each evaluation seeds the generator, so that the trace, forward AD and every
      // difference see the same draw (the map is for one draw). Their tangent is zero; dropout's
      // passes the input's through its mask.
      {"aten::rand_like", {{3, 4}}, seeded([](auto& x) { return x[0] * at::rand_like(x[0]); })},
      {"aten::randn_like", {{3, 4}}, seeded([](auto& x) { return x[0] * at::randn_like(x[0]); })},
      {"aten::bernoulli", {{3, 4}}, seeded([](auto& x) { return x[0] * at::bernoulli(x[0].sigmoid()); })},
      // LibTorch has no forward AD of bernoulli.p: central differences only.
      {"aten::bernoulli.p", {{3, 4}}, seeded([](auto& x) { return x[0] * at::bernoulli(x[0], 0.3); }), nullptr, false, 0},
      {"aten::bernoulli.Tensor", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().bernoulli_(x[0].sigmoid()); })},
      {"aten::uniform", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().uniform_(-1, 1); })},
      {"aten::normal_functional", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().normal_(); })},
      {"aten::exponential", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().exponential_(); })},
      {"aten::geometric", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().geometric_(0.5); })},
      {"aten::log_normal", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().log_normal_(); })},
      {"aten::cauchy", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().cauchy_(); })},
      {"aten::random", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().random_().remainder(5); })},
      {"aten::random.to", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().random_(5); })},
      {"aten::random.from", {{3, 4}}, seeded([](auto& x) { return x[0] * x[0].clone().random_(-2, 5); })},
      {"aten::native_dropout", {{3, 4}}, seeded([](auto& x) { return std::get<0>(at::native_dropout(x[0], 0.4, true)); })},
      {"aten::diagonal_copy", {{4, 4}}, one([](auto& x) { return x[0].diag(); })},
      {"aten::expand_copy", {{3, 1}}, one([](auto& x) { return at::expand_copy(x[0], {3, 4}); })},
      {"aten::permute_copy", {{2, 3, 4}}, one([](auto& x) { return at::permute_copy(x[0], {2, 0, 1}); })},
      {"aten::transpose_copy.int", {{2, 3, 4}}, one([](auto& x) { return at::transpose_copy(x[0], 0, 2); })},
      {"aten::select_copy.int", {{3, 4}}, one([](auto& x) { return at::select_copy(x[0], 1, 2); })},
      {"aten::slice_copy.Tensor", {{6, 4}}, one([](auto& x) { return at::slice_copy(x[0], 0, 1, 5, 2); })},
      {"aten::index.Tensor", {{3, 4}}, one([](auto& x) { return x[0].index({x[0] > 0}); })},  // a bool mask
      {"aten::embedding", {{6, 4}}, one([](auto& x) { return at::embedding(x[0], at::tensor({5, 0, 2, 5}, at::kLong).view({2, 2})); })},
      {"aten::_fused_rms_norm", {{2, 3, 8}, {8}}, one([](auto& x) { return at::rms_norm(x[0], {8}, x[1], 1e-6); })},
      {"aten::_fused_rms_norm", {{2, 3, 4}}, one([](auto& x) { return at::rms_norm(x[0], {3, 4}); })},
      {"aten::nll_loss_forward", {{3, 5}}, one([](auto& x) {
         return at::nll_loss(x[0].log_softmax(1), at::tensor({1, 0, 4}, at::kLong));
       })},
      {"aten::nll_loss_forward", {{4, 5}}, one([](auto& x) {  // sum, a class weight, an ignored index
         return at::nll_loss(x[0], at::tensor({1, 0, 4, 2}, at::kLong), at::tensor({1.0, 2.0, 0.5, 1.0, 3.0}, at::kDouble),
                             at::Reduction::Sum, 2);
       })},
      // activations
      {"aten::mish", {{6}}, one([](auto& x) { return at::mish(x[0]); })},
      {"aten::hardswish", {{6}}, one([](auto& x) { return at::hardswish(x[0] * 3.0); })},
      {"aten::hardsigmoid", {{6}}, one([](auto& x) { return at::hardsigmoid(x[0] * 3.0); })},
      {"aten::hardtanh", {{6}}, one([](auto& x) { return at::hardtanh(x[0], -0.5, 0.5); })},
      {"aten::softplus", {{6}}, one([](auto& x) { return at::softplus(x[0], 2.0, 1.0); })},
      {"aten::logit", {{6}}, one([](auto& x) { return at::logit(x[0].sigmoid()); })},
      {"aten::logit", {{6}}, one([](auto& x) { return at::logit(x[0].sigmoid(), 0.3); })},
      {"aten::leaky_relu", {{6}}, one([](auto& x) { return at::leaky_relu(x[0], 0.2); })},
      {"aten::elu", {{6}}, one([](auto& x) { return at::elu(x[0], 1.5, 1.2, 0.8); })},
      {"aten::log_sigmoid_forward", {{6}}, one([](auto& x) { return at::log_sigmoid(x[0]); })},
      {"aten::softshrink", {{6}}, one([](auto& x) { return at::softshrink(x[0], 0.3); })},
      {"aten::hardshrink", {{6}}, one([](auto& x) { return at::hardshrink(x[0], 0.3); })},
      {"aten::threshold", {{6}}, one([](auto& x) { return at::threshold(x[0], 0.1, -2.0); })},
      {"aten::celu", {{6}}, one([](auto& x) { return at::celu(x[0], 1.5); })},
      {"aten::_prelu_kernel", {{2, 3, 4}, {3}}, one([](auto& x) { return at::prelu(x[0], x[1]); })},
      {"aten::glu", {{3, 8}}, one([](auto& x) { return at::glu(x[0], 1); })},
      {"aten::glu", {{4, 3}}, one([](auto& x) { return at::glu(x[0], 0); })},
      // math functions
      {"aten::sinh", {{6}}, one([](auto& x) { return x[0].sinh(); })},
      {"aten::cosh", {{6}}, one([](auto& x) { return x[0].cosh(); })},
      {"aten::atan", {{6}}, one([](auto& x) { return x[0].atan(); })},
      {"aten::tan", {{6}}, one([](auto& x) { return (x[0] * 0.5).tan(); })},
      {"aten::asin", {{6}}, one([](auto& x) { return (x[0] * 0.3).asin(); })},
      {"aten::acos", {{6}}, one([](auto& x) { return (x[0] * 0.3).acos(); })},
      {"aten::asinh", {{6}}, one([](auto& x) { return x[0].asinh(); })},
      {"aten::acosh", {{6}}, one([](auto& x) { return (x[0] + 1.0).acosh(); }), nullptr, true},
      {"aten::atanh", {{6}}, one([](auto& x) { return (x[0] * 0.3).atanh(); })},
      {"aten::log1p", {{6}}, one([](auto& x) { return x[0].log1p(); }), nullptr, true},
      {"aten::expm1", {{6}}, one([](auto& x) { return x[0].expm1(); })},
      {"aten::log2", {{6}}, one([](auto& x) { return x[0].log2(); }), nullptr, true},
      {"aten::log10", {{6}}, one([](auto& x) { return x[0].log10(); }), nullptr, true},
      {"aten::remainder.Scalar", {{6}}, one([](auto& x) { return at::remainder(x[0], 0.7); })},
      {"aten::fmod.Scalar", {{6}}, one([](auto& x) { return at::fmod(x[0], 0.7); })},
      {"aten::frac", {{6}}, one([](auto& x) { return (x[0] * 3.0).frac(); })},
      {"aten::sign", {{6}}, one([](auto& x) { return x[0].sign() * x[0]; })},
      {"aten::floor", {{6}}, one([](auto& x) { return (x[0] * 3.0).floor() * x[0]; })},
      {"aten::ceil", {{6}}, one([](auto& x) { return (x[0] * 3.0).ceil() * x[0]; })},
      {"aten::round", {{6}}, one([](auto& x) { return (x[0] * 3.0).round() * x[0]; })},
      {"aten::trunc", {{6}}, one([](auto& x) { return (x[0] * 3.0).trunc() * x[0]; })},
      {"aten::pow.Tensor_Tensor", {{3, 4}, {4}}, one([](auto& x) { return at::pow(x[0], x[1]); }), nullptr, true},
      {"aten::pow.Scalar", {{6}}, one([](auto& x) { return at::pow(2.5, x[0]); })},
      {"aten::addcmul", {{3, 4}, {3, 4}, {4}}, one([](auto& x) { return at::addcmul(x[0], x[1], x[2], 0.5); })},
      {"aten::addcdiv", {{3, 4}, {3, 4}, {4}}, one([](auto& x) { return at::addcdiv(x[0], x[1], x[2], 0.5); }), nullptr, true},
      {"aten::lerp.Scalar", {{3, 4}, {3, 4}}, one([](auto& x) { return at::lerp(x[0], x[1], 0.3); })},
      {"aten::lerp.Tensor", {{3, 4}, {3, 4}, {4}}, one([](auto& x) { return at::lerp(x[0], x[1], x[2]); })},
      {"aten::atan2", {{3, 4}, {3, 4}}, one([](auto& x) { return at::atan2(x[0], x[1]); })},
      {"aten::hypot", {{3, 4}, {3, 4}}, one([](auto& x) { return at::hypot(x[0], x[1]); })},
      {"aten::xlogy.Tensor", {{3, 4}, {3, 4}}, one([](auto& x) { return at::xlogy(x[0], x[1]); }), nullptr, true},
      {"aten::xlogy.Tensor", {{3, 4}, {3, 4}}, one([](auto& x) {  // x = 0 in places, its tangent not
         return at::xlogy(x[0] - x[0].detach() * (x[0] < 1.0), x[1]);
       }), nullptr, true, 99, false},
      // selection
      {"aten::clamp", {{3, 4}}, one([](auto& x) { return at::clamp(x[0], -0.5, 0.7); })},
      {"aten::clamp", {{3, 4}}, one([](auto& x) { return at::clamp(x[0], std::nullopt, 0.2); })},
      {"aten::clamp_min", {{3, 4}}, one([](auto& x) { return at::clamp_min(x[0], 0.1); })},
      {"aten::clamp_max", {{3, 4}}, one([](auto& x) { return at::clamp_max(x[0], 0.1); })},
      {"aten::clamp.Tensor", {{3, 4}, {4}, {3, 4}}, one([](auto& x) { return at::clamp(x[0], x[1], x[2]); })},  // some min > max
      {"aten::clamp.Tensor", {{3, 4}, {3, 4}}, one([](auto& x) { return at::clamp(x[0], std::nullopt, x[1]); })},
      {"aten::clamp_min.Tensor", {{3, 4}, {4}}, one([](auto& x) { return at::clamp_min(x[0], x[1]); })},
      {"aten::clamp_max.Tensor", {{3, 4}, {4}}, one([](auto& x) { return at::clamp_max(x[0], x[1]); })},
      {"aten::maximum", {{3, 4}, {4}}, one([](auto& x) { return at::maximum(x[0], x[1]); })},
      {"aten::minimum", {{3, 4}, {3, 4}}, one([](auto& x) { return at::minimum(x[0], x[1]); })},
      {"aten::maximum", {{3, 4}}, one([](auto& x) { return at::maximum(x[0], x[0].flip(0).round()); })},
      {"aten::max.dim", {{3, 4}}, [](auto& x) { auto r = x[0].max(1); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::min.dim", {{3, 4}}, [](auto& x) { auto r = x[0].min(0, true); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::sort", {{3, 5}}, [](auto& x) { auto r = x[0].sort(0, true); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::sort.stable", {{3, 5}}, [](auto& x) { auto r = x[0].sort(std::optional<bool>(true), -1); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::topk", {{3, 5}}, [](auto& x) { auto r = x[0].topk(2); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::amax", {{3, 4, 2}}, one([](auto& x) { return x[0].amax({0, 2}); })},
      {"aten::amin", {{3, 4}}, one([](auto& x) { return x[0].amin(-1, true); })},
      {"aten::max", {{3, 4}}, one([](auto& x) { return x[0].max(); })},
      {"aten::min", {{3, 4}}, one([](auto& x) { return x[0].min(); })},
      {"aten::amax", {{3, 4}}, one([](auto& x) { return x[0].round().amax(1) * x[0].sum(); })},  // ties: no tangent through round
      // reductions
      {"aten::cumsum", {{3, 4}}, one([](auto& x) { return x[0].cumsum(1); })},
      {"aten::cumprod", {{3, 5}}, one([](auto& x) { return x[0].cumprod(1); })},
      {"aten::cumprod", {{2, 3, 4}}, one([](auto& x) { return x[0].cumprod(0, at::kDouble); })},
      {"aten::cumprod", {{3, 5}}, one([](auto& x) {  // zeros (first, repeated, none): exact, as forward AD
         at::Tensor m = at::tensor({1., 0., 1., 0., 0., 0., 0., 1., 0., 1., 0., 0., 0., 0., 0.}, at::kDouble).view({3, 5});
         return (x[0] - x[0].detach() * m).cumprod(1);
       }), nullptr, false, 99, false},
      {"aten::logcumsumexp", {{3, 5}}, one([](auto& x) { return x[0].logcumsumexp(1); })},
      {"aten::logcumsumexp", {{4, 2}}, one([](auto& x) { return (x[0] * 30).logcumsumexp(0); }),
       nullptr, false, /*ad_outputs=*/0},  // (LibTorch's forward AD gets the first row wrong here: differences only)
      {"aten::logsumexp", {{3, 4}}, one([](auto& x) { return x[0].logsumexp({1}); })},
      {"aten::logsumexp", {{3, 4, 2}}, one([](auto& x) { return at::logsumexp(x[0], std::vector<int64_t>{0, -1}, true); })},
      {"aten::var.correction", {{3, 4}}, one([](auto& x) { return x[0].var({1}); })},
      {"aten::var.correction", {{3, 4}}, one([](auto& x) { return at::var(x[0], std::nullopt, 0, true); })},
      {"aten::std.correction", {{3, 4}}, one([](auto& x) { return x[0].std({0}, 1, true); })},
      {"aten::linalg_vector_norm", {{3, 4}}, one([](auto& x) { return at::linalg_vector_norm(x[0], 2, {1}); })},
      {"aten::linalg_vector_norm", {{3, 4}}, one([](auto& x) { return at::linalg_vector_norm(x[0], 1); })},
      {"aten::linalg_vector_norm", {{3, 4}}, one([](auto& x) { return at::linalg_vector_norm(x[0], 3.0, {0}, true); })},
      {"aten::linalg_vector_norm", {{3, 4}}, one([](auto& x) { return at::linalg_vector_norm(x[0], INFINITY, {1}); })},
      {"aten::linalg_vector_norm", {{3, 4}}, one([](auto& x) { return at::linalg_vector_norm(x[0], -INFINITY, {1}); })},
      {"aten::linalg_vector_norm", {{3, 4}}, one([](auto& x) {  // F.normalize
         return x[0] / at::linalg_vector_norm(x[0], 2, {1}, true).clamp_min(1e-12).expand_as(x[0]);
       })},
      {"aten::linalg_vector_norm", {{3, 4}}, one([](auto& x) {  // p < 1 with zeros: LibTorch's 0 there, not NaN
         return at::linalg_vector_norm(x[0] - x[0].detach() * (x[0] > 0.5), 0.5, {1});
       }), nullptr, false, 99, false},
      // (LibTorch's forward AD of norm.Scalar fails for [3, 4]; the reference is the same norm by linalg)
      {"aten::norm.Scalar", {{3, 4}}, one([](auto& x) { return x[0].norm(); }),
       one([](auto& x) { return at::linalg_vector_norm(x[0]); })},
      {"aten::norm.Scalar", {{3, 4}}, one([](auto& x) { return x[0].norm(1); }),
       one([](auto& x) { return at::linalg_vector_norm(x[0], 1); })},
      {"aten::prod.dim_int", {{3, 4}}, one([](auto& x) { return x[0].prod(1); })},
      {"aten::prod.dim_int", {{3, 4}}, one([](auto& x) { return (x[0] * (x[0] > 0)).prod(0, true); })},  // with zeros
      {"aten::prod", {{3, 4}}, one([](auto& x) { return x[0].t().prod(); })},
      {"aten::mse_loss", {{3, 4}, {3, 4}}, one([](auto& x) { return at::mse_loss(x[0], x[1]); })},
      {"aten::mse_loss", {{3, 4}, {4}}, one([](auto& x) { return at::mse_loss(x[0], x[1].expand({3, 4}), at::Reduction::None); })},
      {"aten::mse_loss", {{3, 4}}, one([](auto& x) { return at::mse_loss(x[0], x[0].detach() * 0.5, at::Reduction::Sum); }),
       nullptr, false, 99, false},  // central differences see through detach
      {"aten::var_mean.correction", {{3, 4}}, [](auto& x) {
         auto r = at::var_mean(x[0], {1}, 1, true);
         return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r)};
       }},
      {"aten::std_mean.correction", {{3, 4}}, [](auto& x) {
         auto r = at::std_mean(x[0], {0});
         return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r)};
       }},
      {"aten::norm.ScalarOpt_dim", {{3, 4}}, one([](auto& x) { return x[0].norm(2, {1}, true); })},
      {"aten::norm.ScalarOpt_dim", {{3, 4}}, one([](auto& x) { return x[0].norm(3, {0}); })},
      {"aten::median.dim", {{3, 5}}, [](auto& x) { auto r = x[0].median(1); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::nanmedian.dim", {{3, 5}}, [](auto& x) { auto r = x[0].nanmedian(0, true); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::kthvalue", {{3, 5}}, [](auto& x) { auto r = x[0].kthvalue(2, 1); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::mode", {{3, 5}}, [](auto& x) { auto r = x[0].mode(1); return std::vector<at::Tensor>{std::get<0>(r)}; }},
      {"aten::smooth_l1_loss", {{3, 4}, {3, 4}}, one([](auto& x) { return at::smooth_l1_loss(x[0], x[1], at::Reduction::Mean, 0.7); })},
      {"aten::huber_loss", {{3, 4}, {3, 4}}, one([](auto& x) { return at::huber_loss(x[0], x[1], at::Reduction::Sum, 0.7); })},
      {"aten::binary_cross_entropy", {{3, 4}, {3, 4}}, one([](auto& x) {
         return at::binary_cross_entropy(x[0].sigmoid(), x[1].sigmoid());
       })},
      {"aten::binary_cross_entropy", {{3, 4}}, one([](auto& x) {  // a weight, no reduction
         return at::binary_cross_entropy(x[0].sigmoid(), at::full({3, 4}, 0.3, at::kDouble), at::full({4}, 2.0, at::kDouble),
                                         at::Reduction::None);
       })},
      {"aten::binary_cross_entropy_with_logits", {{3, 4}, {3, 4}}, one([](auto& x) {
         return at::binary_cross_entropy_with_logits(x[0], x[1].sigmoid());
       })},
      {"aten::binary_cross_entropy_with_logits", {{3, 4}, {3, 4}}, one([](auto& x) {  // weight and pos_weight
         return at::binary_cross_entropy_with_logits(x[0], x[1].sigmoid(), at::full({4}, 0.5, at::kDouble),
                                                     at::full({4}, 3.0, at::kDouble), at::Reduction::Sum);
       })},
      {"aten::nll_loss2d_forward", {{2, 3, 4, 4}}, one([](auto& x) {
         return at::nll_loss2d(x[0].log_softmax(1), (at::arange(32, at::kLong) % 3).view({2, 4, 4}));
       })},
      {"aten::_upsample_bilinear2d_aa", {{2, 3, 8, 8}}, one([](auto& x) {
         return at::_upsample_bilinear2d_aa(x[0], std::vector<int64_t>{5, 3}, false);
       })},
      {"aten::_upsample_bicubic2d_aa", {{2, 3, 8, 8}}, one([](auto& x) {
         return at::_upsample_bicubic2d_aa(x[0], std::vector<int64_t>{5, 3}, false);
       })},
      {"aten::im2col", {{2, 3, 5, 5}}, one([](auto& x) { return at::im2col(x[0], {2, 3}, {1, 1}, {1, 0}, {2, 1}); })},
      {"aten::col2im", {{2, 12, 9}}, one([](auto& x) { return at::col2im(x[0], {4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}); })},
      // scatters and padding
      {"aten::constant_pad_nd", {{3, 4}}, one([](auto& x) { return at::constant_pad_nd(x[0], {1, 2, 0, 1}, 5.0); })},
      {"aten::scatter_add", {{3, 4}, {3, 2}}, one([](auto& x) {
         return x[0].scatter_add(1, at::tensor({0, 3, 3, 3, 1, 0}, at::kLong).view({3, 2}), x[1]);
       })},
      {"aten::scatter.src", {{3, 4}, {3, 2}}, one([](auto& x) {
         return x[0].scatter(1, at::tensor({0, 3, 2, 3, 1, 0}, at::kLong).view({3, 2}), x[1]);
       })},
      {"aten::scatter.src", {{3, 4}}, one([](auto& x) {  // a constant source
         return x[0].scatter(1, at::tensor({0, 3, 2, 3, 1, 0}, at::kLong).view({3, 2}), at::ones({3, 2}, at::kDouble));
       })},
      {"aten::scatter.value", {{3, 4}}, one([](auto& x) { return x[0].scatter(1, at::tensor({2, 0, 1}, at::kLong).view({3, 1}), 2.0); })},
      // pooling, resampling, padding
      {"aten::avg_pool2d", {{2, 3, 6, 6}}, one([](auto& x) { return at::avg_pool2d(x[0], {3, 2}, {2, 2}, {1, 0}); })},
      {"aten::avg_pool3d", {{1, 2, 4, 4, 4}}, one([](auto& x) { return at::avg_pool3d(x[0], {2, 2, 2}); })},
      {"aten::_adaptive_avg_pool2d", {{2, 3, 7, 5}}, one([](auto& x) { return at::adaptive_avg_pool2d(x[0], {3, 2}); })},
      {"aten::_adaptive_avg_pool3d", {{1, 2, 5, 4, 3}}, one([](auto& x) { return at::adaptive_avg_pool3d(x[0], {2, 2, 2}); })},
      {"aten::max_pool2d_with_indices", {{2, 3, 6, 6}}, one([](auto& x) { return at::max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}); })},
      {"aten::max_pool2d_with_indices", {{3, 5, 4}}, one([](auto& x) { return at::max_pool2d(x[0], {2, 2}); })},  // unbatched
      {"aten::max_pool3d_with_indices", {{1, 2, 4, 4, 4}}, one([](auto& x) { return at::max_pool3d(x[0], {2, 2, 2}); })},
      {"aten::adaptive_max_pool2d", {{2, 3, 7, 5}}, one([](auto& x) { return std::get<0>(at::adaptive_max_pool2d(x[0], {3, 2})); })},
      {"aten::adaptive_max_pool3d", {{1, 2, 5, 4, 3}}, one([](auto& x) { return std::get<0>(at::adaptive_max_pool3d(x[0], {2, 2, 2})); })},
      {"aten::upsample_nearest1d", {{2, 3, 5}}, one([](auto& x) { return at::upsample_nearest1d(x[0], std::vector<int64_t>{11}); })},
      {"aten::upsample_nearest2d", {{2, 3, 4, 5}}, one([](auto& x) { return at::upsample_nearest2d(x[0], std::vector<int64_t>{8, 7}); })},
      {"aten::upsample_nearest3d", {{1, 2, 2, 3, 2}}, one([](auto& x) { return at::upsample_nearest3d(x[0], std::vector<int64_t>{4, 6, 3}); })},
      {"aten::_upsample_nearest_exact1d", {{2, 3, 5}}, one([](auto& x) { return at::_upsample_nearest_exact1d(x[0], std::vector<int64_t>{8}); })},
      {"aten::_upsample_nearest_exact2d", {{2, 3, 4, 5}}, one([](auto& x) { return at::_upsample_nearest_exact2d(x[0], std::vector<int64_t>{7, 3}); })},
      {"aten::_upsample_nearest_exact3d", {{1, 2, 2, 3, 2}}, one([](auto& x) { return at::_upsample_nearest_exact3d(x[0], std::vector<int64_t>{3, 5, 4}); })},
      {"aten::upsample_linear1d", {{2, 3, 5}}, one([](auto& x) { return at::upsample_linear1d(x[0], std::vector<int64_t>{9}, true); })},
      {"aten::upsample_bilinear2d", {{2, 3, 4, 5}}, one([](auto& x) { return at::upsample_bilinear2d(x[0], std::vector<int64_t>{7, 8}, false); })},
      {"aten::upsample_bicubic2d", {{2, 3, 4, 5}}, one([](auto& x) { return at::upsample_bicubic2d(x[0], std::vector<int64_t>{6, 9}, false); })},
      {"aten::upsample_trilinear3d", {{1, 2, 2, 3, 2}}, one([](auto& x) { return at::upsample_trilinear3d(x[0], std::vector<int64_t>{3, 5, 4}, true); })},
      {"aten::reflection_pad1d", {{2, 3, 5}}, one([](auto& x) { return at::reflection_pad1d(x[0], {2, 1}); })},
      {"aten::reflection_pad2d", {{2, 3, 4, 5}}, one([](auto& x) { return at::reflection_pad2d(x[0], {1, 2, 2, 1}); })},
      {"aten::reflection_pad3d", {{1, 2, 3, 4, 3}}, one([](auto& x) { return at::reflection_pad3d(x[0], {1, 1, 2, 1, 1, 2}); })},
      {"aten::replication_pad1d", {{2, 3, 5}}, one([](auto& x) { return at::replication_pad1d(x[0], {2, 1}); })},
      {"aten::replication_pad2d", {{2, 3, 4, 5}}, one([](auto& x) { return at::replication_pad2d(x[0], {1, 2, 2, 1}); })},
      {"aten::replication_pad3d", {{1, 2, 3, 4, 3}}, one([](auto& x) { return at::replication_pad3d(x[0], {1, 1, 2, 1, 1, 2}); })},
      {"aten::pixel_shuffle", {{2, 8, 3, 3}}, one([](auto& x) { return at::pixel_shuffle(x[0], 2); })},
      {"aten::pixel_unshuffle", {{2, 2, 4, 6}}, one([](auto& x) { return at::pixel_unshuffle(x[0], 2); })},
      {"aten::channel_shuffle", {{2, 6, 3, 3}}, one([](auto& x) { return at::channel_shuffle(x[0], 3); })},
      {"aten::trace", {{4, 5}}, one([](auto& x) { return at::trace(x[0]); })},
      {"aten::index_put", {{5, 4}, {2, 4}}, one([](auto& x) {
         return x[0].index_put({at::tensor({4, 1}, at::kLong)}, x[1]);
       })},
      {"aten::index_put", {{5, 4}, {3, 4}}, one([](auto& x) {  // accumulate, a repeated index
         return x[0].index_put({at::tensor({4, 1, 4}, at::kLong)}, x[1], true);
       })},
      {"aten::index_put", {{5, 4}}, one([](auto& x) {  // constant values over a bool mask
         return x[0].index_put({x[0] > 0}, at::scalar_tensor(2.0, at::kDouble));
       })},
      {"aten::masked_scatter", {{3, 4}, {12}}, one([](auto& x) { return x[0].masked_scatter(x[0] > 0, x[1]); })},
      {"aten::slice_scatter", {{4, 3}, {2, 3}}, one([](auto& x) { return at::slice_scatter(x[0], x[1], 0, 1, 4, 2); })},
      {"aten::select_scatter", {{4, 3}, {4}}, one([](auto& x) { return at::select_scatter(x[0], x[1], 1, 2); })},
      {"aten::diagonal_scatter", {{4, 3}}, one([](auto& x) { return at::diagonal_scatter(x[0], at::ones({3}, at::kDouble)); })},
      {"aten::index_copy", {{5, 4}, {2, 4}}, one([](auto& x) { return x[0].index_copy(0, at::tensor({4, 1}, at::kLong), x[1]); })},
      {"aten::index_copy", {{5, 4}}, one([](auto& x) {
         return x[0].index_copy(0, at::tensor({4, 1}, at::kLong), at::ones({2, 4}, at::kDouble));
       })},
      {"aten::narrow_copy", {{5, 4}}, one([](auto& x) { return at::narrow_copy(x[0], 0, 1, 3); }),
       one([](auto& x) { return x[0].narrow(0, 1, 3).clone(); })},  // LibTorch has no forward AD for narrow_copy
      {"aten::grid_sampler_2d", {{2, 3, 5, 5}, {2, 4, 3, 2}}, one([](auto& x) {
         return at::grid_sampler(x[0], x[1].tanh(), 0, 0, false);  // bilinear, zeros
       }), nullptr, false, /*ad_outputs=*/0},  // (no forward AD for grid_sampler: central differences only)
      {"aten::grid_sampler_2d", {{1, 2, 4, 5}, {1, 3, 3, 2}}, one([](auto& x) {
         return at::grid_sampler(x[0], x[1] * 0.8, 2, 1, true);  // bicubic, border
       }), nullptr, false, 0},
      {"aten::grid_sampler_2d", {{1, 2, 4, 5}, {1, 3, 3, 2}}, one([](auto& x) { return at::grid_sampler(x[0], x[1], 1, 2, false); }),
       nullptr, false, 0},  // nearest, reflection
      {"aten::grid_sampler_3d", {{1, 2, 3, 4, 5}, {1, 2, 3, 2, 3}}, one([](auto& x) {
         return at::grid_sampler(x[0], x[1].tanh(), 0, 2, false);  // trilinear, reflection
       }), nullptr, false, 0},
      // (no forward AD for embedding_bag either: the references sum the rows by index_select)
      {"aten::_embedding_bag_forward_only", {{10, 3}}, embedding_bag(at::tensor({1, 2, 4, 5, 4, 3}, at::kLong), {0, 2}, 0),
       bags(at::tensor({1, 2, 4, 5, 4, 3}, at::kLong), {0, 2}, 0)},
      {"aten::_embedding_bag_forward_only", {{10, 3}}, embedding_bag(at::tensor({1, 2, 4, 5, 4}, at::kLong), {0, 2, 2}, 1),
       bags(at::tensor({1, 2, 4, 5, 4}, at::kLong), {0, 2, 2}, 1)},  // mean, an empty bag
      {"aten::_embedding_bag_forward_only", {{10, 3}, {5}}, embedding_bag(at::tensor({1, 2, 4, 5, 4}, at::kLong), {0, 2}, 0, true),
       bags(at::tensor({1, 2, 4, 5, 4}, at::kLong), {0, 2}, 0, true)},  // per-sample weights
      {"aten::_embedding_bag_forward_only", {{10, 3}}, embedding_bag(at::tensor({1, 2, 4, 5, 4}, at::kLong), {0, 3, 3}, 2),
       bags(at::tensor({1, 2, 4, 5, 4}, at::kLong), {0, 3, 3}, 2)},  // max, an empty bag
      {"aten::_embedding_bag", {{10, 3}}, one([](auto& x) {  // what embedding_bag calls for a weight that requires grad
         return std::get<0>(at::_embedding_bag(x[0], at::tensor({1, 2, 4, 5, 4}, at::kLong), at::tensor({0, 2}, at::kLong), false, 1));
       }), bags(at::tensor({1, 2, 4, 5, 4}, at::kLong), {0, 2}, 1)},
      {"aten::diag_embed", {{2, 3}}, one([](auto& x) { return at::diag_embed(x[0], 1); })},
      {"aten::affine_grid_generator", {{2, 2, 3}}, one([](auto& x) { return at::affine_grid_generator(x[0], {2, 3, 4, 5}, false); })},
      {"aten::masked_select", {{3, 4}}, one([](auto& x) { return x[0].masked_select(x[0] > 0); })},
      {"aten::index_add", {{5, 4}, {3, 4}}, one([](auto& x) { return x[0].index_add(0, at::tensor({4, 0, 4}, at::kLong), x[1], 0.5); })},
      {"aten::index_add", {{5, 4}}, one([](auto& x) { return x[0].index_add(0, at::tensor({4, 0, 4}, at::kLong), at::ones({3, 4}, at::kDouble)); })},
      {"aten::_softmax", {{3, 5}}, one([](auto& x) { return at::_softmax(x[0], -1, false); })},
      {"aten::_safe_softmax", {{3, 5}}, one([](auto& x) { return at::_safe_softmax(x[0], 0); })},
      {"aten::_log_softmax", {{3, 5}}, one([](auto& x) { return at::log_softmax(x[0], -1); })},
      {"aten::native_layer_norm", {{3, 8}, {8}, {8}}, one([](auto& x) { return at::layer_norm(x[0], {8}, x[1], x[2]); })},
      {"aten::native_layer_norm", {{2, 3, 4}}, one([](auto& x) { return at::layer_norm(x[0], {3, 4}); })},
      {"aten::native_layer_norm", {{3, 8}}, [](auto& x) {
         auto r = at::native_layer_norm(x[0], {8}, std::nullopt, std::nullopt, 1e-5);
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/1},  // PyTorch gives mean and rstd no forward-AD tangent
      {"aten::native_group_norm", {{2, 6, 5}, {6}, {6}}, one([](auto& x) { return at::group_norm(x[0], 3, x[1], x[2]); })},
      {"aten::native_group_norm", {{2, 4, 3, 3}}, one([](auto& x) { return at::group_norm(x[0].transpose(2, 3), 2); })},
      {"aten::native_group_norm", {{2, 4, 3}}, [](auto& x) {
         auto r = at::native_group_norm(x[0], std::nullopt, std::nullopt, 2, 4, 3, 2, 1e-5);
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/1},
      {"aten::native_batch_norm", {{4, 3, 5}, {3}, {3}}, one([](auto& x) {
         return at::batch_norm(x[0], x[1], x[2], {}, {}, true, 0.1, 1e-5, false);
       })},
      {"aten::native_batch_norm", {{4, 3}}, one([](auto& x) {  // running statistics updated, batch ones used
         return at::batch_norm(x[0], {}, {}, at::zeros({3}, at::kDouble), at::ones({3}, at::kDouble), true, 0.1, 1e-5, false);
       })},
      {"aten::native_batch_norm", {{4, 3, 2, 2}, {3}, {3}}, one([](auto& x) {  // eval: the running statistics
         return at::batch_norm(x[0], x[1], x[2], at::full({3}, 0.2, at::kDouble), at::full({3}, 1.5, at::kDouble), false, 0.1, 1e-5, false);
       })},
      {"aten::native_batch_norm", {{2, 3, 4}, {3}, {3}}, one([](auto& x) { return at::instance_norm(x[0], x[1], x[2], {}, {}, true, 0.1, 1e-5, false); })},
      // What a compiled program records for batch norm whose running statistics are its state:
      // the new statistics are outputs, without tangents (LibTorch has no forward AD of it).
      {"aten::_native_batch_norm_legit_functional", {{4, 3, 5}, {3}, {3}}, [](auto& x) {
         auto r = at::_native_batch_norm_legit_functional(x[0], x[1], x[2], at::zeros({3}, at::kDouble),
                                                          at::ones({3}, at::kDouble), true, 0.1, 1e-5);
         return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r), std::get<2>(r)};  // not the running statistics
       }, nullptr, false, /*ad_outputs=*/0},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {{1, 2, 6, 4}, {1, 2, 6, 4}, {1, 2, 6, 4}},
       sdpa(B::Flash, false, false), sdpa(B::Math, false, false)},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {{1, 2, 6, 4}, {1, 2, 9, 4}, {1, 2, 9, 4}},
       sdpa(B::Flash, true, false), sdpa(B::Math, true, false)},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {{2, 2, 6, 4}, {2, 2, 7, 4}, {2, 2, 7, 4}, {6, 7}},
       sdpa(B::Flash, false, true), sdpa(B::Math, false, true)},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {{2, 2, 6, 4}, {2, 2, 7, 4}, {2, 2, 7, 4}, {2, 1, 6, 7}},
       sdpa(B::Flash, false, false, true), sdpa(B::Math, false, false, true)},
      {"aten::_safe_softmax", {{1, 2, 6, 4}, {1, 2, 6, 4}, {1, 2, 6, 4}}, sdpa(B::Math, true, false)},
      // Backward kernels (forward-over-reverse; passes/jvp_rules/backward.cpp).
      {"aten::threshold_backward", {{6}, {6}}, one([](auto& x) { return at::threshold_backward(x[0], x[1], 0.1); })},
      {"aten::hardtanh_backward", {{6}, {6}}, one([](auto& x) { return at::hardtanh_backward(x[0], x[1], -0.5, 0.5); })},
      {"aten::leaky_relu_backward", {{6}, {6}}, one([](auto& x) { return at::leaky_relu_backward(x[0], x[1], 0.1, false); })},
      {"aten::hardsigmoid_backward", {{6}, {6}}, one([](auto& x) { return at::hardsigmoid_backward(x[0], x[1] * 4); }), nullptr, false, 0},
      {"aten::softshrink_backward", {{6}, {6}}, one([](auto& x) { return at::softshrink_backward(x[0], x[1], 0.3); })},
      {"aten::hardshrink_backward", {{6}, {6}}, one([](auto& x) { return at::hardshrink_backward(x[0], x[1], 0.3); })},
      {"aten::embedding_dense_backward", {{4, 3}}, one([](auto& x) {
         return at::embedding_dense_backward(x[0], at::tensor({5, 0, 2, 5}, at::kLong), 6, -1, false);
       })},
      {"aten::select_backward", {{4}}, one([](auto& x) { return at::select_backward(x[0], {3, 4}, 0, 1); })},
      {"aten::slice_backward", {{2, 4}}, one([](auto& x) { return at::slice_backward(x[0], {6, 4}, 0, 1, 5, 2); })},
      {"aten::diagonal_backward", {{4, 3}}, one([](auto& x) { return at::diagonal_backward(x[0], {3, 4, 5}, 1, 0, 2); })},
      {"aten::unfold_backward", {{3, 3, 3}}, one([](auto& x) { return at::unfold_backward(x[0], {7, 3}, 0, 3, 2); })},
      {"aten::avg_pool2d_backward", {{1, 2, 2, 2}, {1, 2, 4, 4}}, one([](auto& x) {
         return at::avg_pool2d_backward(x[0], x[1], {2, 2}, {2, 2}, {0, 0}, false, true, std::nullopt);
       })},
      {"aten::avg_pool3d_backward", {{1, 1, 2, 2, 2}, {1, 1, 4, 4, 4}}, one([](auto& x) {
         return at::avg_pool3d_backward(x[0], x[1], {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, false, true, std::nullopt);
       })},
      {"aten::_adaptive_avg_pool2d_backward", {{1, 2, 3, 2}, {1, 2, 7, 5}},
       one([](auto& x) { return at::_adaptive_avg_pool2d_backward(x[0], x[1]); })},
      {"aten::_adaptive_avg_pool3d_backward", {{1, 1, 2, 2, 2}, {1, 1, 3, 5, 4}},
       one([](auto& x) { return at::_adaptive_avg_pool3d_backward(x[0], x[1]); })},
      {"aten::upsample_nearest1d_backward", {{2, 3, 8}},
       one([](auto& x) { return at::upsample_nearest1d_backward(x[0], {8}, {2, 3, 4}); })},
      {"aten::upsample_nearest2d_backward", {{2, 3, 8, 7}},
       one([](auto& x) { return at::upsample_nearest2d_backward(x[0], {8, 7}, {2, 3, 4, 5}); })},
      {"aten::upsample_nearest3d_backward", {{1, 2, 4, 4, 6}},
       one([](auto& x) { return at::upsample_nearest3d_backward(x[0], {4, 4, 6}, {1, 2, 2, 2, 3}); })},
      {"aten::_upsample_nearest_exact1d_backward", {{2, 3, 8}},
       one([](auto& x) { return at::_upsample_nearest_exact1d_backward(x[0], {8}, {2, 3, 4}); })},
      {"aten::_upsample_nearest_exact2d_backward", {{2, 3, 8, 7}},
       one([](auto& x) { return at::_upsample_nearest_exact2d_backward(x[0], {8, 7}, {2, 3, 4, 5}); })},
      {"aten::_upsample_nearest_exact3d_backward", {{1, 2, 4, 4, 6}},
       one([](auto& x) { return at::_upsample_nearest_exact3d_backward(x[0], {4, 4, 6}, {1, 2, 2, 2, 3}); })},
      {"aten::upsample_linear1d_backward", {{2, 3, 7}},
       one([](auto& x) { return at::upsample_linear1d_backward(x[0], {7}, {2, 3, 4}, false); })},
      {"aten::upsample_bilinear2d_backward", {{2, 3, 7, 8}},
       one([](auto& x) { return at::upsample_bilinear2d_backward(x[0], {7, 8}, {2, 3, 4, 5}, false); })},
      {"aten::upsample_bicubic2d_backward", {{2, 3, 7, 8}},
       one([](auto& x) { return at::upsample_bicubic2d_backward(x[0], {7, 8}, {2, 3, 4, 5}, true); })},
      {"aten::upsample_trilinear3d_backward", {{1, 2, 4, 4, 6}},
       one([](auto& x) { return at::upsample_trilinear3d_backward(x[0], {4, 4, 6}, {1, 2, 2, 2, 3}, false); })},
      {"aten::reflection_pad1d_backward", {{2, 3, 8}, {2, 3, 6}},
       one([](auto& x) { return at::reflection_pad1d_backward(x[0], x[1], {1, 1}); })},
      {"aten::reflection_pad2d_backward", {{1, 2, 6, 7}, {1, 2, 4, 5}},
       one([](auto& x) { return at::reflection_pad2d_backward(x[0], x[1], {1, 1, 1, 1}); })},
      {"aten::reflection_pad3d_backward", {{1, 1, 4, 5, 6}, {1, 1, 2, 3, 4}},
       one([](auto& x) { return at::reflection_pad3d_backward(x[0], x[1], {1, 1, 1, 1, 1, 1}); })},
      {"aten::replication_pad1d_backward", {{2, 3, 8}, {2, 3, 6}},
       one([](auto& x) { return at::replication_pad1d_backward(x[0], x[1], {1, 1}); })},
      {"aten::replication_pad2d_backward", {{1, 2, 6, 7}, {1, 2, 4, 5}},
       one([](auto& x) { return at::replication_pad2d_backward(x[0], x[1], {1, 1, 1, 1}); })},
      {"aten::replication_pad3d_backward", {{1, 1, 4, 5, 6}, {1, 1, 2, 3, 4}},
       one([](auto& x) { return at::replication_pad3d_backward(x[0], x[1], {1, 1, 1, 1, 1, 1}); })},
      {"aten::tanh_backward", {{6}, {6}}, one([](auto& x) { return at::tanh_backward(x[0], x[1]); })},
      {"aten::sigmoid_backward", {{6}, {6}}, one([](auto& x) { return at::sigmoid_backward(x[0], x[1]); })},
      {"aten::silu_backward", {{6}, {6}}, one([](auto& x) { return at::silu_backward(x[0], x[1]); }), nullptr, false, 0},
      {"aten::gelu_backward", {{6}, {6}}, one([](auto& x) { return at::gelu_backward(x[0], x[1]); })},
      {"aten::gelu_backward", {{6}, {6}}, one([](auto& x) { return at::gelu_backward(x[0], x[1], "tanh"); })},
      {"aten::_softmax_backward_data", {{3, 5}, {3, 5}},
       one([](auto& x) { return at::_softmax_backward_data(x[0], x[1], -1, at::kDouble); }), nullptr, false, 0},
      {"aten::_log_softmax_backward_data", {{3, 5}, {3, 5}},
       one([](auto& x) { return at::_log_softmax_backward_data(x[0], x[1], 0, at::kDouble); }), nullptr, false, 0},
      {"aten::mse_loss_backward", {{}, {3, 4}, {3, 4}}, one([](auto& x) { return at::mse_loss_backward(x[0], x[1], x[2], 1); })},
      {"aten::mse_loss_backward", {{3, 4}, {3, 4}, {3, 4}}, one([](auto& x) { return at::mse_loss_backward(x[0], x[1], x[2], 0); })},
      {"aten::native_layer_norm_backward", {{3, 2, 5}, {3, 2, 5}, {5}, {5}}, [](auto& x) {
         auto [y, mean, rstd] = at::native_layer_norm(x[1], {5}, x[2], x[3], 1e-5);
         auto r = at::native_layer_norm_backward(x[0], x[1], {5}, mean, rstd, x[2], x[3], {true, true, true});
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/0},
      {"aten::native_layer_norm_backward", {{3, 4}, {3, 4}}, one([](auto& x) {
         auto [y, mean, rstd] = at::native_layer_norm(x[1], {4}, {}, {}, 1e-5);
         return std::get<0>(at::native_layer_norm_backward(x[0], x[1], {4}, mean, rstd, {}, {}, {true, false, false}));
       }), nullptr, false, /*ad_outputs=*/0},
      {"aten::native_batch_norm_backward", {{2, 3, 4}, {2, 3, 4}, {3}, {3}}, [](auto& x) {
         auto [y, mean, invstd] = at::native_batch_norm(x[1], x[2], x[3], {}, {}, true, 0.1, 1e-5);
         auto r = at::native_batch_norm_backward(x[0], x[1], x[2], {}, {}, mean, invstd, true, 1e-5, {true, true, true});
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/0},
      {"aten::native_batch_norm_backward", {{2, 3, 4}, {2, 3, 4}, {3}}, [](auto& x) {
         at::Tensor rm = at::full({3}, 0.2, at::kDouble), rv = at::full({3}, 1.5, at::kDouble);
         auto r = at::native_batch_norm_backward(x[0], x[1], x[2], rm, rv, {}, {}, false, 1e-5, {true, true, true});
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/0},
      {"aten::native_group_norm_backward", {{2, 4, 3}, {2, 4, 3}, {4}, {4}}, [](auto& x) {
         auto [y, mean, rstd] = at::native_group_norm(x[1], x[2], x[3], 2, 4, 3, 2, 1e-5);
         auto r = at::native_group_norm_backward(x[0], x[1], mean, rstd, x[2], 2, 4, 3, 2, {true, true, true});
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/0},
      {"aten::convolution_backward", {{2, 4, 5, 5}, {2, 3, 5, 5}, {4, 3, 3, 3}}, [](auto& x) {
         auto r = at::convolution_backward(x[0], x[1], x[2], std::vector<int64_t>{4}, {1, 1}, {1, 1}, {1, 1}, false,
                                           {0, 0}, 1, {true, true, true});
         return all_of(r);
       }},
      {"aten::convolution_backward", {{2, 4, 3, 3}, {2, 4, 5, 5}, {4, 2, 3, 3}}, [](auto& x) {  // groups, no bias
         auto r = at::convolution_backward(x[0], x[1], x[2], std::nullopt, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 2,
                                           {true, true, false});
         return std::vector<at::Tensor>{std::get<0>(r), std::get<1>(r)};
       }},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", {{1, 2, 5, 4}, {1, 2, 5, 4}, {1, 2, 6, 4}, {1, 2, 6, 4}},
       [](auto& x) {
         auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(x[1], x[2], x[3], 0.0, false);
         auto r = at::_scaled_dot_product_flash_attention_for_cpu_backward(x[0], x[1], x[2], x[3], out, lse, 0.0, false);
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/0},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", {{1, 2, 5, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}},
       [](auto& x) {  // causal
         auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(x[1], x[2], x[3], 0.0, true);
         auto r = at::_scaled_dot_product_flash_attention_for_cpu_backward(x[0], x[1], x[2], x[3], out, lse, 0.0, true);
         return all_of(r);
       }, nullptr, false, /*ad_outputs=*/0},
  };
  c.erase(std::remove_if(c.begin(), c.end(), [](const RuleCase& rc) { return !has_op(rc.op); }), c.end());
  return c;
}

const std::vector<ComplexCase>& complex_cases() {
  static const std::vector<ComplexCase> c = {
      {"aten::_fft_r2c", {{3, 8}}, {false}, one([](auto& x) { return at::fft_rfft(x[0]); })},
      {"aten::_fft_c2r", {{3, 5}}, {true}, one([](auto& x) { return at::fft_irfft(x[0], 8); })},
      {"aten::_fft_c2c", {{2, 4, 4}}, {true}, one([](auto& x) {
         return at::fft_fft2(x[0], std::nullopt, {-2, -1}, "ortho");
       })},
      {"aten::view_as_real", {{3, 4}}, {true}, one([](auto& x) { return at::view_as_real(x[0]) * 2; })},
      {"aten::view_as_complex", {{3, 4, 2}}, {false}, one([](auto& x) { return at::view_as_complex(x[0]).exp(); })},
      {"aten::view_as_complex", {{4, 3, 2}}, {false}, one([](auto& x) {
         return at::view_as_complex((x[0] * 2).transpose(0, 1).contiguous());
       })},
      {"aten::_conj", {{4}}, {true}, one([](auto& x) { return x[0] * x[0].conj(); })},
      {"aten::_conj_physical", {{4}}, {true}, one([](auto& x) { return at::conj_physical(x[0]) * x[0]; })},
      {"aten::_neg_view", {{4}}, {true}, one([](auto& x) { return at::imag(x[0].conj()).resolve_neg() * 3; })},
      {"aten::abs", {{5}}, {true}, one([](auto& x) { return x[0].abs(); })},
      {"aten::angle", {{5}}, {true}, one([](auto& x) { return x[0].angle(); })},
      {"aten::angle", {{5}}, {false}, one([](auto& x) {
         return x[0].angle() + x[0];
       })},  // real: 0 (and x's own tangent)
      {"aten::exp", {{5}}, {true}, one([](auto& x) {
         return (x[0].sin() + x[0].cos() * x[0].tanh()).exp() / x[0].sigmoid();
       })},
      {"aten::sqrt", {{5}}, {true}, one([](auto& x) {
         return x[0].sqrt() + x[0].rsqrt() + x[0].log() + x[0].reciprocal() + x[0].pow(3);
       })},
      {"aten::bmm", {{2, 3, 4}, {2, 4, 5}}, {true, false}, one([](auto& x) {
         return at::bmm(x[0], x[1].to(at::kComplexDouble));
       })},
      {"aten::baddbmm", {{2, 3, 5}, {2, 3, 4}, {2, 4, 5}}, {true, true, true}, one([](auto& x) {
         return at::baddbmm(x[0], x[1], x[2]).cumsum(-1) / (x[0] + 3) + at::addmm(x[0][0], x[1][0], x[2][1]);
       })},
      {"aten::index_put", {{4, 3}, {2, 3}}, {true, true}, one([](auto& x) {
         return at::index_put(x[0], {at::tensor({0, 2}, at::kLong)}, x[1], /*accumulate=*/true);
       })},
      // a Fourier neural operator's spectral convolution: rfft, complex weights on the lowest modes, irfft
      {"aten::_fft_c2r", {{2, 3, 16}, {3, 4, 5}}, {false, true}, one([](auto& x) {
         at::Tensor f = at::fft_rfft(x[0]);
         at::Tensor g = at::einsum("bcm,com->bom", {f.narrow(-1, 0, 5), x[1]});
         return at::fft_irfft(at::constant_pad_nd(g, {0, f.size(-1) - 5}), x[0].size(-1));
       })},
  };
  return c;
}

void for_each_case(const std::function<void(const Fn&, const std::vector<TraceInput>&, const std::string&)>& f) {
  std::vector<RuleCase> all = cases();
  for (size_t c = 0; c < all.size(); ++c) {
    const RuleCase& rc = all[c];
    at::manual_seed(c);
    std::vector<TraceInput> primals;
    for (size_t i = 0; i < rc.shapes.size(); ++i)
      primals.push_back({"x" + std::to_string(i), rc.positive ? at::rand(rc.shapes[i], at::kDouble) + 0.5
                                                              : at::randn(rc.shapes[i], at::kDouble)});
    f(rc.fn, primals, rc.op + " (case " + std::to_string(c) + ")");
  }
  for (size_t c = 0; c < complex_cases().size(); ++c) {
    const ComplexCase& cc = complex_cases()[c];
    at::manual_seed(c);
    std::vector<TraceInput> primals;
    for (size_t i = 0; i < cc.shapes.size(); ++i)
      primals.push_back(
          {"x" + std::to_string(i), at::randn(cc.shapes[i], cc.complex[i] ? at::kComplexDouble : at::kDouble)});
    f(cc.fn, primals, cc.op + " (complex case " + std::to_string(c) + ")");
  }
}

}  // namespace jvpc::test
