// Batching rules of views and data movement: the same op with its dims shifted past K, its
// sizes given K in front, or (pooling, resampling, padding) K folded into the batch dim.
#include "passes/batch_rules/rules.h"
#include "ir/op.h"

#include <ATen/ExpandUtils.h>

namespace jvpc::batch_rules {

namespace {

std::vector<int64_t> k_and(const Ctx& c, std::vector<int64_t> sizes) {
  sizes.insert(sizes.begin(), c.K);
  return sizes;
}

// view / _unsafe_view / reshape: the output's sizes with K in front (copied first where the
// batched layout cannot be viewed so).
std::vector<Value*> view(Ctx& c) { return {reshape(c.b, c.x(0), k_and(c, c.n.output(0)->meta().sizes))}; }

// expand(x, sizes): x padded to the target rank first (expand adds dims in front, where K is).
std::vector<Value*> expand(Ctx& c) {
  std::vector<int64_t> sizes = c.n.output(0)->meta().sizes;
  Value* x = c.pad_to(c.x(0), static_cast<int64_t>(sizes.size()));
  return {c.call(ops::expand, {x, k_and(c, sizes)})};
}

std::vector<Value*> permute(Ctx& c) {
  std::vector<int64_t> dims = {0};
  for (int64_t d : c.c(1).toIntVector()) dims.push_back(Ctx::dim(d, c.rank(0)));
  return {c.call(ops::permute, {c.x(0), dims})};
}

std::vector<Value*> t(Ctx& c) {
  if (c.rank(0) < 2) return {c.call(ops::alias, {c.x(0)})};
  return {c.call(ops::transpose_int, {c.x(0), int64_t(1), int64_t(2)})};
}

// squeeze(x): the logical size-1 dims only, never K.
std::vector<Value*> squeeze(Ctx& c) {
  std::vector<int64_t> dims;
  const auto& s = c.n.input(0)->meta().sizes;
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] == 1) dims.push_back(static_cast<int64_t>(d) + 1);
  if (dims.empty()) return {c.call(ops::alias, {c.x(0)})};
  return {c.call(ops::squeeze_dims, {c.x(0), dims})};
}

// repeat(x, repeats): x padded to the repeats' rank, K repeated once.
std::vector<Value*> repeat(Ctx& c) {
  std::vector<int64_t> reps = c.c(1).toIntVector();
  Value* x = c.pad_to(c.x(0), static_cast<int64_t>(reps.size()));
  reps.insert(reps.begin(), 1);
  return {c.call(ops::repeat, {x, reps})};
}

// Whether the present entries of an optional index list are adjacent (then a leading None keeps
// K in front: advanced indices that are apart would move the indexed dims in front of it), and
// none is batched.
bool adjacent_unbatched(const Ctx& c, const Arg& a) {
  int first = -1, last = -1;
  for (size_t i = 0; i < a.operands.size(); ++i)
    if (a.operands[i] >= 0) {
      if (c.operand_batched(static_cast<size_t>(a.operands[i]))) return false;
      if (first < 0) first = static_cast<int>(i);
      last = static_cast<int>(i);
    }
  for (int i = first; i <= last && first >= 0; ++i)
    if (a.operands[static_cast<size_t>(i)] < 0) return false;
  return true;
}

// index.Tensor(x, indices): a leading None in the indices. Created with its output's shape given
// ([K] + the node's), which for a boolean mask depends on the mask's values.
std::vector<Value*> index(Ctx& c) {
  if (!c.batched(0) || !adjacent_unbatched(c, c.n.arg(1))) return {};
  std::vector<Arg> args = c.n.args();
  args[1].operands.insert(args[1].operands.begin(), -1);
  std::vector<Value*> inputs;
  for (size_t i = 0; i < c.n.inputs().size(); ++i) inputs.push_back(c.operand(i));
  const TensorMeta& m = c.n.output(0)->meta();
  TensorMeta out = TensorMeta::contiguous(k_and(c, m.sizes), m.dtype, m.device);
  return c.b.graph().create(c.n.op(), args, inputs, {out}, c.n.return_counts())->outputs();
}

