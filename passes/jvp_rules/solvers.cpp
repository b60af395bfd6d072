// JVP rules of linear solves and matrix factorizations (real matrices). Each tangent reuses the
// factorization the primal op computed, which fold holds as a residual, so a call costs
// triangular solves and matrix products, never a new factorization:
//
//   X = A⁻¹B (solve)      dX = A⁻¹(dB − dA·X)             lu_solve with the primal's LU
//   A⁻¹ (inv)             d(A⁻¹) = −A⁻¹·dA·A⁻¹
//   det A                 d det = det·tr(A⁻¹dA) = Σ cof(A) ⊙ dA, cof(A) = det·A⁻ᵀ
//   log|det A|            d = Σ A⁻ᵀ ⊙ dA
//   L = chol(A)           dL = L·Φ(L⁻¹·dA·L⁻ᵀ), Φ: the lower triangle, diagonal halved
//   A = V·diag(λ)·Vᵀ      dλ = diag(Vᵀ·dA·V), dV = V·(E ⊙ Vᵀ·dA·V), E_ij = 1/(λ_j − λ_i)
//   exp(A)                the top right block of exp([[A, dA], [0, A]]) (no factorization to
//                         reuse: one exponential of twice the size per call)
//
// as LibTorch's forward AD computes them, except at a singular matrix, where det's tangent is
// the cofactors' (LibTorch's is 0; central differences agree with jvpc). Eigenvectors of
// repeated eigenvalues have no tangent (NaN, as in LibTorch). Ops that read one triangle of
// A see the tangent of that triangle only: triangular solves the triangle itself, cholesky and
// eigh the symmetric matrix it stands for.
#include "passes/jvp_rules/rules.h"

#include <limits>

