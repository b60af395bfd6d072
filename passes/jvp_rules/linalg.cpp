// JVP rules of matrix products, distances and convolutions. Products are bilinear:
// d(x·y) = dx·y + x·dy, and a zero tangent drops its term, so a product with one differentiated
// operand costs one matmul.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

namespace jvpc::jvp_rules {

namespace {

using Product = std::function<Value*(Ctx&, Value*, Value*)>;

Product op(Op name) {
  return [name](Ctx& c, Value* a, Value* b) { return c.call(name, {a, b}); };
}

// addmm / baddbmm / addbmm / addmv / addr (self, a, b, beta, alpha): beta·d(self) +
// alpha·(da·b + a·db), with the op's product. With alpha 1 the sum starts from d(self) (a bias
// tangent, often broadcast), so that fuse-matmul-add can make each product accumulate into it:
// addmm(addmm(dbias, da, b), a, db).
Rule add_product(Product product) {
  return [product](Ctx& c) -> std::vector<Value*> {
    double beta = scalar(c.c(3)), alpha = scalar(c.c(4));
    Value* left = c.t(1) ? product(c, c.t(1), c.x(2)) : nullptr;
    Value* right = c.t(2) ? product(c, c.x(1), c.t(2)) : nullptr;
    Value* self = beta == 0.0 ? nullptr : c.scale(c.t(0), beta);
    if (alpha == 1.0) return {c.add(c.add(self, left), right)};
    return {c.add(c.scale(c.add(left, right), alpha), self)};
  };
}

// Euclidean distances d_ij = ‖x_i − y_j‖ between the rows of x [.., P, M] and y [.., R, M]:
// d(d_ij) = (x_i − y_j)·(dx_i − dy_j) / d_ij = (x_i·dx_i − dx_i·y_j − x_i·dy_j + y_j·dy_j) / d_ij,
// two matmuls per call and no [P, R, M] residual; 0 where d_ij is 0.
Value* euclidean_distance_tangent(Ctx& c) {
  Value *x = c.x(0), *y = c.x(1), *tx = c.t(0), *ty = c.t(1);
  auto rows_dot = [&](Value* a, Value* t) {  // Σ_k a_ik t_ik
    return c.call(ops::sum_dim_IntList, {c.mul(t, a), std::vector<int64_t>{-1}});
  };
  auto column = [&](Value* r) { return c.call(ops::unsqueeze, {r, -1}); };
  auto row = [&](Value* r) { return c.call(ops::unsqueeze, {r, -2}); };
  Value* num = nullptr;
  if (x == y && tx == ty && tx) {  // distances within one set: x·dxᵀ is the transpose of dx·xᵀ
    Value* m = matmul(c, tx, mT(c, x));
    Value* r = rows_dot(x, tx);
    num =
        c.call(ops::sub_Tensor, {c.call(ops::add_Tensor, {column(r), row(r)}), c.call(ops::add_Tensor, {m, mT(c, m)})});
  } else {
    if (tx) num = c.call(ops::sub_Tensor, {column(rows_dot(x, tx)), matmul(c, tx, mT(c, y))});
    if (ty) num = c.add(num, c.call(ops::sub_Tensor, {row(rows_dot(y, ty)), matmul(c, x, mT(c, ty))}));
  }
  if (!num) return nullptr;
  Value* d = c.out();
  Value* inv = c.call(ops::masked_fill_Scalar, {c.call(ops::reciprocal, {d}), c.call(ops::eq_Scalar, {d, 0}), 0.0});
  return c.mul(num, inv);
}

// cdist(x, y, p): d_ij = ‖x_i − y_j‖_p, a vector norm of the differences over the last dim (for
// p ≠ 2, whose tangent needs the [.., P, R, M] differences).
std::vector<Value*> cdist(Ctx& c) {
  double p = c.c(2).toDouble();
  if (p == 2.0) return {euclidean_distance_tangent(c)};
  if (!c.t(0) && !c.t(1)) return {};
  auto pairs = [&](Value* a, Value* b) {  // a_i − b_j for all pairs: [.., P, R, M]
    return c.call(ops::sub_Tensor, {c.call(ops::unsqueeze, {a, -2}), c.call(ops::unsqueeze, {b, -3})});
  };
  Value* t;
  if (c.t(0) && c.t(1)) {
    t = pairs(c.t(0), c.t(1));
  } else if (c.t(0)) {
    t = c.call(ops::unsqueeze, {c.t(0), -2});
  } else {
    t = c.call(ops::neg, {c.call(ops::unsqueeze, {c.t(1), -3})});
  }
  Value* diff = pairs(c.x(0), c.x(1));
  int64_t last = static_cast<int64_t>(diff->meta().sizes.size()) - 1;
  return {norm_tangent(c, diff, t, p, {last}, false)};
}

// convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
// conv(dx, w) + conv(x, dw) + db, the bias tangent per output channel.
std::vector<Value*> convolution(Ctx& c) {
  auto conv = [&c](Value* x, Value* w) {
    std::vector<BArg> args;
    for (size_t i = 0; i < c.n.args().size(); ++i) args.push_back(c.a(i));
    args[0] = x;
    args[1] = w;
    args[2] = std::nullopt;
    return c.call(ops::convolution, std::move(args));
  };
  return {c.per_arg({
      [&](Ctx&, Value* t) { return conv(t, c.x(1)); },                                  // the input
      [&](Ctx&, Value* t) { return conv(c.x(0), t); },                                  // the weight
      [&](Ctx&, Value* t) { return per_channel(c, t, c.out()->meta().sizes.size()); },  // the bias
  })};
}

}  // namespace

void register_linalg(Registry& r) {
  r.add(ops::mm, bilinear());
  r.add(ops::bmm, bilinear());
  r.add(ops::dot, bilinear());
  r.add(ops::vdot, bilinear());
  // _trilinear (bilinear's kernel) is linear in each of its three operands: the op with each
  // tangent in its operand's place, summed.
  r.add(ops::_trilinear, [](Ctx& c) -> std::vector<Value*> {
    Value* out = nullptr;
    for (size_t i = 0; i < 3; ++i) out = c.add(out, c.linear_in(i));
    return {out};
  });  // Σ conj(x)·y: conjugate-linear in x, so bilinear in the tangents
  r.add(ops::mv, bilinear());
  r.add(ops::linalg_cross, bilinear());
  r.add(ops::addmm, add_product(op(ops::mm)));
  r.add(ops::baddbmm, add_product(op(ops::bmm)));
  r.add(ops::addmv, add_product(op(ops::mv)));
  r.add(ops::addbmm, add_product([](Ctx& c, Value* a, Value* b) {  // Σ over the batch of a_i·b_i
          return c.call(ops::sum_dim_IntList, {c.call(ops::bmm, {a, b}), std::vector<int64_t>{0}});
        }));
  r.add(ops::addr, add_product([](Ctx& c, Value* a, Value* b) {  // the outer product a·bᵀ
          return c.call(ops::mul_Tensor, {c.call(ops::unsqueeze, {a, 1}), c.call(ops::unsqueeze, {b, 0})});
        }));
  r.add(ops::_cdist_forward, cdist);
  r.add(ops::_euclidean_dist, [](Ctx& c) -> std::vector<Value*> { return {euclidean_distance_tangent(c)}; });
  r.add(ops::convolution, convolution);
}

}  // namespace jvpc::jvp_rules