// index_put(x, indices, values, accumulate): a leading None in the indices; values batched are
// padded to the rank of what they are put into ([K] + the indexed shape).
std::vector<Value*> index_put(Ctx& c) {
  if (!adjacent_unbatched(c, c.n.arg(1))) return {};
  const Arg& a = c.n.arg(1);
  int64_t covered = 0, adv_rank = 0;
  for (int o : a.operands) {
    if (o < 0) {
      ++covered;
      continue;
    }
    const TensorMeta& m = c.n.input(static_cast<size_t>(o))->meta();
    bool mask = m.dtype == c10::kBool || m.dtype == c10::kByte;
    covered += mask ? static_cast<int64_t>(m.sizes.size()) : 1;
    adv_rank = std::max<int64_t>(adv_rank, mask ? 1 : static_cast<int64_t>(m.sizes.size()));
  }
  int64_t indexed_rank = c.rank(0) - covered + adv_rank;
  std::vector<Value*> idx = {nullptr};
  for (int o : a.operands) idx.push_back(o < 0 ? nullptr : c.operand(static_cast<size_t>(o)));
  Value* self = c.batched(0) ? c.x(0) : c.broadcast(c.x(0));
  Value* values = c.batched(2) ? c.pad_to(c.x(2), indexed_rank) : c.x(2);
  return {c.call(ops::index_put, {self, idx, values, c.c(3).toBool()})};
}

// masked_select(x, mask) with x of the broadcast shape: the K tangents' selections, one after
// the other ([K·n], n depending on the mask's values), viewed as [K, n].
std::vector<Value*> masked_select(Ctx& c) {
  if (!c.batched(0) || c.batched(1)) return {};
  const TensorMeta& x = c.n.input(static_cast<size_t>(c.n.arg(0).operands[0]))->meta();
  const TensorMeta& m = c.n.output(0)->meta();
  if (at::infer_size(x.sizes, c.n.tensor_arg(1)->meta().sizes) != x.sizes) return {};
  std::vector<Value*> inputs;
  for (size_t i = 0; i < c.n.inputs().size(); ++i) inputs.push_back(c.operand(i));
  TensorMeta flat = TensorMeta::contiguous({c.K * m.sizes.at(0)}, m.dtype, m.device);
  Value* r = c.b.graph().create(c.n.op(), c.n.args(), inputs, {flat}, c.n.return_counts())->output(0);
  return {c.call(ops::view, {r, k_and(c, m.sizes)})};
}

// masked_scatter(x, mask, source): the i-th true position takes source's i-th element, for each
// tangent its own: the positions' ranks (a cumulative sum of the mask, once) index each
// tangent's flattened source.
std::vector<Value*> masked_scatter(Ctx& c) {
  if (c.batched(1)) return {};
  const TensorMeta& out = c.n.output(0)->meta();
  Value* mask = c.call(ops::expand, {c.x(1), out.sizes});
  Value* flat = reshape(c.b, mask, {-1});
  Value* rank = c.call(ops::sub_Scalar, {c.call(ops::cumsum, {flat, int64_t(0), c10::kLong}), int64_t(1)});
  rank = c.call(ops::clamp_min, {rank, int64_t(0)});
  Value* src = c.batched(2) ? c.x(2) : c.broadcast(c.x(2));
  src = reshape(c.b, src, {c.K, -1});
  if (src->meta().sizes[1] == 0) return {};
  Value* picked = c.call(ops::index_select, {src, int64_t(1), rank});
  picked = c.call(ops::view, {picked, k_and(c, out.sizes)});
  Value* self = c.batched(0) ? c.pad_to(c.x(0), static_cast<int64_t>(out.sizes.size())) : c.x(0);
  return {c.call(ops::where_self, {mask, picked, self})};
}

