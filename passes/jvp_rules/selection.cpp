// JVP rules of ops whose result selects among input elements: where, masked_fill, clamps,
// maximum/minimum, max/min over dims, sort and topk. The tangent is the selected element's
// tangent; the choice itself is a primal expression (a mask or indices), so fold computes it
// once. Ties and NaNs go as LibTorch 2.15's forward AD sends them: a clamp by scalars passes
// the tangent strictly inside its bounds (none at a bound, none for NaN); between tensors, a tie
// splits the tangents evenly (clamp's tensor bounds, maximum, fmax, amax).
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include <optional>

namespace jvpc::jvp_rules {

namespace {

/// (a + b) / 2 for tangents a and b, either of which may be zero: a tie's share.
Value* half_sum(Ctx& c, Value* a, Value* b) { return c.scale(c.add(a, b), 0.5); }

/// The tangent of x clamped below by y (clamp_min.Tensor, maximum's choice at a clamp): x's
/// where x > y, the mean of both at a tie, y's otherwise (below, or x NaN). clamp_max.Tensor
/// with `above` = lt.Tensor.
Value* clamp_by(Ctx& c, Value* x, Value* tx, Value* y, Value* ty, Op passes) {
  Value* tie = c.where(c.call(ops::eq_Tensor, {x, y}), half_sum(c, tx, ty), ty);
  return c.where(c.call(passes, {x, y}), tx, tie);
}

/// The tangent t of values picked out by indices along `dim` (max.dim, sort, topk).
Value* gather(Ctx& c, Value* t, int64_t dim, Value* indices, bool keepdim) {
  if (c.x(0)->meta().sizes.empty()) return t;  // a 0-dim input is its own max
  if (!keepdim) indices = c.unsqueeze(indices, dim);
  Value* g = c.call(ops::gather, {t, dim, indices});
  return keepdim ? g : c.call(ops::squeeze_dim, {g, dim});
}

/// The rule of an op that picks, along the dim argument `dim_arg` names, the elements its
/// output 1 indexes; argument `keepdim_arg` says whether that dim is kept (none: it is).
Rule picks(size_t dim_arg, std::optional<size_t> keepdim_arg = std::nullopt) {
  return per_arg({[=](Ctx& c, Value* t) {
    bool keepdim = !keepdim_arg || c.c(*keepdim_arg).toBool();
    return gather(c, t, reduced_dims(c.x(0), c.c(dim_arg)).at(0), c.out(1), keepdim);
  }});
}

/// amax, amin, max, min: the tangent averaged over the elements equal to the result, the
/// others' left out (an infinite tangent elsewhere does not reach it).
Value* evenly(Ctx& c, Value* t, const std::vector<int64_t>& dims, bool keepdim) {
  Value* hits = c.call(ops::eq_Tensor, {c.x(0), keep_dims(c, c.out(), c.x(0), dims)});
  Value* count = c.sum(c.cast(hits, c.out()->meta().dtype), dims, keepdim);
  return c.div(c.sum(c.where(hits, t, nullptr), dims, keepdim), count);
}

}  // namespace

void register_selection(Registry& r) {
  // Tangents follow the selected branch; the condition has none.
  r.add(ops::where_self, [](Ctx& c) -> std::vector<Value*> { return {c.where(c.x(0), c.t(1), c.t(2))}; });
  const Term filled_with_zero = [](Ctx& c, Value* t) { return c.masked_fill(t, c.x(1), 0.0); };
  r.add(ops::masked_fill_Scalar, per_arg({filled_with_zero}));
  r.add(ops::masked_fill_Tensor, [filled_with_zero](Ctx& c) -> std::vector<Value*> {  // value: a 0-dim tensor
    if (!c.t(2)) return {c.per_arg({filled_with_zero})};
    return {c.call(ops::masked_fill_Tensor, {c.t_or_zeros(0), c.x(1), c.t(2)})};
  });

  // Clamps with scalar bounds: the tangent passes where min < x < max, strictly.
  r.add(ops::clamp, masked([](Ctx& c) {
          Value* in = nullptr;
          if (c.n.arg(1).kind != ArgKind::None) in = c.call(ops::gt_Scalar, {c.x(0), c.a(1)});
          if (c.n.arg(2).kind != ArgKind::None) {
            Value* lt = c.call(ops::lt_Scalar, {c.x(0), c.a(2)});
            in = in ? c.call(ops::bitwise_and_Tensor, {in, lt}) : lt;
          }
          return in ? in : c.call(ops::eq_Tensor, {c.x(0), c.x(0)});
        }));
  r.add(ops::clamp_min, masked([](Ctx& c) { return c.call(ops::gt_Scalar, {c.x(0), c.a(1)}); }));
  r.add(ops::clamp_max, masked([](Ctx& c) { return c.call(ops::lt_Scalar, {c.x(0), c.a(1)}); }));
  // Tensor bounds have tangents of their own. One bound: as clamp_min.Tensor or clamp_max.Tensor.
  // Both: max's where min > max; min's below min, max's above max; at a bound that is not both,
  // the mean of x's and the bound's; x's otherwise (x NaN included).
  r.add(ops::clamp_Tensor, [](Ctx& c) -> std::vector<Value*> {
    bool has_min = c.n.arg(1).kind == ArgKind::Tensor, has_max = c.n.arg(2).kind == ArgKind::Tensor;
    if (!has_min && !has_max) return {c.t(0)};
    if (!has_max) return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), ops::gt_Tensor)};
    if (!has_min) return {clamp_by(c, c.x(0), c.t(0), c.x(2), c.t(2), ops::lt_Tensor)};
    Value *x = c.x(0), *lo = c.x(1), *hi = c.x(2);
    auto both = [&](Op a, Value* p, Op b, Value* q) {
      return c.call(ops::bitwise_and_Tensor, {c.call(a, {x, p}), c.call(b, {x, q})});
    };
    Value* t = c.where(both(ops::eq_Tensor, hi, ops::gt_Tensor, lo), half_sum(c, c.t(0), c.t(2)), c.t(0));
    t = c.where(both(ops::eq_Tensor, lo, ops::lt_Tensor, hi), half_sum(c, c.t(0), c.t(1)), t);
    t = c.where(c.call(ops::gt_Tensor, {x, hi}), c.t(2), t);
    t = c.where(c.call(ops::lt_Tensor, {x, lo}), c.t(1), t);
    return {c.where(c.call(ops::gt_Tensor, {lo, hi}), c.t(2), t)};
  });
  r.add(ops::clamp_min_Tensor,
        [](Ctx& c) -> std::vector<Value*> { return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), ops::gt_Tensor)}; });
  r.add(ops::clamp_max_Tensor,
        [](Ctx& c) -> std::vector<Value*> { return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), ops::lt_Tensor)}; });

  // maximum(x, y): x's tangent where x wins, the mean of both at a tie, y's otherwise (a NaN
  // on either side); minimum likewise. clamp_min.Tensor and clamp_max.Tensor are the same.
  for (auto [op, wins] : {std::pair{ops::maximum, ops::gt_Tensor}, std::pair{ops::minimum, ops::lt_Tensor}})
    r.add(op,
          [wins = wins](Ctx& c) -> std::vector<Value*> { return {clamp_by(c, c.x(0), c.t(0), c.x(1), c.t(1), wins)}; });

  // fmax(x, y), fmin(x, y) ignore a NaN: x's tangent where x wins (fmax: x > y, fmin: x < y) or
  // y is NaN, the mean of both at a tie, else y's (x NaN), as LibTorch's forward AD.
  for (auto [op, wins] : {std::pair{ops::fmax, ops::gt_Tensor}, std::pair{ops::fmin, ops::lt_Tensor}})
    r.add(op, [wins = wins](Ctx& c) -> std::vector<Value*> {
      Value* y_nan = c.call(ops::ne_Tensor, {c.x(1), c.x(1)});  // (isnan has no kernel of its own)
      Value* s = c.call(ops::bitwise_or_Tensor, {c.call(wins, {c.x(0), c.x(1)}), y_nan});
      Value* tie = c.where(c.call(ops::eq_Tensor, {c.x(0), c.x(1)}), half_sum(c, c.t(0), c.t(1)), c.t(1));
      return {c.where(s, c.t(0), tie)};
    });

  // Reductions that pick elements.
  for (Op op : {ops::max_dim, ops::min_dim}) r.add(op, picks(1, 2));
  // median, kthvalue and mode along a dim pick one element each, as max does.
  for (Op op : {ops::median_dim, ops::nanmedian_dim, ops::mode}) r.add(op, picks(1, 2));
  r.add(ops::kthvalue, picks(2, 3));
  // cummax and cummin pick, at each position, the element their indices name.
  for (Op op : {ops::cummax, ops::cummin}) r.add(op, picks(1));
  r.add(ops::sort, picks(1));
  r.add(ops::topk, picks(2));
  r.add(ops::sort_stable, picks(2));
  for (Op op : {ops::amax, ops::amin})
    r.add(op, per_arg({[](Ctx& c, Value* t) { return evenly(c, t, reduced_dims(c.x(0), c.c(1)), c.c(2).toBool()); }}));
  // median over all elements picks one too (LibTorch's forward AD spreads it over ties as max's).
  for (Op op : {ops::max, ops::min, ops::median, ops::nanmedian})
    r.add(op, per_arg({[](Ctx& c, Value* t) { return evenly(c, t, reduced_dims(c.x(0), c10::IValue()), false); }}));
}

}  // namespace jvpc::jvp_rules
