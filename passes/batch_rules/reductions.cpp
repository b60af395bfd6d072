// Batching rules of reductions and scans: the dims shifted past K; a reduction over all
// elements reduces over every dim but K.
#include "passes/batch_rules/rules.h"
#include "ir/op.h"

namespace jvpc::batch_rules {

namespace {

// sum(x, dtype) / mean(x, dtype): over every logical dim.
Rule over_all(Op dim_op) {
  return [dim_op](Ctx& c) -> std::vector<Value*> {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < c.rank(0); ++d) dims.push_back(d + 1);
    if (dims.empty()) return {c.call(ops::_to_copy, {c.x(0), c.n.output(0)->meta().dtype})};
    return {c.b.emit(dim_op, {c.x(0), dims, false, BArg::of_arg(c.n.arg(1), &c.n)}).at(0)};
  };
}

// nll_loss_forward / nll_loss2d_forward(x, target, weight, reduction, ignore_index) of a batched
// x [K, N, C, ...] (or [K, C]): each tangent's −w[t]·x[n, t] picked by one gather along the
// class dim with the target broadcast over K (a view), the weights and the ignored entries a
// factor made once, then reduced per tangent. Outputs: the loss and total_weight (the weights'
// sum, the same for every tangent).
std::vector<Value*> nll_loss(Ctx& c) {
  for (size_t i = 1; i < c.n.args().size(); ++i)
    if (c.batched(i)) return {};
  Value* target = c.x(1);
  const TensorMeta& x = c.n.input(static_cast<size_t>(c.n.arg(0).operands[0]))->meta();
  int64_t rank = static_cast<int64_t>(x.sizes.size()), reduction = c.c(3).toInt(), ignore = c.c(4).toInt();
  Value* valid = c.call(ops::ne_Scalar, {target, ignore});
  Value* safe = c.call(ops::masked_fill_Scalar, {target, c.call(ops::eq_Scalar, {target, ignore}), int64_t(0)});
  Value* f = c.call(ops::_to_copy, {valid, x.dtype});
  if (c.n.arg(2).kind == ArgKind::Tensor) {
    Value* w = c.call(ops::index_select, {c.x(2), int64_t(0), reshape(c.b, safe, {-1})});
    f = c.call(ops::mul_Tensor, {f, reshape(c.b, w, target->meta().sizes)});
  }
  // the class dim: 1 of [N, C, ...], 0 of [C]
  int64_t cls = rank == 1 ? 0 : 1;
  Value* idx = c.call(ops::unsqueeze, {safe, cls});
  std::vector<int64_t> idx_sizes = idx->meta().sizes;
  idx_sizes.insert(idx_sizes.begin(), c.K);
  Value* picked = c.call(ops::gather, {c.x(0), cls + 1, c.call(ops::expand, {idx, idx_sizes})});
  picked = c.call(ops::squeeze_dim, {picked, cls + 1});  // [K, N, ...] (or [K])
  Value* loss = c.call(ops::neg, {c.call(ops::mul_Tensor, {picked, f})});
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < static_cast<int64_t>(loss->meta().sizes.size()); ++d) dims.push_back(d);
  Value* total = c.call(ops::sum, {f});
  if (reduction != 0 && !dims.empty()) loss = c.call(ops::sum_dim_IntList, {loss, dims});
  if (reduction == 1) loss = c.call(ops::div_Tensor, {loss, total});
  const TensorMeta& tw = c.n.output(1)->meta();
  if (total->meta().sizes != tw.sizes) total = reshape(c.b, total, tw.sizes);
  return {loss, c.broadcast(total)};
}

}  // namespace

void register_reductions(Registry& r) {
  for (Op op : {ops::sum_dim_IntList, ops::mean_dim, ops::nansum, ops::cumsum}) r.add(op, with_dims({1}));
  r.add(ops::linalg_cross, with_dims({2}));
  r.add(ops::sum, over_all(ops::sum_dim_IntList));
  r.add(ops::mean, over_all(ops::mean_dim));
  r.add(ops::nll_loss_forward, nll_loss);
  r.add(ops::nll_loss2d_forward, nll_loss);
}

}  // namespace jvpc::batch_rules
