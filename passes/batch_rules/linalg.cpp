// Batching rules of products and solves. A product of an unbatched operand (a residual) by a
// batched one is ONE product, K folded into the rows of the left operand or the columns of the
// right one:
//   bmm(a [B,n,k], t [K,B,k,m]):  t as [B,k,K·m], bmm(a, ·) [B,n,K·m], viewed back [K,B,n,m]
//   bmm(t [K,B,n,k], a [B,k,m]):  t as [B,K·n,k], bmm(·, a) [B,K·n,m], viewed back [K,B,n,m]
// so the residual is read once and the matmul FLOPs are exactly K times one call's. Two batched
// operands (a product of two tangents) are one bmm over K·B matrices. A baddbmm / addmm that
// accumulates into a batched self of its result's shape stays one (self folded alike, usually a
// view: the runtime then runs it in place). Triangular and LU solves with a residual
// factorization fold K into the columns (or rows) of their right-hand side.
// Matrix functions (matrix_exp) act on the last two dims, K leading.
#include "passes/batch_rules/rules.h"
#include "ir/op.h"

#include <algorithm>
#include <initializer_list>
#include <numeric>

namespace jvpc::batch_rules {

namespace {

// A batched operand with K folded into its rows or columns: `k_first` says whether K is the outer
// of the two folded dims (K·r) or the inner (r·K).
struct Folded {
  Value* v;
  bool k_first;
};

// v [K, batch..., r, c] as [batch..., K·r, c] (k_first) or [batch..., r·K, c] (rows), as
// [batch..., r, K·c] (k_first) or [batch..., r, c·K] (columns); nullptr where that is not a view of
// v's layout and `copy` is false (nothing emitted), else copied first.
Value* fold_as(Ctx& c, Value* v, bool rows, bool k_first, bool copy) {
  const TensorMeta& m = v->meta();
  const auto& s = m.sizes;
  int64_t R = static_cast<int64_t>(s.size()) - 1;  // logical rank, at least 2
  std::vector<int64_t> perm, sizes;
  for (int64_t d = 1; d <= R - 2; ++d) perm.push_back(d), sizes.push_back(s[static_cast<size_t>(d)]);
  int64_t r = s[static_cast<size_t>(R - 1)], cols = s[static_cast<size_t>(R)];
  if (rows)
    perm.insert(perm.end(),
                k_first ? std::initializer_list<int64_t>{0, R - 1, R} : std::initializer_list<int64_t>{R - 1, 0, R});
  else
    perm.insert(perm.end(),
                k_first ? std::initializer_list<int64_t>{R - 1, 0, R} : std::initializer_list<int64_t>{R - 1, R, 0});
  if (rows)
    sizes.insert(sizes.end(), {c.K * r, cols});
  else
    sizes.insert(sizes.end(), {r, c.K * cols});
  std::vector<int64_t> ps, pt;
  for (int64_t d : perm) ps.push_back(s[static_cast<size_t>(d)]), pt.push_back(m.strides[static_cast<size_t>(d)]);
  if (!view_strides(ps, pt, sizes)) {
    if (!copy) return nullptr;
    // A transposed matrix (contiguous along its rows: a tangent that reaches the product as
    // dkᵀ) is copied as its transpose folded the other way, then transposed back (a view): the
    // copy moves whole contiguous rows instead of gathering every element across the transpose.
    const auto& st = m.strides;
    if (st[static_cast<size_t>(R - 1)] == 1 && st[static_cast<size_t>(R)] != 1 && r > 1) {
      Value* t = c.call(ops::transpose_int, {v, R - 1, R});
      return c.call(ops::transpose_int, {fold_as(c, t, !rows, k_first, true), int64_t{-2}, int64_t{-1}});
    }
  }
  return reshape(c.b, c.call(ops::permute, {v, perm}), sizes);
}

// v folded into rows or columns in the order that is a view of its layout where one is (a
// product's permuted result often is), else copied.
Folded fold(Ctx& c, Value* v, bool rows) {
  if (Value* f = fold_as(c, v, rows, true, false)) return {f, true};
  if (Value* f = fold_as(c, v, rows, false, false)) return {f, false};
  // Copied: rows as r·K, columns as K·c, so that either product's result is laid out
  // [batch..., r, K, c] and a sum of the two (dq·kᵀ + q·dkᵀ) reads both alike.
  return {fold_as(c, v, rows, !rows, true), !rows};
}

// The inverse: a product's result res [batch..., K·r, c] (or r·K, or [.., r, K·c], [.., r, c·K])
// back to [K, batch..., r, c] (a view).
Value* unfold(Ctx& c, Value* res, bool rows, bool k_first) {
  std::vector<int64_t> s = res->meta().sizes;
  int64_t nb = static_cast<int64_t>(s.size()) - 2;
  std::vector<int64_t> sizes(s.begin(), s.end() - 2), perm;
  int64_t r = s[static_cast<size_t>(nb)], cols = s[static_cast<size_t>(nb + 1)];
  int64_t k_at;
  if (rows && k_first)
    sizes.insert(sizes.end(), {c.K, r / c.K, cols}), k_at = nb;
  else if (rows)
    sizes.insert(sizes.end(), {r / c.K, c.K, cols}), k_at = nb + 1;
  else if (k_first)
    sizes.insert(sizes.end(), {r, c.K, cols / c.K}), k_at = nb + 1;
  else
    sizes.insert(sizes.end(), {r, cols / c.K, c.K}), k_at = nb + 2;
  Value* v = c.call(ops::view, {res, sizes});
  perm.push_back(k_at);
  for (int64_t d = 0; d < nb + 3; ++d)
    if (d != k_at) perm.push_back(d);
  return c.call(ops::permute, {v, perm});
}

// a·b by `op` (aten::mm or aten::bmm), either or both batched.
Value* product(Ctx& c, Op op, Value* a, bool ba, Value* b, bool bb) {
  if (ba && bb) {  // two tangents: one product over K times the matrices
    if (std::string(op) == ops::mm) return c.call(ops::bmm, {a, b});
    const auto &sa = a->meta().sizes, &sb = b->meta().sizes;
    Value* p = c.call(ops::bmm, {c.fold_into_first(a), c.fold_into_first(b)});
    return c.call(ops::view, {p, std::vector<int64_t>{c.K, sa[1], sa[2], sb[3]}});
  }
  if (ba) {
    Folded f = fold(c, a, true);
    return unfold(c, c.call(op, {f.v, b}), true, f.k_first);
  }
  Folded f = fold(c, b, false);
  return unfold(c, c.call(op, {a, f.v}), false, f.k_first);
}

// mm / bmm (a, b).
std::vector<Value*> matmul(Ctx& c) { return {product(c, c.n.handle(), c.x(0), c.batched(0), c.x(1), c.batched(1))}; }

// addmm / baddbmm (self, a, b, beta, alpha) = beta·self + alpha·a·b. With a batched self of the
// result's shape and one batched factor (a tangent's dq·kᵀ + q·dkᵀ, fused by fuse-matmul-add),
// still one addmm / baddbmm: self folded like the product's result (a view where its layout
// allows: the first product's result, folded the other way, usually is), the batched factor
// folded in the same order, so the sum accumulates in the product's kernel. Otherwise the
// product batched as above, then the scaled sum (an unbatched self broadcasts).
Rule add_product(Op op) {
  return [op](Ctx& c) -> std::vector<Value*> {
    double beta = c.c(3).isDouble() ? c.c(3).toDouble() : static_cast<double>(c.c(3).toInt());
    double alpha = c.c(4).isDouble() ? c.c(4).toDouble() : static_cast<double>(c.c(4).toInt());
    bool ba = c.batched(1), bb = c.batched(2);
    const std::vector<int64_t>& want = c.n.output(0)->meta().sizes;
    if (c.batched(0) && ba != bb && beta != 0.0 && c.n.tensor_arg(0)->meta().sizes == want) {
      bool rows = ba;  // K into the rows of a batched a, the columns of a batched b
      Value* self = c.x(0);
      Value* factor = ba ? c.x(1) : c.x(2);
      bool k_first = true;
      Value* s = fold_as(c, self, rows, true, false);
      if (!s) {
        k_first = false;
        s = fold_as(c, self, rows, false, false);
      }
      Value* f = nullptr;
      if (s) {
        f = fold_as(c, factor, rows, k_first, true);
      } else {  // self copied in the order that suits the factor
        Folded fo = fold(c, factor, rows);
        f = fo.v;
        k_first = fo.k_first;
        s = fold_as(c, self, rows, k_first, true);
      }
      std::vector<BArg> args = c.args();
      args[0] = s;
      args[ba ? 1 : 2] = f;
      return {unfold(c, c.emit(std::move(args)).at(0), rows, k_first)};
    }
    Value* p = ba || bb ? product(c, op, c.x(1), ba, c.x(2), bb) : c.broadcast(c.call(op, {c.x(1), c.x(2)}));
    if (alpha != 1.0) p = c.call(ops::mul_Scalar, {p, alpha});
    if (beta == 0.0) return {p};
    int64_t rank = static_cast<int64_t>(want.size());
    Value* self = c.batched(0) ? c.pad_to(c.x(0), rank) : c.x(0);
    return {c.call(ops::add_Tensor, {p, self, beta})};
  };
}

// mv(a [n,k], v [k]).
std::vector<Value*> mv(Ctx& c) {
  Value *a = c.x(0), *v = c.x(1);
  if (c.batched(0) && c.batched(1))
    return {c.call(ops::squeeze_dim, {c.call(ops::bmm, {a, c.call(ops::unsqueeze, {v, int64_t(-1)})}), int64_t(-1)})};
  if (c.batched(1))  // [K,k]·aᵀ: one mm
    return {c.call(ops::mm, {v, c.call(ops::t, {a})})};
  const auto& s = a->meta().sizes;
  Value* r = c.call(ops::mv, {reshape(c.b, a, {c.K * s[1], s[2]}), v});
  return {c.call(ops::view, {r, std::vector<int64_t>{c.K, s[1]}})};
}

// dot(a [n], b [n]).
std::vector<Value*> dot(Ctx& c) {
  if (c.batched(0) && c.batched(1))
    return {c.call(ops::sum_dim_IntList, {c.call(ops::mul_Tensor, {c.x(0), c.x(1)}), std::vector<int64_t>{1}})};
  Value* t = c.batched(0) ? c.x(0) : c.x(1);
  Value* x = c.batched(0) ? c.x(1) : c.x(0);
  return {c.call(ops::mv, {t, x})};
}

// convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups): a
// batched input joins the batch dim; a batched weight (groups 1) joins the output channels.
std::vector<Value*> convolution(Ctx& c) {
  if (c.batched(0) && c.batched(1)) return {};
  if (c.n.arg(2).kind == ArgKind::Tensor && c.batched(2)) return {};
  std::vector<BArg> args = c.args();
  std::vector<int64_t> out = c.n.output(0)->meta().sizes;
  if (c.batched(0)) {
    args[0] = c.fold_into_first(c.x(0));
    Value* r = c.call(ops::convolution, std::move(args));
    out.insert(out.begin(), c.K);
    return {reshape(c.b, r, out)};
  }
  // A batched weight: K joins each group's output channels. Non-transposed w is [O, I/g, ...],
  // transposed [I, O/g, ...]; either way the output has g groups of O/g channels.
  if (c.n.arg(2).kind == ArgKind::Tensor) return {};
  bool transposed = c.c(6).toBool();
  int64_t g = c.c(8).toInt();
  Value* w = c.x(1);
  std::vector<int64_t> ws(w->meta().sizes.begin() + 1, w->meta().sizes.end()), spatial(ws.begin() + 2, ws.end());
  int64_t rank = static_cast<int64_t>(ws.size());
  std::vector<int64_t> split, perm, folded;
  if (!transposed) {  // [K, g, O/g, I/g, ...] -> [g, K, O/g, I/g, ...] -> [g·K·O/g, I/g, ...]
    split = {c.K, g, ws[0] / g, ws[1]};
    perm = {1, 0, 2, 3};
    folded = {g * c.K * (ws[0] / g), ws[1]};
  } else {  // [K, g, I/g, O/g, ...] -> [g, I/g, K, O/g, ...] -> [I, K·O/g, ...]
    split = {c.K, g, ws[0] / g, ws[1]};
    perm = {1, 2, 0, 3};
    folded = {ws[0], c.K * ws[1]};
  }
  split.insert(split.end(), spatial.begin(), spatial.end());
  folded.insert(folded.end(), spatial.begin(), spatial.end());
  for (int64_t d = 4; d < rank + 2; ++d) perm.push_back(d);
  Value* wk = c.call(ops::permute, {reshape(c.b, w, split), perm});
  args[1] = reshape(c.b, wk, folded);
  Value* r = c.call(ops::convolution, std::move(args));  // [N, g·K·O/g, ...]
  int64_t per = out[1] / g;
  std::vector<int64_t> parts = {out[0], g, c.K, per};
  parts.insert(parts.end(), out.begin() + 2, out.end());
  std::vector<int64_t> back = {2, 0, 1, 3};
  for (int64_t d = 4; d < static_cast<int64_t>(parts.size()); ++d) back.push_back(d);
  Value* v = c.call(ops::permute, {c.call(ops::view, {r, parts}), back});
  out.insert(out.begin(), c.K);
  return {reshape(c.b, v, out)};
}

// A solve with an unbatched matrix (argument `matrix`) and a batched right-hand side (`rhs`):
// K folded into the rhs's columns (left) or rows (right: X·A = B).
Rule solve(size_t matrix, size_t rhs, std::function<bool(const Ctx&)> left) {
  return [=](Ctx& c) -> std::vector<Value*> {
    for (size_t i = 0; i < c.n.args().size(); ++i)
      if (i != rhs && c.batched(i)) return {};
    if (c.rank(rhs) < 2 || c.rank(matrix) < 2) return {};
    bool l = left(c);
    std::vector<BArg> args = c.args();
    Folded f = fold(c, c.x(rhs), !l);
    args[rhs] = f.v;
    return {unfold(c, c.emit(std::move(args)).at(0), !l, f.k_first)};
  };
}

}  // namespace

// vdot(a, b) = Σ conj(a)·b: dot's rule with a conjugated (a no-op on real operands).
std::vector<Value*> vdot(Ctx& c) {
  Value* a = c.x(0);
  if (c10::isComplexType(a->meta().dtype)) a = c.call(ops::conj_physical, {a});
  if (c.batched(0) && c.batched(1))
    return {c.call(ops::sum_dim_IntList, {c.call(ops::mul_Tensor, {a, c.x(1)}), std::vector<int64_t>{1}})};
  return {c.batched(0) ? c.call(ops::mv, {a, c.x(1)}) : c.call(ops::mv, {c.x(1), a})};
}

// _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim) (bilinear's kernel): each operand
// unsqueezed at its expand dims, the three multiplied and summed over sumdim. Batched, as that
// product and sum with K leading (unbatched operands broadcast over it); elementwise work, no
// matmul.
std::vector<Value*> trilinear(Ctx& c) {
  Value* prod = nullptr;
  for (size_t i = 0; i < 3; ++i) {
    Value* x = c.batched(i) ? c.x(i) : c.call(ops::unsqueeze, {c.x(i), int64_t(0)});
    std::vector<int64_t> expand = c.c(3 + i).toIntVector();
    std::sort(expand.begin(), expand.end());
    for (int64_t d : expand) x = c.call(ops::unsqueeze, {x, d + 1});
    prod = prod ? c.call(ops::mul_Tensor, {prod, x}) : x;
  }
  std::vector<int64_t> sum = c.c(6).toIntVector();
  if (sum.empty()) return {c.call(ops::clone, {prod, c10::MemoryFormat::Contiguous})};
  for (int64_t& d : sum) d += 1;
  return {c.call(ops::sum_dim_IntList, {prod, sum})};
}

void register_linalg(Registry& r) {
  r.add(ops::_trilinear, trilinear);
  r.add(ops::vdot, vdot);
  r.add(ops::mm, matmul);
  r.add(ops::bmm, matmul);
  r.add(ops::addmm, add_product(ops::mm));
  r.add(ops::baddbmm, add_product(ops::bmm));
  r.add(ops::mv, mv);
  r.add(ops::dot, dot);
  r.add(ops::convolution, convolution);
  r.add(ops::linalg_solve_triangular, solve(0, 1, [](const Ctx& c) { return c.c(3).toBool(); }));
  r.add(ops::linalg_lu_solve, solve(0, 2, [](const Ctx& c) { return c.c(3).toBool(); }));
  r.add(ops::cholesky_solve, solve(1, 0, [](const Ctx&) { return true; }));
  // Matrix functions batch over leading dims.
  r.add(ops::linalg_matrix_exp, same_op());
}

}  // namespace jvpc::batch_rules