// index_fill.int_Tensor(x, dim, index, value) with a batched 0-d value: x filled with 0 there,
// plus value times the filled positions (a mask made once).
std::vector<Value*> index_fill_tensor(Ctx& c) {
  if (c.batched(2)) return {};
  int64_t rank = c.rank(0), dim = Ctx::dim(c.c(1).toInt(), rank);
  Value* self = c.batched(0) ? c.x(0) : c.broadcast(c.x(0));
  if (!c.batched(3)) return {c.call(ops::index_fill_int_Tensor, {self, dim, c.x(2), c.x(3)})};
  const TensorMeta& m = c.n.output(0)->meta();
  Value* zeroed = c.call(ops::index_fill_int_Scalar, {self, dim, c.x(2), 0.0});
  Value* zeros = c.call(ops::zeros, {m.sizes, m.dtype, std::nullopt, m.device});
  Value* where = c.call(ops::index_fill_int_Scalar, {zeros, c.c(1).toInt(), c.x(2), 1.0});
  Value* value = c.pad_to(c.x(3), rank);
  if (value->meta().dtype != m.dtype) value = c.call(ops::_to_copy, {value, m.dtype});
  return {c.call(ops::add_Tensor, {zeroed, c.call(ops::mul_Tensor, {where, value})})};
}

// roll(x, shifts, dims): dims shifted past K; no dims rolls the flattened tensor.
std::vector<Value*> roll(Ctx& c) {
  std::vector<int64_t> dims = c.c(2).toIntVector();
  if (!dims.empty()) return with_dims({2})(c);
  Value* flat = reshape(c.b, c.x(0), {c.K, -1});
  Value* r = c.call(ops::roll, {flat, c.c(1).toIntVector(), std::vector<int64_t>{1}});
  return {reshape(c.b, r, k_and(c, c.n.output(0)->meta().sizes))};
}

// as_strided(x, size, stride, offset) of a contiguous x that it reads within x's elements: each
// tangent's slice restrided alike, K apart by x's numel.
std::vector<Value*> as_strided(Ctx& c) {
  const TensorMeta& in = c.n.input(static_cast<size_t>(c.n.arg(0).operands[0]))->meta();
  if (!in.is_contiguous()) return {};
  std::vector<int64_t> size = c.c(1).toIntVector(), stride = c.c(2).toIntVector();
  int64_t offset = c.n.arg(3).kind == ArgKind::None ? 0 : c.c(3).toInt(), last = offset;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 0) return {};
    last += (size[d] - 1) * stride[d];
  }
  if (last >= in.numel()) return {};
  Value* x = c.x(0);
  if (!x->meta().is_contiguous()) x = c.call(ops::clone, {x, c10::MemoryFormat::Contiguous});
  size.insert(size.begin(), c.K);
  stride.insert(stride.begin(), in.numel());
  return {c.call(ops::as_strided, {x, size, stride, offset})};
}

// grid_sampler_{2,3}d(x, grid, ...) with x batched: K joins the channels (each sampled at the
// same grid, which is read once).
std::vector<Value*> grid_sampler(Ctx& c) {
  if (!c.batched(0) || c.batched(1)) return {};
  const auto& xs = c.x(0)->meta().sizes;  // [K, N, C, in...]
  std::vector<int64_t> perm = {1, 0};
  for (int64_t d = 2; d < static_cast<int64_t>(xs.size()); ++d) perm.push_back(d);
  std::vector<int64_t> folded = {xs[1], c.K * xs[2]};
  folded.insert(folded.end(), xs.begin() + 3, xs.end());
  std::vector<BArg> args = c.args();
  args[0] = reshape(c.b, c.call(ops::permute, {c.x(0), perm}), folded);
  Value* r = c.emit(std::move(args)).at(0);  // [N, K·C, out...]
  std::vector<int64_t> out = c.n.output(0)->meta().sizes, parts = {out[0], c.K};
  parts.insert(parts.end(), out.begin() + 1, out.end());
  return {c.call(ops::permute, {c.call(ops::view, {r, parts}), perm})};
}

// affine_grid_generator(theta [N, r, c], size, align_corners): K joins N.
std::vector<Value*> affine_grid(Ctx& c) {
  std::vector<BArg> args = c.args();
  std::vector<int64_t> size = c.c(1).toIntVector();
  size[0] *= c.K;
  args[0] = c.fold_into_first(c.x(0));
  args[1] = BArg(size);
  Value* r = c.emit(std::move(args)).at(0);
  return {reshape(c.b, r, k_and(c, c.n.output(0)->meta().sizes))};
}

