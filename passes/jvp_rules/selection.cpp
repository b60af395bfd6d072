// JVP rules of ops whose result selects among input elements: where, masked_fill, clamps,
// maximum/minimum, max/min over dims, sort and topk. The tangent is the selected element's
// tangent; the choice itself is a primal expression (a mask or indices), so fold computes it
// once. Ties and NaNs go as LibTorch 2.15's forward AD sends them: a clamp by scalars passes
// the tangent strictly inside its bounds (none at a bound, none for NaN); between tensors, a tie
// splits the tangents evenly (clamp's tensor bounds, maximum, fmax, amax).
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


/// (a + b) / 2 for tangents a and b, either of which may be zero: a tie's share.
Value* half_sum(Ctx& c, Value* a, Value* b) {
  Value* s = c.add(a, b);
  return s ? c.call("aten::mul.Scalar", {s, 0.5}) : nullptr;
}

/// The tangent of x clamped below by y (clamp_min.Tensor, maximum's choice at a clamp): x's
/// where x > y, the mean of both at a tie, y's otherwise (below, or x NaN). clamp_max.Tensor
/// with `above` = lt.Tensor.
Value* clamp_by(Ctx& c, Value* x, Value* tx, Value* y, Value* ty, const char* passes) {
  Value* tie = select(c, c.call("aten::eq.Tensor", {x, y}), half_sum(c, tx, ty), ty);
  return select(c, c.call(passes, {x, y}), tx, tie);
}

/// The tangent of values picked out by indices along `dim` (max.dim, sort, topk).
Value* gather(Ctx& c, int64_t dim, Value* indices, bool keepdim) {
  if (!c.t(0)) return nullptr;
  if (c.x(0)->meta().sizes.empty()) return c.t(0);  // a 0-dim input is its own max
  if (!keepdim) indices = c.call("aten::unsqueeze", {indices, dim});
  Value* g = c.call("aten::gather", {c.t(0), dim, indices});
  return keepdim ? g : c.call("aten::squeeze.dim", {g, dim});
}

/// amax, amin, max, min: the tangent averaged over the elements equal to the result, the
/// others' left out (an infinite tangent elsewhere does not reach it).
Value* evenly(Ctx& c, const std::vector<int64_t>& dims, bool keepdim) {
  Value* hits = c.call("aten::eq.Tensor", {c.x(0), keep_dims(c, c.out(), c.x(0), dims)});
  Value* count = c.call("aten::sum.dim_IntList", {c.call("aten::_to_copy", {hits, c.out()->meta().dtype}), dims, keepdim});
  Value* picked = c.call("aten::sum.dim_IntList", {c.call("aten::where.ScalarOther", {hits, c.t(0), 0.0}), dims, keepdim});
  return c.call("aten::div.Tensor", {picked, count});
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

  // Clamps with scalar bounds: the tangent passes where min < x < max, strictly.
  r.add("aten::clamp", masked([](Ctx& c) {
          Value* in = nullptr;
          if (c.n.arg(1).kind != ArgKind::None) in = c.call("aten::gt.Scalar", {c.x(0), c.a(1)});
          if (c.n.arg(2).kind != ArgKind::None) {
            Value* lt = c.call("aten::lt.Scalar", {c.x(0), c.a(2)});
            in = in ? c.call("aten::bitwise_and.Tensor", {in, lt}) : lt;
          }
          return in ? in : c.call("aten::eq.Tensor", {c.x(0), c.x(0)});
        }));
  r.add("aten::clamp_min", masked([](Ctx& c) { return c.call("aten::gt.Scalar", {c.x(0), c.a(1)}); }));
  r.add("aten::clamp_max", masked([](Ctx& c) { return c.call("aten::lt.Scalar", {c.x(0), c.a(1)}); }));
  // Tensor bounds have tangents of their own. One bound: as clamp_min.Tensor or clamp_max.Tensor.
  // Both: max's where min > max; min's below min, max's above max; at a bound that is not both,
  // the mean of x's and the bound's; x's otherwise (x NaN included).
  r.add("aten::clamp.Tensor", [](Ctx& c) -> std::vector<Value*> {
    bool has_min = c.n.arg(1).kind == ArgKind::Tensor, has_max = c.n.arg(2).kind == ArgKind::Tensor;
    if (!has_min && !has_max) return {c.t(0)};
    if (!has_max) return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), "aten::gt.Tensor")};
    if (!has_min) return {clamp_by(c, c.x(0), c.t(0), c.x(2), c.t(2), "aten::lt.Tensor")};
    Value *x = c.x(0), *lo = c.x(1), *hi = c.x(2);
    auto both = [&](const char* a, Value* p, const char* b, Value* q) {
      return c.call("aten::bitwise_and.Tensor", {c.call(a, {x, p}), c.call(b, {x, q})});
    };
    Value* t = select(c, both("aten::eq.Tensor", hi, "aten::gt.Tensor", lo), half_sum(c, c.t(0), c.t(2)), c.t(0));
    t = select(c, both("aten::eq.Tensor", lo, "aten::lt.Tensor", hi), half_sum(c, c.t(0), c.t(1)), t);
    t = select(c, c.call("aten::gt.Tensor", {x, hi}), c.t(2), t);
    t = select(c, c.call("aten::lt.Tensor", {x, lo}), c.t(1), t);
    return {select(c, c.call("aten::gt.Tensor", {lo, hi}), c.t(2), t)};
  });
  r.add("aten::clamp_min.Tensor", [](Ctx& c) -> std::vector<Value*> {
    return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), "aten::gt.Tensor")};
  });
  r.add("aten::clamp_max.Tensor", [](Ctx& c) -> std::vector<Value*> {
    return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), "aten::lt.Tensor")};
  });

  // maximum(x, y): x's tangent where x wins, the mean of both at a tie, y's otherwise (a NaN
  // on either side); minimum likewise. clamp_min.Tensor and clamp_max.Tensor are the same.
  for (auto [op, wins] : {std::pair{"aten::maximum", "aten::gt.Tensor"}, std::pair{"aten::minimum", "aten::lt.Tensor"}})
    r.add(op, [wins = wins](Ctx& c) -> std::vector<Value*> {
      return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), wins)};
    });

  // fmax(x, y), fmin(x, y) ignore a NaN: x's tangent where x wins (fmax: x > y, fmin: x < y) or
  // y is NaN, the mean of both at a tie, else y's (x NaN), as LibTorch's forward AD.
  for (auto [op, wins] : {std::pair{"aten::fmax", "aten::gt.Tensor"}, std::pair{"aten::fmin", "aten::lt.Tensor"}})
    r.add(op, [wins = wins](Ctx& c) -> std::vector<Value*> {
      Value* y_nan = c.call("aten::ne.Tensor", {c.x(1), c.x(1)});  // (isnan has no kernel of its own)
      Value* s = c.call("aten::bitwise_or.Tensor", {c.call(wins, {c.x(0), c.x(1)}), y_nan});
      Value* tie = select(c, c.call("aten::eq.Tensor", {c.x(0), c.x(1)}), half_sum(c, c.t(0), c.t(1)), c.t(1));
      return {select(c, s, c.t(0), tie)};
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