namespace jvpc::jvp_rules {

namespace {

/// A vector right-hand side [.., n] as a matrix: a column [.., n, 1] (left) or a row [.., 1, n].
Value* as_matrix(Ctx& c, Value* v, bool vector, bool left) {
  return vector && v ? c.call("aten::unsqueeze", {v, left ? -1 : -2}) : v;
}
Value* as_vector(Ctx& c, Value* v, bool vector, bool left) {
  return vector && v ? c.call("aten::squeeze.dim", {v, left ? -1 : -2}) : v;
}

/// dB − dA·X (left) or dB − X·dA (right), either tangent possibly zero; −X is primal (folded).
Value* residual_rhs(Ctx& c, Value* tA, Value* tB, Value* X, bool left) {
  if (!tA) return tB;
  Value* neg_x = c.call("aten::neg", {X});
  return c.add(tB, left ? matmul(c, tA, neg_x) : matmul(c, neg_x, tA));
}

/// The tangent of A as the op reads it: one triangle (strictly, for a unit diagonal).
Value* triangle(Ctx& c, Value* tA, bool upper, bool unit = false) {
  if (!tA) return nullptr;
  return upper ? c.call("aten::triu", {tA, unit ? 1 : 0}) : c.call("aten::tril", {tA, unit ? -1 : 0});
}

/// A symmetric matrix from the triangle `uplo` names ('L' or 'U'): what eigh decomposes.
Value* symmetric_from(Ctx& c, Value* tA, const std::string& uplo) {
  bool upper = uplo == "U" || uplo == "u";
  Value* strict = triangle(c, tA, upper, /*unit=*/true);
  return c.add(triangle(c, tA, upper), mT(c, strict));
}

/// Whether LibTorch's det and slogdet factored Aᵀ rather than A: they do for an A that is
/// contiguous as at::Tensor::is_contiguous() says (strides of size-1 dims do not count), which
/// saves a copy.
bool factored_transpose(const Value* a) { return on_meta(a->meta()).is_contiguous(); }

/// A⁻ᵀ from the LU factorization det and slogdet return.
Value* inverse_transposed(Ctx& c, Value* lu, Value* pivots) {
  const TensorMeta& m = lu->meta();
  Value* eye = c.call("aten::expand", {c.call("aten::eye", {m.sizes.back(), m.dtype, std::nullopt, m.device}), m.sizes});
  return c.call("aten::linalg_lu_solve", {lu, pivots, eye, true, /*adjoint=*/!factored_transpose(c.x(0))});
}

/// The cofactor matrix of A, det(A)·A⁻ᵀ, from its LU factorization: zero pivots are replaced
/// by epsilon, and det is that of the perturbed factors, so a singular A gets (up to O(eps)) its
/// cofactors, the limit, rather than 0·inf.
Value* cofactors(Ctx& c, Value* lu, Value* pivots) {
  const TensorMeta& m = lu->meta();
  double eps = m.dtype == c10::kDouble ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
  Value* diagonal = c.call("aten::diagonal", {lu, 0, -2, -1});
  diagonal = c.call("aten::masked_fill.Scalar", {diagonal, c.call("aten::eq.Scalar", {diagonal, 0}), eps});
  Value* perturbed = c.call("aten::diagonal_scatter", {lu, diagonal, 0, -2, -1});
  // det = Π diag(U) · (−1)^(rows swapped); pivots are 1-based row numbers
  int64_t n = m.sizes.back();
  Value* rows = c.call("aten::arange.start", {1, n + 1, pivots->meta().dtype, std::nullopt, m.device});
  Value* swapped = c.call("aten::ne.Tensor", {pivots, rows});
  Value* sign = c.call("aten::rsub.Scalar", {c.call("aten::mul.Scalar", {c.call("aten::_to_copy", {swapped, m.dtype}), 2}), 1});
  Value* det = c.call("aten::mul.Tensor", {c.call("aten::prod.dim_int", {diagonal, -1, true}), c.call("aten::prod.dim_int", {sign, -1, true})});
  return c.call("aten::mul.Tensor", {inverse_transposed(c, perturbed, pivots), c.call("aten::unsqueeze", {det, -1})});
}

/// Σ over the last two dims of t ⊙ f.
Value* frobenius(Ctx& c, Value* t, Value* f) {
  return c.call("aten::sum.dim_IntList", {c.mul(t, f), std::vector<int64_t>{-2, -1}});
}

// _linalg_solve_ex(A, B, left, check_errors) -> (X, LU, pivots, info)
std::vector<Value*> solve(Ctx& c) {
  if (!c.t(0) && !c.t(1)) return {};
  bool left = c.c(2).toBool();
  bool vector = c.out()->meta().sizes.size() + 1 == c.x(0)->meta().sizes.size();
  Value* X = as_matrix(c, c.out(0), vector, left);
  Value* rhs = residual_rhs(c, c.t(0), as_matrix(c, c.t(1), vector, left), X, left);
  Value* dX = c.call("aten::linalg_lu_solve", {c.out(1), c.out(2), rhs, left, false});
  return {as_vector(c, dX, vector, left)};
}

// linalg_solve_triangular(A, B, upper, left, unitriangular) -> X
std::vector<Value*> solve_triangular(Ctx& c) {
  if (!c.t(0) && !c.t(1)) return {};
  bool upper = c.c(2).toBool(), left = c.c(3).toBool(), unit = c.c(4).toBool();
  Value* rhs = residual_rhs(c, triangle(c, c.t(0), upper, unit), c.t(1), c.out(), left);
  return c.reapply(1, rhs);
}

// linalg_cholesky_ex(A, upper, check_errors) -> (L, info), reading A's lower triangle (upper:
// returning U = Lᵀ, reading the upper one).
std::vector<Value*> cholesky(Ctx& c) {
  if (!c.t(0)) return {};
  bool upper = c.c(1).toBool();
  Value* L = upper ? mT(c, c.out()) : c.out();
  Value* dA = symmetric_from(c, c.t(0), upper ? "U" : "L");
  Value* s = c.call("aten::linalg_solve_triangular", {L, dA, false, true, false});
  s = c.call("aten::linalg_solve_triangular", {mT(c, L), s, true, false, false});
  Value* half_diagonal = c.call("aten::diag_embed", {c.call("aten::mul.Scalar", {c.call("aten::diagonal", {s, 0, -2, -1}), 0.5}), 0, -2, -1});
  Value* dL = matmul(c, L, c.call("aten::sub.Tensor", {c.call("aten::tril", {s, 0}), half_diagonal}));
  return {upper ? mT(c, dL) : dL};
}

// cholesky_solve(B, L, upper) -> X = A⁻¹B with A = L·Lᵀ (upper: Uᵀ·U), from the triangle of L
// the op reads: dA = dL·Lᵀ + L·dLᵀ, and dX = A⁻¹(dB − dA·X), another cholesky_solve.
std::vector<Value*> cholesky_solve(Ctx& c) {
  if (!c.t(0) && !c.t(1)) return {};
  bool upper = c.c(2).toBool();
  Value* dA = nullptr;
  if (Value* dL = triangle(c, c.t(1), upper)) {
    Value* L = triangle(c, c.x(1), upper);  // primal: folded
    Value* half = upper ? matmul(c, mT(c, dL), L) : matmul(c, dL, mT(c, L));  // dL·Lᵀ (upper: dUᵀ·U)
    dA = c.call("aten::add.Tensor", {half, mT(c, half)});
  }
  return c.reapply(0, residual_rhs(c, dA, c.t(0), c.out(), /*left=*/true));
}

// _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues, eigenvectors)
std::vector<Value*> eigh(Ctx& c) {
  if (!c.t(0)) return {};
  bool vectors = c.c(2).toBool();
  Value *w = c.out(0), *V = vectors ? c.out(1) : c.b.emit("aten::_linalg_eigh", {c.x(0), c.a(1), true}).at(1);
  Value* M = matmul(c, matmul(c, mT(c, V), symmetric_from(c, c.t(0), c.c(1).toStringRef())), V);
  Value* dw = c.call("aten::diagonal", {M, 0, -2, -1});
  if (!vectors) return {dw};
  // E_ij = 1/(λ_j − λ_i) off the diagonal, 0 on it
  Value* gaps = c.call("aten::sub.Tensor", {c.call("aten::unsqueeze", {w, -2}), c.call("aten::unsqueeze", {w, -1})});
  Value* E = c.call("aten::reciprocal", {gaps});
  int64_t n = w->meta().sizes.back();
  Value* eye = c.call("aten::eye", {n, c10::kBool, std::nullopt, w->meta().device});
  E = c.call("aten::masked_fill.Scalar", {E, eye, 0.0});
  return {dw, matmul(c, V, c.mul(M, E))};
}

}  // namespace

void register_solvers(Registry& r) {
  r.add("aten::_linalg_solve_ex", solve);
  r.add("aten::linalg_solve_triangular", solve_triangular);
  r.add("aten::linalg_inv_ex", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    Value* inv = c.out();
    return {matmul(c, matmul(c, c.call("aten::neg", {inv}), c.t(0)), inv)};
  });
  r.add("aten::_linalg_det", [](Ctx& c) -> std::vector<Value*> {  // -> (det, LU, pivots)
    if (!c.t(0)) return {};
    return {frobenius(c, c.t(0), cofactors(c, c.out(1), c.out(2)))};
  });
  r.add("aten::_linalg_slogdet", [](Ctx& c) -> std::vector<Value*> {  // -> (sign, logabsdet, LU, pivots)
    if (!c.t(0)) return {};
    return {nullptr, frobenius(c, c.t(0), inverse_transposed(c, c.out(2), c.out(3)))};
  });
  r.add("aten::linalg_cholesky_ex", cholesky);
  r.add("aten::cholesky", cholesky);  // the legacy form: (A, upper) -> L
  r.add("aten::cholesky_solve", cholesky_solve);
  r.add("aten::_linalg_eigh", eigh);
  r.add("aten::linalg_matrix_exp", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    Value* A = c.x(0);
    int64_t n = A->meta().sizes.back();
    Value* top = c.call("aten::cat", {std::vector<Value*>{A, c.t(0)}, -1});
    Value* bottom = c.call("aten::cat", {std::vector<Value*>{c.zeros_like(A), A}, -1});
    Value* e = c.call("aten::linalg_matrix_exp", {c.call("aten::cat", {std::vector<Value*>{top, bottom}, -2})});
    return {c.call("aten::slice.Tensor", {c.call("aten::slice.Tensor", {e, -2, 0, n}), -1, n, 2 * n})};
  });
}

}  // namespace jvpc::jvp_rules
