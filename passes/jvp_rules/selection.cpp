// JVP rules of ops whose result selects among input elements: where, masked_fill, clamps,
// maximum/minimum, max/min over dims, sort and topk. The tangent is the selected element's
// tangent; the choice itself is a primal expression (a mask or indices), so fold computes it
// once. Ties split the tangent evenly (maximum, amax), as in LibTorch.
#include "passes/jvp_rules/rules.h"

namespace jvpc::jvp_rules {

namespace {

/// where(cond, a, b) for tangents a and b, either of which may be zero.
Value* select(Ctx& c, Value* cond, Value* a, Value* b) {
  if (!a && !b) return nullptr;
  if (a && b) return c.call("aten::where.self", {cond, a, b});
  if (a) return c.call("aten::where.ScalarOther", {cond, a, 0.0});
  return c.call("aten::where.ScalarSelf", {cond, 0.0, b});
}

Value* as_float(Ctx& c, Value* mask) { return c.call("aten::_to_copy", {mask, c.out()->meta().dtype}); }

/// The tangent of values picked out by indices along `dim` (max.dim, sort, topk).
Value* gather(Ctx& c, int64_t dim, Value* indices, bool keepdim) {
  if (!c.t(0)) return nullptr;
  if (c.x(0)->meta().sizes.empty()) return c.t(0);  // a 0-dim input is its own max
  if (!keepdim) indices = c.call("aten::unsqueeze", {indices, dim});
  Value* g = c.call("aten::gather", {c.t(0), dim, indices});
  return keepdim ? g : c.call("aten::squeeze.dim", {g, dim});
}

/// amax, amin, max, min: the tangent averaged over the elements equal to the result.
Value* evenly(Ctx& c, const std::vector<int64_t>& dims, bool keepdim) {
  Value* share = tie_shares(c, c.call("aten::eq.Tensor", {c.x(0), keep_dims(c, c.out(), c.x(0), dims)}), dims);
  return c.call("aten::sum.dim_IntList", {c.mul(c.t(0), share), dims, keepdim});
}

}  // namespace

void register_selection(Registry& r) {
  // Tangents follow the selected branch; the condition has none.
  r.add("aten::where.self", [](Ctx& c) -> std::vector<Value*> { return {select(c, c.x(0), c.t(1), c.t(2))}; });
  r.add("aten::masked_fill.Scalar", [](Ctx& c) -> std::vector<Value*> {
    if (!c.t(0)) return {};
    return {c.call("aten::masked_fill.Scalar", {c.t(0), c.x(1), 0.0})};
  });
  r.add("aten::masked_fill.Tensor", [](Ctx& c) -> std::vector<Value*> {  // value: a 0-dim tensor
    if (!c.t(2)) return {c.t(0) ? c.call("aten::masked_fill.Scalar", {c.t(0), c.x(1), 0.0}) : nullptr};
    Value* self = c.t(0) ? c.t(0) : c.zeros_like(c.out());
    return {c.call("aten::masked_fill.Tensor", {self, c.x(1), c.t(2)})};
  });

  // Clamps with scalar bounds: the tangent passes where min <= x <= max.
  r.add("aten::clamp", masked([](Ctx& c) {
          Value* in = nullptr;
          if (c.n.arg(1).kind != ArgKind::None) in = c.call("aten::ge.Scalar", {c.x(0), c.a(1)});
          if (c.n.arg(2).kind != ArgKind::None) {
            Value* le = c.call("aten::le.Scalar", {c.x(0), c.a(2)});
            in = in ? c.call("aten::bitwise_and.Tensor", {in, le}) : le;
          }
          return in ? in : c.call("aten::eq.Tensor", {c.x(0), c.x(0)});
        }));
  r.add("aten::clamp_min", masked([](Ctx& c) { return c.call("aten::ge.Scalar", {c.x(0), c.a(1)}); }));
  r.add("aten::clamp_max", masked([](Ctx& c) { return c.call("aten::le.Scalar", {c.x(0), c.a(1)}); }));
  // Tensor bounds have tangents of their own: below min, the result is min (and takes min's
  // tangent); above max, max's; where min > max, max's, as clamp itself.
  r.add("aten::clamp.Tensor", [](Ctx& c) -> std::vector<Value*> {
    bool has_min = c.n.arg(1).kind == ArgKind::Tensor, has_max = c.n.arg(2).kind == ArgKind::Tensor;
    Value* t = c.t(0);
    if (has_max) t = select(c, c.call("aten::gt.Tensor", {c.x(0), c.x(2)}), c.t(2), t);
    if (has_min) t = select(c, c.call("aten::lt.Tensor", {c.x(0), c.x(1)}), c.t(1), t);
    if (has_min && has_max) t = select(c, c.call("aten::gt.Tensor", {c.x(1), c.x(2)}), c.t(2), t);
    return {t};
  });
  r.add("aten::clamp_min.Tensor", [](Ctx& c) -> std::vector<Value*> {
    return {select(c, c.call("aten::lt.Tensor", {c.x(0), c.x(1)}), c.t(1), c.t(0))};
  });
  r.add("aten::clamp_max.Tensor", [](Ctx& c) -> std::vector<Value*> {
    return {select(c, c.call("aten::gt.Tensor", {c.x(0), c.x(1)}), c.t(1), c.t(0))};
  });

  // maximum(x, y): tx·s + ty·(1 − s), s = 1 where x wins, ½ on ties; minimum likewise.
  for (auto [op, wins] : {std::pair{"aten::maximum", "aten::gt.Tensor"}, std::pair{"aten::minimum", "aten::lt.Tensor"}})
    r.add(op, [wins = wins](Ctx& c) -> std::vector<Value*> {
      Value* tie = c.call("aten::mul.Scalar", {as_float(c, c.call("aten::eq.Tensor", {c.x(0), c.x(1)})), 0.5});
      Value* s = c.call("aten::add.Tensor", {as_float(c, c.call(wins, {c.x(0), c.x(1)})), tie});
      Value* a = c.t(0) ? c.mul(c.t(0), s) : nullptr;
      Value* b = c.t(1) ? c.mul(c.t(1), c.call("aten::rsub.Scalar", {s, 1})) : nullptr;
      return {c.add(a, b)};
    });

  // fmax(x, y), fmin(x, y) ignore a NaN: x's tangent where x > y (fmin: x <= y) or y is NaN,
  // else y's, as LibTorch's forward AD (a tie takes y's for fmax, x's for fmin).
  for (auto [op, wins] : {std::pair{"aten::fmax", "aten::gt.Tensor"}, std::pair{"aten::fmin", "aten::le.Tensor"}})
    r.add(op, [wins = wins](Ctx& c) -> std::vector<Value*> {
      Value* y_nan = c.call("aten::ne.Tensor", {c.x(1), c.x(1)});  // (isnan has no kernel of its own)
      Value* s = c.call("aten::bitwise_or.Tensor", {c.call(wins, {c.x(0), c.x(1)}), y_nan});
      return {select(c, s, c.t(0), c.t(1))};
    });

  // Reductions that pick elements.
  for (const char* op : {"aten::max.dim", "aten::min.dim"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      int64_t dim = reduced_dims(c.x(0), c.c(1)).at(0);
      return {gather(c, dim, c.out(1), c.c(2).toBool()), nullptr};
    });
  // median, kthvalue and mode along a dim pick one element each, as max does.
  for (auto [op, dim] : {std::pair{"aten::median.dim", 1}, std::pair{"aten::nanmedian.dim", 1},
                         std::pair{"aten::mode", 1}, std::pair{"aten::kthvalue", 2}})
    r.add(op, [dim = static_cast<size_t>(dim)](Ctx& c) -> std::vector<Value*> {
      return {gather(c, reduced_dims(c.x(0), c.c(dim)).at(0), c.out(1), c.c(dim + 1).toBool()), nullptr};
    });
  // cummax and cummin pick, at each position, the element their indices name.
  for (const char* op : {"aten::cummax", "aten::cummin"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      return {gather(c, reduced_dims(c.x(0), c.c(1)).at(0), c.out(1), true), nullptr};
    });
  for (const char* op : {"aten::sort", "aten::topk"})
    r.add(op, [op = std::string(op)](Ctx& c) -> std::vector<Value*> {
      int64_t dim = reduced_dims(c.x(0), c.c(op == "aten::sort" ? 1 : 2)).at(0);
      return {gather(c, dim, c.out(1), true), nullptr};
    });
  r.add("aten::sort.stable", [](Ctx& c) -> std::vector<Value*> {
    return {gather(c, reduced_dims(c.x(0), c.c(2)).at(0), c.out(1), true), nullptr};
  });
  for (const char* op : {"aten::amax", "aten::amin"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      if (!c.t(0)) return {};
      return {evenly(c, reduced_dims(c.x(0), c.c(1)), c.c(2).toBool())};
    });
  // median over all elements picks one too (LibTorch's forward AD spreads it over ties as max's).
  for (const char* op : {"aten::max", "aten::min", "aten::median", "aten::nanmedian"})
    r.add(op, [](Ctx& c) -> std::vector<Value*> {
      if (!c.t(0)) return {};
      return {evenly(c, reduced_dims(c.x(0), c10::IValue()), false)};
    });
}

}  // namespace jvpc::jvp_rules
