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
//   A = U·diag(s)·Vᵀ      dP = Uᵀ·dA·V, ds = diag(dP), dU = U·(F ⊙ (dP·S + S·dPᵀ)),
//                         dVᵀ = −(F ⊙ (S·dP + dPᵀ·S))·Vᵀ, F_jk = 1/(s_k² − s_j²), plus the
//                         parts outside U's (m > n) or V's (m < n) span
//   A = Q·R (m ≥ n)       with M = Qᵀ·dA·R⁻¹ (skew Qᵀ·dQ plus upper triangular dR·R⁻¹):
//                         dR = (triu(M) + triu(Mᵀ, 1))·R, dQ = dA·R⁻¹ − Q·dR·R⁻¹
//   A = P·L·U             L⁻¹·Pᵀ·dA·U⁻¹ = L⁻¹dL + dU·U⁻¹, split into its strict lower and upper parts
//   A⁺ (pinv)             dA⁺ = −A⁺·dA·A⁺ + A⁺A⁺ᵀ·dAᵀ·(I − AA⁺) + (I − A⁺A)·dAᵀ·A⁺ᵀA⁺; lstsq's
//                         solution A⁺B has tangent dA⁺·B + A⁺·dB
//
// as LibTorch's forward AD computes them, except at a singular matrix, where det's tangent is
// the cofactors' (LibTorch's is 0; central differences agree with jvpc), and where LibTorch
// refuses: qr in mode 'r' and svdvals get Q, U and V from the op run again (fold runs it once).
// Eigenvectors of repeated eigenvalues and singular vectors of repeated singular values have no
// tangent (NaN, as in LibTorch); pinv and lstsq hold at constant rank. Ops that read one triangle of
// A see the tangent of that triangle only: triangular solves the triangle itself, cholesky and
// eigh the symmetric matrix it stands for.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include <algorithm>
#include <limits>

