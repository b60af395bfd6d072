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
    auto times = [&](Value* a, Value* b) { return a && b ? product(c, a, b) : nullptr; };  // zero stays zero
    double beta = scalar(c.c(3)), alpha = scalar(c.c(4));
    Value* left = times(c.t(1), c.x(2));
    Value* right = times(c.x(1), c.t(2));
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
  auto rows_dot = [&](Value* a, Value* t) { return c.sum(c.mul(t, a), {-1}); };  // Σ_k a_ik t_ik
  Value* num;
  if (x == y && tx == ty && tx) {  // distances within one set: x·dxᵀ is the transpose of dx·xᵀ
    Value* m = c.matmul(tx, mT(c, x));
    Value* r = rows_dot(x, tx);
    num = c.sub(c.add(c.unsqueeze(r, -1), c.unsqueeze(r, -2)), c.add(m, mT(c, m)));
  } else {
    num = c.per_arg({
        [&](Ctx&, Value* t) { return c.sub(c.unsqueeze(rows_dot(x, t), -1), c.matmul(t, mT(c, y))); },
        [&](Ctx&, Value* t) { return c.sub(c.unsqueeze(rows_dot(y, t), -2), c.matmul(x, mT(c, t))); },
    });
  }
  if (!num) return nullptr;
  Value* d = c.out();
  return c.mul(num, c.masked_fill(c.recip(d), c.eq(d, 0), 0.0));
}

// cdist(x, y, p): d_ij = ‖x_i − y_j‖_p, a vector norm of the differences over the last dim (for
// p ≠ 2, whose tangent needs the [.., P, R, M] differences).
std::vector<Value*> cdist(Ctx& c) {
  double p = c.c(2).toDouble();
  if (p == 2.0) return {euclidean_distance_tangent(c)};
  auto pairs = [&](Value* a, Value* b) { return c.sub(c.unsqueeze(a, -2), c.unsqueeze(b, -3)); };  // a_i − b_j
  Value* t = pairs(c.t(0), c.t(1));
  if (!t) return {};
  Value* diff = pairs(c.x(0), c.x(1));  // [.., P, R, M]
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
          return c.sum(c.call(ops::bmm, {a, b}), {0});
        }));
  r.add(ops::addr, add_product([](Ctx& c, Value* a, Value* b) {  // the outer product a·bᵀ
          return c.mul(c.unsqueeze(a, 1), c.unsqueeze(b, 0));
        }));
  r.add(ops::_cdist_forward, cdist);
  r.add(ops::_euclidean_dist, [](Ctx& c) -> std::vector<Value*> { return {euclidean_distance_tangent(c)}; });
  r.add(ops::convolution, convolution);
}

}  // namespace jvpc::jvp_rules