// _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, ...) of a batched weight
// (sums and means): K joins the features, [V, K·D]; the other outputs do not depend on the
// weight's values (max_indices is for mode max, which the JVP rule does not reapply).
std::vector<Value*> embedding_bag(Ctx& c) {
  for (size_t i = 1; i < c.n.args().size(); ++i)
    if (i != 6 && c.batched(i)) return {};
  bool weights = c.batched(6);  // per-sample weights (sums only): bilinear, one of the two batched
  if (c.c(4).toInt() == 2 || (weights && (c.batched(0) || c.c(4).toInt() != 0))) return {};
  std::vector<BArg> args = c.args();
  if (!weights) {
    const auto& ws = c.x(0)->meta().sizes;  // [K, V, D]
    args[0] = reshape(c.b, c.call(ops::permute, {c.x(0), std::vector<int64_t>{1, 0, 2}}), {ws[1], c.K * ws[2]});
  } else {
    // Each tangent's weighted rows, [K, n, D] (the rows gathered once), as the table of one sum
    // over bags whose indices are 0..n−1: [n, K·D].
    Value* idx = c.x(1);
    if (idx->meta().sizes.size() != 1) return {};
    int64_t n = idx->meta().sizes[0];
    Value* rows = c.call(ops::index_select, {c.x(0), int64_t(0), idx});
    Value* w = c.x(6);
    if (c.n.args().size() > 8 && c.c(8).isInt() && c.c(8).toInt() >= 0) {  // padding_idx rows add nothing
      Value* keep = c.call(ops::ne_Scalar, {idx, c.c(8).toInt()});
      w = c.call(ops::mul_Tensor, {w, c.call(ops::_to_copy, {keep, w->meta().dtype})});
    }
    Value* weighted = c.call(ops::mul_Tensor, {rows, c.call(ops::unsqueeze, {w, int64_t(-1)})});
    const auto& ws = weighted->meta().sizes;  // [K, n, D]
    args[0] = reshape(c.b, c.call(ops::permute, {weighted, std::vector<int64_t>{1, 0, 2}}), {n, c.K * ws[2]});
    args[1] = c.call(ops::arange, {n, c10::kLong, std::nullopt, idx->meta().device});
    args[6] = BArg(std::nullopt);
    if (c.n.args().size() > 8) args[8] = BArg(int64_t(-1));
  }
  std::vector<Value*> outs = c.emit(std::move(args));
  const auto& o = c.n.output(0)->meta().sizes;  // [B, D]
  Value* bags = c.call(ops::permute, {c.call(ops::view, {outs[0], std::vector<int64_t>{o[0], c.K, o[1]}}),
                                      std::vector<int64_t>{1, 0, 2}});
  std::vector<Value*> result = {bags};
  for (size_t i = 1; i < outs.size(); ++i) {
    const TensorMeta& m = c.n.output(i)->meta();
    Value* v = outs[i]->meta().sizes == m.sizes && outs[i]->meta().dtype == m.dtype
                   ? outs[i]
                   : c.call(ops::zeros, {m.sizes, m.dtype, std::nullopt, m.device});
    result.push_back(c.broadcast(v));
  }
  return result;
}

// FFTs (_fft_r2c, _fft_c2r, _fft_c2c (x, dim, ...)): the dims shifted past K. They have no Meta
// kernel in C++: the output is declared as the node's with K in front.
std::vector<Value*> fft(Ctx& c) {
  std::vector<Arg> args = c.n.args();
  std::vector<int64_t> dims = c.c(1).toIntVector();
  for (int64_t& d : dims) d = Ctx::dim(d, c.rank(0));
  args[1] = Arg::of_ints(dims);
  const TensorMeta& m = c.n.output(0)->meta();
  TensorMeta out = m;
  out.sizes.insert(out.sizes.begin(), c.K);
  out.strides.insert(out.strides.begin(), m.numel());
  return c.b.graph().create(c.n.op(), args, {c.x(0)}, {out}, c.n.return_counts())->outputs();
}