namespace jvpc::jvp_rules {

namespace {

/// A vector right-hand side [.., n] as a matrix: a column [.., n, 1] (left) or a row [.., 1, n].
Value* as_matrix(Ctx& c, Value* v, bool vector, bool left) { return vector ? c.unsqueeze(v, left ? -1 : -2) : v; }
Value* as_vector(Ctx& c, Value* v, bool vector, bool left) {
  return vector && v ? c.call(ops::squeeze_dim, {v, left ? -1 : -2}) : v;
}

/// dB − dA·X (left) or dB − X·dA (right), either tangent possibly zero; −X is primal (folded).
Value* residual_rhs(Ctx& c, Value* tA, Value* tB, Value* X, bool left) {
  if (!tA) return tB;
  Value* neg_x = c.neg(X);
  return c.add(tB, left ? c.matmul(tA, neg_x) : c.matmul(neg_x, tA));
}

/// The tangent of A as the op reads it: one triangle (strictly, for a unit diagonal).
Value* triangle(Ctx& c, Value* tA, bool upper, bool unit = false) {
  if (!tA) return nullptr;
  return upper ? c.call(ops::triu, {tA, unit ? 1 : 0}) : c.call(ops::tril, {tA, unit ? -1 : 0});
}

/// The tangent of A = L·Lᵀ (upper: Uᵀ·U) from argument `arg`'s triangle L, the one the op
/// reads, given its tangent t: dL·Lᵀ + L·dLᵀ.
Value* gram_tangent(Ctx& c, size_t arg, Value* t, bool upper) {
  Value* dL = triangle(c, t, upper);
  Value* L = triangle(c, c.x(arg), upper);  // primal: folded
  Value* half = upper ? c.matmul(mT(c, dL), L) : c.matmul(dL, mT(c, L));
  return c.add(half, mT(c, half));
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
  Value* eye = c.call(ops::expand, {c.call(ops::eye, {m.sizes.back(), m.dtype, std::nullopt, m.device}), m.sizes});
  return c.call(ops::linalg_lu_solve, {lu, pivots, eye, true, /*adjoint=*/!factored_transpose(c.x(0))});
}

/// The cofactor matrix of A, det(A)·A⁻ᵀ, from its LU factorization: zero pivots are replaced
/// by epsilon, and det is that of the perturbed factors, so a singular A gets (up to O(eps)) its
/// cofactors, the limit, rather than 0·inf.
Value* cofactors(Ctx& c, Value* lu, Value* pivots) {
  const TensorMeta& m = lu->meta();
  double eps = m.dtype == c10::kDouble ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
  Value* diagonal = c.call(ops::diagonal, {lu, 0, -2, -1});
  diagonal = c.masked_fill(diagonal, c.eq(diagonal, 0), eps);
  Value* perturbed = c.call(ops::diagonal_scatter, {lu, diagonal, 0, -2, -1});
  // det = Π diag(U) · (−1)^(rows swapped); pivots are 1-based row numbers
  int64_t n = m.sizes.back();
  Value* rows = c.call(ops::arange_start, {1, n + 1, pivots->meta().dtype, std::nullopt, m.device});
  Value* swapped = c.call(ops::ne_Tensor, {pivots, rows});
  Value* sign = c.sub(1, c.scale(c.cast(swapped, m.dtype), 2));
  Value* det = c.mul(c.call(ops::prod_dim_int, {diagonal, -1, true}), c.call(ops::prod_dim_int, {sign, -1, true}));
  return c.mul(inverse_transposed(c, perturbed, pivots), c.unsqueeze(det, -1));
}

/// The matrix of 1/(w_k − w_j) at [j, k] off the diagonal, 0 on it (eigh's and svd's gaps).
Value* inverse_gaps(Ctx& c, Value* w) {
  Value* E = c.recip(c.sub(c.unsqueeze(w, -2), c.unsqueeze(w, -1)));
  Value* eye = c.call(ops::eye, {w->meta().sizes.back(), c10::kBool, std::nullopt, w->meta().device});
  return c.masked_fill(E, eye, 0.0);
}

Value* diagonal(Ctx& c, Value* v) { return c.call(ops::diagonal, {v, 0, -2, -1}); }
/// I − a·b for primal a [.., m, k] and b [.., k, m] (a projection's complement).
Value* complement(Ctx& c, Value* a, Value* b) {
  const TensorMeta& m = a->meta();
  return c.sub(c.call(ops::eye, {m.sizes.end()[-2], m.dtype, std::nullopt, m.device}), c.matmul(a, b));
}

/// Σ over the last two dims of t ⊙ f.
Value* frobenius(Ctx& c, Value* t, Value* f) { return c.sum(c.mul(t, f), {-2, -1}); }

// _linalg_solve_ex(A, B, left, check_errors) -> (X, LU, pivots, info)
std::vector<Value*> solve(Ctx& c) {
  if (!c.t(0) && !c.t(1)) return {};
  bool left = c.c(2).toBool();
  bool vector = c.out()->meta().sizes.size() + 1 == c.x(0)->meta().sizes.size();
  Value* X = as_matrix(c, c.out(0), vector, left);
  Value* rhs = residual_rhs(c, c.t(0), as_matrix(c, c.t(1), vector, left), X, left);
  Value* dX = c.call(ops::linalg_lu_solve, {c.out(1), c.out(2), rhs, left, false});
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
Value* cholesky(Ctx& c, Value* t) {
  bool upper = c.c(1).toBool();
  Value* L = upper ? mT(c, c.out()) : c.out();
  Value* dA = symmetric_from(c, t, upper ? "U" : "L");
  Value* s = c.call(ops::linalg_solve_triangular, {L, dA, false, true, false});
  s = c.call(ops::linalg_solve_triangular, {mT(c, L), s, true, false, false});
  Value* half_diagonal = c.call(ops::diag_embed, {c.scale(c.call(ops::diagonal, {s, 0, -2, -1}), 0.5), 0, -2, -1});
  Value* dL = c.matmul(L, c.sub(c.call(ops::tril, {s, 0}), half_diagonal));
  return upper ? mT(c, dL) : dL;
}

// cholesky_solve(B, L, upper) -> X = A⁻¹B with A = L·Lᵀ (upper: Uᵀ·U), from the triangle of L
// the op reads: dA = dL·Lᵀ + L·dLᵀ, and dX = A⁻¹(dB − dA·X), another cholesky_solve.
std::vector<Value*> cholesky_solve(Ctx& c) {
  if (!c.t(0) && !c.t(1)) return {};
  Value* dA = c.per_arg({{}, [](Ctx& c, Value* t) { return gram_tangent(c, 1, t, c.c(2).toBool()); }});
  return c.reapply(0, residual_rhs(c, dA, c.t(0), c.out(), /*left=*/true));
}

/// diag(Xᵀ·dA·Y) for primal X [.., m, k] and Y [.., n, k], in one matmul: Σᵢ X ⊙ (dA·Y) over
/// rows, or Σ (Xᵀ·dA) ⊙ Yᵀ over columns where n > m (eigenvalues', singular values' tangents).
Value* diag_of_product(Ctx& c, Value* X, Value* dA, Value* Y) {
  const std::vector<int64_t>& sizes = dA->meta().sizes;
  if (sizes.back() > sizes.end()[-2]) return c.sum(c.mul(c.matmul(mT(c, X), dA), mT(c, Y)), {-1});
  return c.sum(c.mul(c.matmul(dA, Y), X), {-2});
}

// _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues, eigenvectors)
std::vector<Value*> eigh(Ctx& c, Value* t) {
  bool vectors = c.c(2).toBool();
  Value *w = c.out(0), *V = vectors ? c.out(1) : c.b.emit(ops::_linalg_eigh, {c.x(0), c.a(1), true}).at(1);
  Value* dA = symmetric_from(c, t, c.c(1).toStringRef());
  if (!vectors) return {diag_of_product(c, V, dA, V)};
  Value* M = c.matmul(mT(c, V), c.matmul(dA, V));
  return {diagonal(c, M), c.matmul(V, c.mul(M, inverse_gaps(c, w)))};
}

// _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh), A [.., m, n], k = min(m, n).
// With dP = Uᵀ·dA·V and G = F ⊙ S (G_jk = s_k / (s_k² − s_j²), 0 on the diagonal):
//   dS = diag(dP), dU = U·(G ⊙ dP − (G ⊙ dP)ᵀ), dVᵀ = (Gᵀ ⊙ dP − (Gᵀ ⊙ dP)ᵀ)·Vᵀ,
// plus (I − U·Uᵀ)·dA·V·S⁻¹ for m > n, whose U·Uᵀ·dA·V is U·dP (no extra product), and
// S⁻¹·Uᵀ·dA·(I − V·Vᵀ) for m < n.
std::vector<Value*> svd(Ctx& c, Value* dA) {
  bool full = c.c(1).toBool(), vectors = c.c(2).toBool();
  const std::vector<int64_t>& sizes = c.x(0)->meta().sizes;
  int64_t m = sizes.end()[-2], n = sizes.back(), k = std::min(m, n);
  Value *U = c.out(0), *S = c.out(1), *Vh = c.out(2);
  if (!vectors) {  // svdvals: the vectors from the op run again (folded)
    std::vector<Value*> usv = c.b.emit(ops::_linalg_svd, {c.x(0), false, true, c.a(3)});
    return {nullptr, diag_of_product(c, usv[0], dA, mT(c, usv[2]))};
  }
  if (full) U = narrow(c, U, -1, 0, k), Vh = narrow(c, Vh, -2, 0, k);
  Value *V = mT(c, Vh), *Ut = mT(c, U);
  Value* inv_s = c.recip(S);
  // dA·V (m ≥ n) or Uᵀ·dA (m < n): the smaller, and the one the part outside the span needs
  Value* half = m >= n ? c.matmul(dA, V) : c.matmul(Ut, dA);
  Value* dP = m >= n ? c.matmul(Ut, half) : c.matmul(half, V);
  Value* G = c.mul(inverse_gaps(c, c.mul(S, S)), c.unsqueeze(S, -2));
  Value* GdP = c.mul(dP, G);
  Value* GtdP = c.mul(dP, mT(c, G));
  Value* dU_core = c.sub(GdP, mT(c, GdP));
  Value* dVh_core = c.sub(GtdP, mT(c, GtdP));
  Value *dU, *dVh;
  if (m > n) {  // dU = dA·V·S⁻¹ + U·(core − dP·S⁻¹)
    Value* scaled = c.unsqueeze(inv_s, -2);
    dU = c.add(c.mul(half, scaled), c.matmul(U, c.sub(dU_core, c.mul(dP, scaled))));
    if (full) {  // U₂, a basis of the rest: dU₂ = −U₁·(dU₁ᵀ·U₂), which keeps [U₁ U₂] orthogonal and
                 // gives the projector U₂U₂ᵀ its tangent −d(U₁U₁ᵀ) (LibTorch's forward AD gives 0)
      Value* dU2 = c.neg(c.matmul(U, c.matmul(mT(c, dU), narrow(c, c.out(0), -1, k, m - k))));
      dU = c.call(ops::cat, {std::vector<Value*>{dU, dU2}, -1});
    }
  } else {
    dU = c.matmul(U, dU_core);
  }
  if (m < n) {  // dVᵀ = S⁻¹·Uᵀ·dA + (core − S⁻¹·dP)·Vᵀ
    Value* scaled = c.unsqueeze(inv_s, -1);
    dVh = c.add(c.mul(half, scaled), c.matmul(c.sub(dVh_core, c.mul(dP, scaled)), Vh));
    if (full) {  // the rows of Vᵀ past k likewise: dVᵀ₂ = −(Vᵀ₂·dVᵀ₁ᵀ)·Vᵀ₁
      Value* dVh2 = c.neg(c.matmul(c.matmul(narrow(c, c.out(2), -2, k, n - k), mT(c, dVh)), Vh));
      dVh = c.call(ops::cat, {std::vector<Value*>{dVh, dVh2}, -2});
    }
  } else {
    dVh = c.matmul(dVh_core, Vh);
  }
  return {dU, diagonal(c, dP), dVh};
}

// linalg_qr(A, mode) -> (Q, R)
std::vector<Value*> qr(Ctx& c, Value* dA) {
  const std::string& mode = c.c(1).toStringRef();
  const std::vector<int64_t>& sizes = c.x(0)->meta().sizes;
  int64_t m = sizes.end()[-2], n = sizes.back();
  if (mode == "complete" && m > n)
    throw Error("Q of a complete QR of a matrix with more rows than columns has no tangent (use mode='reduced')");
  Value *Q = c.out(0), *R = c.out(1);
  if (mode == "r") Q = c.b.emit(ops::linalg_qr, {c.x(0), std::string("reduced")}).at(0);  // folded
  if (m >= n) {
    // M = Qᵀ·dA·R⁻¹ = Qᵀ·dQ + dR·R⁻¹, skew plus upper triangular: dR·R⁻¹ = triu(M) + triu(Mᵀ, 1)
    Value* dA_Rinv = c.call(ops::linalg_solve_triangular, {R, dA, true, false, false});
    Value* M = c.matmul(mT(c, Q), dA_Rinv);
    Value* dR_Rinv = c.add(c.call(ops::triu, {M, 0}), c.call(ops::triu, {mT(c, M), 1}));
    Value* dQ = c.sub(dA_Rinv, c.matmul(Q, dR_Rinv));
    return {mode == "r" ? nullptr : dQ, c.matmul(dR_Rinv, R)};
  }
  // m < n: Qᵀ·dQ is the skew matrix whose strict lower triangle is that of Qᵀ·dA₁·R₁⁻¹ (the
  // first m columns), and dR = Qᵀ·dA − Qᵀ·dQ·R
  Value* QtdA = c.matmul(mT(c, Q), dA);
  Value* X =
      c.call(ops::linalg_solve_triangular, {narrow(c, R, -1, 0, m), narrow(c, QtdA, -1, 0, m), true, false, false});
  Value* lower = c.call(ops::tril, {X, -1});
  Value* QtdQ = c.sub(lower, mT(c, lower));
  return {mode == "r" ? nullptr : c.matmul(Q, QtdQ), c.sub(QtdA, c.matmul(QtdQ, R))};
}

/// The tangents of L [.., m, k] and U [.., k, n] of A = P·L·U, L unit lower triangular, U upper
/// (LibTorch's lu_factor_ex_jvp): the leading k × k block of L⁻¹·Pᵀ·dA·U⁻¹ gives dL's and dU's
/// leading blocks; the rest of the taller (or wider) factor follows from A's other rows (columns).
std::pair<Value*, Value*> lu_tangents(Ctx& c, Value* P, Value* L, Value* U, Value* dA) {
  const std::vector<int64_t>& sizes = dA->meta().sizes;
  int64_t m = sizes.end()[-2], n = sizes.back(), k = std::min(m, n);
  Value* PtdA = P->meta().numel() == 0 ? dA : c.matmul(mT(c, P), dA);  // no pivoting (CUDA): P is empty
  Value *L1 = m > k ? narrow(c, L, -2, 0, k) : L, *U1 = n > k ? narrow(c, U, -1, 0, k) : U;
  Value* X = c.call(ops::linalg_solve_triangular, {L1, m > k ? narrow(c, PtdA, -2, 0, k) : PtdA, false, true, true});
  if (n > k) X = narrow(c, X, -1, 0, k);
  X = c.call(ops::linalg_solve_triangular, {U1, X, true, false, false});
  Value* dL1 = c.matmul(L1, c.call(ops::tril, {X, -1}));
  Value* dU1 = c.matmul(c.call(ops::triu, {X, 0}), U1);
  Value *dL = dL1, *dU = dU1;
  if (m > k) {  // dL₂ = (Pᵀ·dA)₂·U⁻¹ − L₂·dU·U⁻¹
    Value* rest = c.sub(narrow(c, PtdA, -2, k, m - k), c.matmul(narrow(c, L, -2, k, m - k), dU1));
    dL = c.call(ops::cat,
                {std::vector<Value*>{dL1, c.call(ops::linalg_solve_triangular, {U1, rest, true, false, false})}, -2});
  } else if (n > k) {  // dU₂ = L⁻¹·((Pᵀ·dA)₂ − dL·U₂)
    Value* rest = c.sub(narrow(c, PtdA, -1, k, n - k), c.matmul(dL1, narrow(c, U, -1, k, n - k)));
    dU = c.call(ops::cat,
                {std::vector<Value*>{dU1, c.call(ops::linalg_solve_triangular, {L1, rest, false, true, true})}, -1});
  }
  return {dL, dU};
}

/// dA⁺·B for the pseudoinverse P [.., n, m] of A [.., m, n], with B primal (nullptr: the
/// identity, dA⁺ itself): −P·dA·(P·B) + P·Pᵀ·dAᵀ·((I − A·P)·B) + (I − P·A)·dAᵀ·(Pᵀ·P·B). A
/// truncated pinv (small singular values dropped) is that of the truncated A = P⁺, whose
/// projections the complements are (not A's own, which keep the dropped directions).
Value* pinv_tangent(Ctx& c, Value* P, Value* dA, Value* B) {
  auto times_b = [&](Value* f) { return B ? c.matmul(f, B) : f; };
  Value* A = c.call(ops::linalg_pinv_atol_rtol_tensor, {P, std::nullopt, std::nullopt, false});  // folded
  Value *Pt = mT(c, P), *dAt = mT(c, dA);
  Value* t1 = c.matmul(c.neg(P), c.matmul(dA, times_b(P)));
  Value* t2 = c.matmul(c.matmul(P, Pt), c.matmul(dAt, times_b(complement(c, A, P))));
  Value* t3 = c.matmul(complement(c, P, A), c.matmul(dAt, times_b(c.matmul(Pt, P))));
  return c.add(c.add(t1, t2), t3);
}

// linalg_lu_solve(LU, pivots, B, left, adjoint) -> X = A⁻¹B for A = P·L·U: linear in B; in LU
// (left, not adjoint), dX = −A⁻¹·P·(dL·U + L·dU)·X = −U⁻¹·(L⁻¹·dL·(U·X) + dU·X), with the
// triangular solves reading LU's triangles as the op does.
Value* lu_solve_term(Ctx& c, Value* dLU) {
  if (!c.c(3).toBool() || c.c(4).toBool()) throw Error("no tangent through LU for left=false or adjoint=true");
  Value *LU = c.x(0), *X = c.out();
  Value* UX = c.matmul(c.call(ops::triu, {LU, 0}), X);  // folded
  Value* a = c.call(ops::linalg_solve_triangular, {LU, c.matmul(c.call(ops::tril, {dLU, -1}), UX), false, true, true});
  Value* b = c.add(a, c.matmul(c.call(ops::triu, {dLU, 0}), X));
  return c.neg(c.call(ops::linalg_solve_triangular, {LU, b, true, true, false}));
}

// linalg_lstsq(A, B, rcond, driver) -> (solution, residuals, rank, singular_values); residuals
// and singular values are empty unless the driver computes them.
std::vector<Value*> lstsq(Ctx& c) {
  if (!c.t(0) && !c.t(1)) return {};
  Value *A = c.x(0), *dA = c.t(0);
  bool vector = c.x(1)->meta().sizes.size() + 1 == A->meta().sizes.size();
  Value *B = as_matrix(c, c.x(1), vector, true), *dB = as_matrix(c, c.t(1), vector, true);
  // A⁺ with lstsq's cut-off: singular values below rcond·s_max count as zero (the default is
  // pinv's too, eps·max(m, n)); folded
  BArg rtol = std::nullopt;
  if (!c.c(2).isNone())
    rtol = c.call(ops::scalar_tensor, {c.c(2).toDouble(), c10::toRealValueType(A->meta().dtype), std::nullopt,
                                       A->meta().device, std::nullopt});
  Value* P = c.call(ops::linalg_pinv_atol_rtol_tensor, {A, std::nullopt, rtol, false});
  Value* dX = c.per_arg({[&](Ctx&, Value* t) { return pinv_tangent(c, P, t, B); },
                         [&](Ctx&, Value* t) { return c.matmul(P, as_matrix(c, t, vector, true)); }});
  std::vector<Value*> out = {as_vector(c, dX, vector, true), nullptr, nullptr, nullptr};
  if (c.out(1)->meta().numel() > 0) {  // Σ‖A·X − B‖² per column: 2·Σ r ⊙ (dA·X − dB), as r ⟂ A's columns
    Value* X = as_matrix(c, c.out(0), vector, true);
    Value* r = c.scale(c.sub(c.matmul(A, X), B), 2);
    Value* dr = c.sub(c.matmul(dA, X), dB);
    out[1] = c.sum(c.mul(dr, r), {-2});
  }
  if (c.out(3)->meta().numel() > 0 && dA) {  // A's singular values
    std::vector<Value*> usv = c.b.emit(ops::_linalg_svd, {A, false, true, std::nullopt});
    out[3] = diag_of_product(c, usv[0], dA, mT(c, usv[2]));
  }
  return out;
}

}  // namespace

void register_solvers(Registry& r) {
  r.add(ops::_linalg_solve_ex, solve);
  r.add(ops::linalg_solve_triangular, solve_triangular);
  r.add(ops::linalg_inv_ex, per_arg({[](Ctx& c, Value* t) {  // −A⁻¹·dA·A⁻¹
          Value* inv = c.out();
          return c.matmul(c.matmul(c.neg(inv), t), inv);
        }}));
  r.add(ops::_linalg_det, per_arg({[](Ctx& c, Value* t) {  // -> (det, LU, pivots)
          return frobenius(c, t, cofactors(c, c.out(1), c.out(2)));
        }}));
  // -> (sign, logabsdet, LU, pivots)
  r.add(ops::_linalg_slogdet, per_arg_outputs({[](Ctx& c, Value* t) -> std::vector<Value*> {
          return {nullptr, frobenius(c, t, inverse_transposed(c, c.out(2), c.out(3)))};
        }}));
  r.add(ops::linalg_cholesky_ex, per_arg({cholesky}));
  r.add(ops::cholesky, per_arg({cholesky}));  // the legacy form: (A, upper) -> L
  r.add(ops::cholesky_solve, cholesky_solve);
  r.add(ops::_linalg_eigh, per_arg_outputs({eigh}));
  r.add(ops::_linalg_svd, per_arg_outputs({svd}));
  r.add(ops::linalg_qr, per_arg_outputs({qr}));
  r.add(ops::linalg_lu_factor_ex, per_arg({[](Ctx& c, Value* t) {  // -> (LU, pivots, info)
          std::vector<Value*> plu = c.b.emit(ops::lu_unpack, {c.out(0), c.out(1), true, true});  // folded
          auto [dL, dU] = lu_tangents(c, plu[0], plu[1], plu[2], t);
          // packed as LU is: dL is strictly lower (L's diagonal is 1), dU upper; the smaller padded
          const std::vector<int64_t>& sizes = c.out(0)->meta().sizes;
          int64_t m = sizes.end()[-2], n = sizes.back(), k = std::min(m, n);
          if (m > k)
            dU = c.call(ops::cat, {std::vector<Value*>{dU, c.zeros_like(narrow(c, c.out(0), -2, k, m - k))}, -2});
          if (n > k)
            dL = c.call(ops::cat, {std::vector<Value*>{dL, c.zeros_like(narrow(c, c.out(0), -1, k, n - k))}, -1});
          return c.add(dL, dU);
        }}));
  r.add(ops::linalg_lu_solve, per_arg({lu_solve_term, {}, [](Ctx& c, Value* t) { return c.reapply(2, t).at(0); }}));
  // (LU, pivots, unpack_data, unpack_pivots) -> (P, L, U): linear in LU
  r.add(ops::lu_unpack, per_arg_outputs({[](Ctx& c, Value* t) -> std::vector<Value*> {
          if (!c.c(2).toBool()) return {};
          const std::vector<int64_t>& sizes = c.x(0)->meta().sizes;
          int64_t k = std::min(sizes.end()[-2], sizes.back());
          return {nullptr, c.call(ops::tril, {narrow(c, t, -1, 0, k), -1}),
                  c.call(ops::triu, {narrow(c, t, -2, 0, k), 0})};
        }}));
  r.add(ops::linalg_lu, per_arg_outputs({[](Ctx& c, Value* t) -> std::vector<Value*> {  // (A, pivot) -> (P, L, U)
          auto [dL, dU] = lu_tangents(c, c.out(0), c.out(1), c.out(2), t);
          return {nullptr, dL, dU};
        }}));
  r.add(ops::linalg_pinv_atol_rtol_tensor, per_arg({[](Ctx& c, Value* t) {
          // hermitian: the op reads A's lower triangle (as eigh does), so its tangent is the symmetric
          // matrix that triangle stands for (LibTorch's forward AD takes the whole tangent)
          return pinv_tangent(c, c.out(), c.c(3).toBool() ? symmetric_from(c, t, "L") : t, nullptr);
        }}));
  r.add(ops::linalg_lstsq, lstsq);
  r.add(ops::cholesky_inverse, per_arg({[](Ctx& c, Value* t) {  // (L, upper) -> (L·Lᵀ)⁻¹ (upper: (Uᵀ·U)⁻¹)
          Value* inv = c.out();
          return c.matmul(c.matmul(c.neg(inv), gram_tangent(c, 0, t, c.c(1).toBool())), inv);
        }}));
  r.add(ops::linalg_matrix_exp, per_arg({[](Ctx& c, Value* t) {  // exp([[A, dA], [0, A]])'s top right block
          Value* A = c.x(0);
          int64_t n = A->meta().sizes.back();
          Value* top = c.call(ops::cat, {std::vector<Value*>{A, t}, -1});
          Value* bottom = c.call(ops::cat, {std::vector<Value*>{c.zeros_like(A), A}, -1});
          Value* e = c.call(ops::linalg_matrix_exp, {c.call(ops::cat, {std::vector<Value*>{top, bottom}, -2})});
          return c.call(ops::slice_Tensor, {c.call(ops::slice_Tensor, {e, -2, 0, n}), -1, n, 2 * n});
        }}));
}

}  // namespace jvpc::jvp_rules
