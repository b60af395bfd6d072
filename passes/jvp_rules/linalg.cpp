// JVP rules of matrix products and convolutions. Each is bilinear: d(x·y) = dx·y + x·dy, and a
// zero tangent drops its term, so a product with one differentiated operand costs one matmul.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

namespace {

// addmm / baddbmm (self, a, b, beta, alpha): beta·d(self) + alpha·(da·b + a·db). With alpha 1
// the sum starts from d(self) (a bias tangent, often broadcast), so that fuse-matmul-add can make
// each product accumulate into it: addmm(addmm(dbias, da, b), a, db).
Rule add_product(const char* product) {
  return [product](Ctx& c) -> std::vector<Value*> {
    double beta = scalar(c.c(3)), alpha = scalar(c.c(4));
    Value* left = c.t(1) ? c.call(product, {c.t(1), c.x(2)}) : nullptr;
    Value* right = c.t(2) ? c.call(product, {c.x(1), c.t(2)}) : nullptr;
    Value* self = beta == 0.0 ? nullptr : c.scale(c.t(0), beta);
    if (alpha == 1.0) return {c.add(c.add(self, left), right)};
    return {c.add(c.scale(c.add(left, right), alpha), self)};
  };
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
    return c.call("aten::convolution", std::move(args));
  };
  Value* t = c.add(c.t(0) ? conv(c.t(0), c.x(1)) : nullptr, c.t(1) ? conv(c.x(0), c.t(1)) : nullptr);
  if (Value* tb = c.n.arg(2).kind == ArgKind::Tensor ? c.t(2) : nullptr)
    t = c.add(t, per_channel(c, tb, c.out()->meta().sizes.size()));
  return {t};
}

}  // namespace

void register_linalg(Registry& r) {
  r.add("aten::mm", bilinear());
  r.add("aten::bmm", bilinear());
  r.add("aten::dot", bilinear());
  r.add("aten::mv", bilinear());
  r.add("aten::addmm", add_product("aten::mm"));
  r.add("aten::baddbmm", add_product("aten::bmm"));
  r.add("aten::convolution", convolution);
}

}  // namespace jvpc::jvp_rules