// block_diag(blocks) of batched 2-d blocks [K, r, c]: each padded with zeros to the full width
// at its column offset, the K tangents' rows stacked. An unbatched block: unrolled.
std::vector<Value*> block_diag(Ctx& c) {
  std::vector<Value*> blocks;
  int64_t cols = 0;
  for (int o : c.n.arg(0).operands) {
    if (o < 0 || !c.operand_batched(static_cast<size_t>(o))) return {};
    Value* v = c.operand(static_cast<size_t>(o));
    if (v->meta().sizes.size() != 3) return {};
    blocks.push_back(v);
    cols += v->meta().sizes[2];
  }
  std::vector<Value*> padded;
  int64_t at = 0;
  for (Value* v : blocks) {
    int64_t w = v->meta().sizes[2];
    padded.push_back(c.call(ops::constant_pad_nd, {v, std::vector<int64_t>{at, cols - at - w}, 0.0}));
    at += w;
  }
  return {c.call(ops::cat, {padded, int64_t(1)})};
}

// max_pool{2,3}d_with_indices_backward(g, self, ..., indices), linear in g [K, ..., spatial]: each
// plane's values added at their indices, as one scatter_add over the K tangents with the residual
// indices broadcast (a view, not a copy).
Rule max_pool_backward(int64_t spatial) {
  return [spatial](Ctx& c) -> std::vector<Value*> {
    if (!c.batched(0) || c.batched(1) || c.batched(7)) return {};
    const TensorMeta& in = c.x(1)->meta();
    const auto& g = c.x(0)->meta().sizes;
    int64_t lead = static_cast<int64_t>(in.sizes.size()) - spatial;
    if (lead < 0) return {};
    std::vector<int64_t> plane(in.sizes.begin(), in.sizes.begin() + lead);
    int64_t in_plane = 1, out_plane = 1;
    for (size_t d = static_cast<size_t>(lead); d < in.sizes.size(); ++d) in_plane *= in.sizes[d];
    for (size_t d = static_cast<size_t>(lead) + 1; d < g.size(); ++d) out_plane *= g[d];
    std::vector<int64_t> src_shape = {c.K}, idx_shape = plane, out_shape = {c.K};
    src_shape.insert(src_shape.end(), plane.begin(), plane.end());
    out_shape.insert(out_shape.end(), plane.begin(), plane.end());
    src_shape.push_back(out_plane);
    idx_shape.push_back(out_plane);
    out_shape.push_back(in_plane);
    Value* src = reshape(c.b, c.x(0), src_shape);
    Value* idx = c.call(ops::unsqueeze, {reshape(c.b, c.x(7), idx_shape), int64_t(0)});
    idx = c.call(ops::expand, {idx, src_shape});
    Value* zeros = c.call(ops::zeros, {out_shape, c.x(0)->meta().dtype, std::nullopt, c.x(0)->meta().device});
    Value* out = c.call(ops::scatter_add, {zeros, int64_t(-1), idx, src});
    std::vector<int64_t> full = {c.K};
    full.insert(full.end(), in.sizes.begin(), in.sizes.end());
    return {reshape(c.b, out, full)};
  };
}

// embedding(weight, indices, ...): the rows of each tangent, by index_select along dim 1.
std::vector<Value*> embedding(Ctx& c) {
  if (!c.batched(0) || c.batched(1)) return {};
  Value* flat = c.call(ops::reshape, {c.x(1), std::vector<int64_t>{-1}});
  Value* rows = c.call(ops::index_select, {c.x(0), int64_t(1), flat});
  return {reshape(c.b, rows, k_and(c, c.n.output(0)->meta().sizes))};
}

// trace(x): the sum of each tangent's diagonal.
std::vector<Value*> trace(Ctx& c) {
  Value* d = c.call(ops::diagonal, {c.x(0), int64_t(0), int64_t(1), int64_t(2)});
  return {c.call(ops::sum_dim_IntList, {d, std::vector<int64_t>{1}})};
}

}  // namespace

void register_views(Registry& r) {
  for (Op op : {ops::view, ops::_unsafe_view, ops::reshape}) r.add(op, view);
  r.add(ops::expand, expand);
  r.add(ops::expand_copy, expand);
  r.add(ops::permute, permute);
  r.add(ops::permute_copy, permute);
  r.add(ops::t, t);
  r.add(ops::squeeze, squeeze);
  r.add(ops::repeat, repeat);
  r.add(ops::index_Tensor, index);
  r.add(ops::index_put, index_put);
  r.add(ops::masked_select, masked_select);
  r.add(ops::masked_scatter, masked_scatter);
  r.add(ops::index_fill_int_Tensor, index_fill_tensor);
  r.add(ops::roll, roll);
  r.add(ops::as_strided, as_strided);
  r.add(ops::grid_sampler_2d, grid_sampler);
  r.add(ops::grid_sampler_3d, grid_sampler);
  r.add(ops::cudnn_grid_sampler, grid_sampler);
  r.add(ops::affine_grid_generator, affine_grid);
  r.add(ops::_embedding_bag, embedding_bag);
  r.add(ops::_embedding_bag_forward_only, embedding_bag);
  for (Op op : {ops::_fft_r2c, ops::_fft_c2r, ops::_fft_c2c}) r.add(op, fft);
  r.add(ops::embedding, embedding);
  r.add(ops::trace, trace);
  // (on the last dims, any leading ones batch)
  for (Op op : {ops::alias, ops::constant_pad_nd, ops::pixel_shuffle, ops::pixel_unshuffle, ops::tril, ops::triu})
    r.add(op, same_op());
  // (self, dim, ...)
  for (Op op : {ops::squeeze_dim, ops::squeeze_dims, ops::select_int, ops::slice_Tensor, ops::narrow, ops::narrow_copy,
                ops::unfold, ops::unbind_int, ops::flip, ops::select_copy_int, ops::slice_copy_Tensor, ops::cat})
    r.add(op, with_dims({1}));
  r.add(ops::transpose_int, with_dims({1, 2}));
  r.add(ops::transpose_copy_int, with_dims({1, 2}));
  for (Op op : {ops::split_Tensor, ops::split_with_sizes, ops::unsafe_split_Tensor, ops::unsafe_split_with_sizes})
    r.add(op, with_dims({2}));
  for (Op op : {ops::diagonal, ops::diagonal_copy}) r.add(op, with_dims({2, 3}));
  r.add(ops::unsqueeze, with_dims({1}, {}, 1));
  r.add(ops::stack, with_dims({1}, {}, 1));
  r.add(ops::diag_embed, with_dims({2, 3}, {}, 1));
  // (self, dim, index, ...): a 1-d index stays as it is; gather's and scatter's, of self's rank, broadcast.
  r.add(ops::block_diag, block_diag);
  r.add(ops::max_pool2d_with_indices_backward, max_pool_backward(2));
  r.add(ops::max_pool3d_with_indices_backward, max_pool_backward(3));
  // index_select of a 0-d tensor (its one index is 0) is the tensor itself
  r.add(ops::index_select, [dims = with_dims({1}, {2})](Ctx& c) -> std::vector<Value*> {
    if (c.rank(0) == 0) return {c.call(ops::clone, {c.x(0), c10::MemoryFormat::Contiguous})};
    return dims(c);
  });
  for (Op op : {ops::index_add, ops::index_copy}) r.add(op, with_dims({1}, {2}));
  // a 0-d value tensor stays as it is too (a batched one: unrolled)
  r.add(ops::index_fill_int_Scalar, with_dims({1}, {2}));
  for (Op op : {ops::gather, ops::scatter_add, ops::scatter_src, ops::scatter_value, ops::scatter_reduce_two})
    r.add(op, with_dims({1}));
  r.add(ops::slice_scatter, with_dims({2}));
  r.add(ops::select_scatter, with_dims({2}));
  r.add(ops::diagonal_scatter, with_dims({3, 4}));
  // Pooling by averages, resampling and padding: each sample by itself, so K joins the batch dim.
  for (Op op : Op::all())
    if (op.has(kSampleWise)) r.add(op, fold_first());
}

}  // namespace jvpc::batch_rules
