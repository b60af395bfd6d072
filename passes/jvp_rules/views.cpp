// JVP rules of views and data movement: all linear in the data, so the tangent goes through the
// same op (grid sampling also depends on its sampling positions, embedding bags on per-sample
// weights).
// A view of the primal may not be a view of its tangent when the two are laid out differently
// (a tangent input is contiguous, a primal may be a transposed weight); `view` then copies the
// tangent first, visibly, rather than fail at run time.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

namespace jvpc::jvp_rules {

namespace {

/// Linear in self (argument 0) and `source` jointly: the same op on both tangents, zeros for an
/// absent one. Where the op adds its source rather than writing it (`adds`), a constant source
/// leaves self's tangent as it is.
Rule linear_in_self_and(size_t source, bool (*adds)(const Ctx&) = nullptr) {
  return [source, adds](Ctx& c) -> std::vector<Value*> {
    if (!c.t(source) && adds && adds(c)) return {c.t(0)};
    Value* self = c.t_or_zeros(0);
    return c.reapply({{0, self}, {source, c.t_or_zeros(source)}});
  };
}

bool adds(const Ctx&) { return true; }

// scatter_reduce.two(self, dim, index, src, reduce, include_self): sums and means are linear in
// (self, src) jointly, include_self=False included (scattered positions drop self); amax and amin
// take the tangents of the elements equal to the result, averaged over ties: with hits h,
//   t_out = (t_self·h_self + scatter_add(t_src·h_src)) / (h_self + scatter_add(h_src)),
// h_self excluding the scattered positions when include_self is False.
std::vector<Value*> scatter_reduce(Ctx& c) {
  const std::string& reduce = c.c(4).toStringRef();
  if (reduce == "sum" || reduce == "mean") return linear_in_self_and(3)(c);
  if (reduce != "amax" && reduce != "amin")
    throw Error("no tangent for reduce='" + reduce + "' (sum, mean, amax and amin have one)");
  Value *self = c.x(0), *index = c.x(2), *out = c.out();
  // the op reads src where the index has entries: src (and its tangent) narrowed to the index's shape
  auto as_index = [&](Value* v) {
    const std::vector<int64_t>& is = index->meta().sizes;
    for (size_t d = 0; d < is.size(); ++d)
      if (v->meta().sizes.at(d) != is[d]) v = narrow(c, v, static_cast<int64_t>(d), 0, is[d]);
    return v;
  };
  auto as_float = [&](Value* mask) { return c.cast(mask, out->meta().dtype); };
  Value* h_self = as_float(c.call(ops::eq_Tensor, {self, out}));
  if (!c.c(5).toBool()) {
    Value* scattered = c.call(ops::scatter_value, {c.call(ops::zeros_like, {h_self}), c.a(1), index, 1.0});
    h_self = c.mul(h_self, c.sub(1, scattered));
  }
  Value* h_src = as_float(c.call(ops::eq_Tensor, {as_index(c.x(3)), c.call(ops::gather, {out, c.a(1), index})}));
  Value* count = c.call(ops::scatter_add, {h_self, c.a(1), index, h_src});
  Value* self_share = c.div(h_self, count);
  Value* src_share = c.div(h_src, c.call(ops::gather, {count, c.a(1), index}));
  return {c.per_arg({
      [&](Ctx&, Value* t) { return c.mul(t, self_share); },
      {},
      {},
      [&](Ctx&, Value* t) {
        return c.call(ops::scatter_add, {c.zeros_like(out), c.a(1), index, c.mul(as_index(t), src_share)});
      },
  })};
}

// grid_sampler_{2,3}d(x, grid, mode, padding, align_corners): linear in x; in the sampling
// positions, Σ_k tgrid[.., k]·∂out/∂grid[.., k] per channel. The op's backward kernel gives those
// partials summed over channels; with the channels folded into the batch (x as [N·C, 1, ...],
// the grid repeated per channel) it gives each channel's own, a primal expression that fold
// evaluates once. Nearest sampling is piecewise constant in the positions: no tangent there.
// cuDNN's grid sampler (what LibTorch picks on CUDA for bilinear sampling, zero padding and
// aligned corners) is the same function: its partials come from grid_sampler_2d_backward.
Value* sampling_positions_term(Ctx& c, Value* t) {
  bool cudnn = c.n.is(ops::cudnn_grid_sampler);
  if (!cudnn && c.c(2).toInt() == 1) return nullptr;
  const auto &xs = c.x(0)->meta().sizes, &gs = c.x(1)->meta().sizes;  // [N, C, in...], [N, out..., k]
  int64_t n = xs[0], ch = xs[1];
  std::vector<int64_t> x_flat = {n * ch, 1}, per_channel = {n, ch}, ones = {n * ch, 1};
  x_flat.insert(x_flat.end(), xs.begin() + 2, xs.end());
  per_channel.insert(per_channel.end(), gs.begin() + 1, gs.end());
  ones.insert(ones.end(), gs.begin() + 1, gs.end() - 1);
  std::vector<int64_t> grid_flat = per_channel;
  grid_flat.erase(grid_flat.begin());
  grid_flat[0] = n * ch;
  Value* grid = reshape(c.b, c.call(ops::expand, {c.unsqueeze(c.x(1), 1), per_channel}), grid_flat);
  const TensorMeta& m = c.out()->meta();
  Value* g = c.call(ops::ones, {ones, m.dtype, std::nullopt, m.device});
  std::vector<BArg> how = {0, 0, true};  // cuDNN's: bilinear, zeros, align_corners
  if (!cudnn) how = {c.a(2), c.a(3), c.a(4)};
  Value* partials =
      c.b.emit(cudnn ? std::string(ops::grid_sampler_2d_backward) : c.n.op() + "_backward",
               {g, reshape(c.b, c.x(0), x_flat), grid, how[0], how[1], how[2], c10::List<bool>({true, true})})
          .at(1);
  Value* f = c.call(ops::view, {partials, per_channel});
  return c.sum(c.mul(c.unsqueeze(t, 1), f), {-1});
}

// _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
// ...): sums and means of rows are linear in the weight, and sums bilinear in (weight,
// per-sample weights); max (mode 2) picks, per bag and feature, the row its max_indices output
// names (an empty bag is 0).
std::vector<Value*> embedding_bag(Ctx& c) {
  if (c.c(4).toInt() != 2) {
    Value* w = c.linear_in(0);
    return {c.add(w, c.linear_in(6))};  // per-sample weights: none where not a tensor
  }
  return {c.per_arg({[](Ctx& c, Value* t) {
    Value* picked = c.call(ops::gather, {t, 0, c.call(ops::clamp_min, {c.out(3), 0})});
    return c.masked_fill(picked, c.unsqueeze(c.eq(c.out(2), 0), 1), 0.0);
  }})};
}

}  // namespace

void register_views(Registry& r) {
  for (Op op :
       {ops::expand, ops::transpose_int, ops::t, ops::permute, ops::unsqueeze, ops::squeeze, ops::squeeze_dim,
        ops::squeeze_dims, ops::select_int, ops::slice_Tensor, ops::split_Tensor, ops::split_with_sizes,
        ops::unsafe_split_Tensor, ops::unsafe_split_with_sizes, ops::unbind_int, ops::alias, ops::diagonal, ops::unfold,
        ops::index_select, ops::gather, ops::repeat, ops::flip, ops::roll, ops::index_Tensor, ops::embedding,
        // the copying forms of views (diag() is diagonal_copy)
        ops::diagonal_copy, ops::expand_copy, ops::permute_copy, ops::transpose_copy_int, ops::select_copy_int,
        ops::slice_copy_Tensor, ops::alias_copy})
    r.add(op, linear_in(0));
  // Pooling by averages, resampling and padding by reflection or replication: linear too.
  for (Op op :
       {ops::avg_pool2d, ops::avg_pool3d, ops::_adaptive_avg_pool2d, ops::_adaptive_avg_pool3d, ops::upsample_nearest1d,
        ops::upsample_nearest2d, ops::upsample_nearest3d, ops::_upsample_nearest_exact1d,
        ops::_upsample_nearest_exact2d, ops::_upsample_nearest_exact3d, ops::upsample_linear1d,
        ops::upsample_bilinear2d, ops::upsample_bicubic2d, ops::upsample_trilinear3d, ops::reflection_pad1d,
        ops::reflection_pad2d, ops::reflection_pad3d, ops::replication_pad1d, ops::replication_pad2d,
        ops::replication_pad3d, ops::pixel_shuffle, ops::pixel_unshuffle, ops::channel_shuffle, ops::trace,
        ops::_upsample_bilinear2d_aa, ops::_upsample_bicubic2d_aa, ops::im2col, ops::col2im, ops::narrow_copy,
        ops::masked_select, ops::diag_embed, ops::affine_grid_generator,
        // max pooling's backward: linear in grad_output; self enters only through the indices
        ops::max_pool2d_with_indices_backward, ops::max_pool3d_with_indices_backward})
    r.add(op, linear_in(0));
  // Max pooling picks elements: the tangent at the indices it returns, which index each
  // channel's flattened spatial dims (the last 2 or 3).
  for (auto [op, space] : {std::pair{ops::max_pool2d_with_indices, 2}, std::pair{ops::max_pool3d_with_indices, 3},
                           std::pair{ops::adaptive_max_pool2d, 2}, std::pair{ops::adaptive_max_pool3d, 3}})
    r.add(op, per_arg({[space = static_cast<size_t>(space)](Ctx& c, Value* t) {
            auto flat = [&](Value* v) {
              std::vector<int64_t> sizes(v->meta().sizes.begin(),
                                         v->meta().sizes.end() - static_cast<std::ptrdiff_t>(space));
              sizes.push_back(-1);
              return c.reshape(v, sizes);
            };
            return c.reshape(c.call(ops::gather, {flat(t), -1, flat(c.out(1))}), c.out()->meta().sizes);
          }}));
  r.add(ops::cat, linear_in_list(0));
  r.add(ops::stack, linear_in_list(0));
  r.add(ops::block_diag, linear_in_list(0));
  r.add(ops::constant_pad_nd, per_arg({[](Ctx& c, Value* t) {  // the padding is constant: tangent 0
          return c.call(ops::constant_pad_nd, {t, c.a(1), 0.0});
        }}));
  // Scatters and writes into views (functionalized by the tracer) are linear in (self, source)
  // jointly.
  r.add(ops::scatter_add, linear_in_self_and(3, adds));
  r.add(ops::index_add, linear_in_self_and(3, adds));
  r.add(ops::scatter_src, linear_in_self_and(3));
  r.add(ops::index_copy, linear_in_self_and(3));
  r.add(ops::slice_scatter, linear_in_self_and(1));
  r.add(ops::select_scatter, linear_in_self_and(1));
  r.add(ops::diagonal_scatter, linear_in_self_and(1));
  r.add(ops::masked_scatter, linear_in_self_and(2));
  r.add(ops::index_put, linear_in_self_and(2, [](const Ctx& c) { return c.c(3).toBool(); }));  // accumulate
  r.add(ops::scatter_reduce_two, scatter_reduce);
  // index_fill, scatter of a value: the value is constant, its positions get tangent 0
  const Term filled_with_zero = [](Ctx& c, Value* t) {
    return c.call(ops::index_fill_int_Scalar, {t, c.a(1), c.x(2), 0.0});
  };
  r.add(ops::index_fill_int_Scalar, per_arg({filled_with_zero}));
  r.add(ops::index_fill_int_Tensor, [filled_with_zero](Ctx& c) -> std::vector<Value*> {  // value: a 0-dim tensor
    if (!c.t(3)) return {c.per_arg({filled_with_zero})};
    return {c.call(ops::index_fill_int_Tensor, {c.t_or_zeros(0), c.a(1), c.x(2), c.t(3)})};
  });
  r.add(ops::scatter_value, per_arg({[](Ctx& c, Value* t) {
          return c.call(ops::scatter_value, {t, c.a(1), c.x(2), 0.0});
        }}));
  // as_strided reads storage, which a tangent shares only when laid out as its primal. A
  // restride that keeps every element where it was (same sizes, strides changed only on dims of
  // size 1, the same offset: adaptive_avg_pool2d of a channels-last input makes one) is the
  // identity; any other as_strided of a tangent differently laid out is refused.
  r.add(
      ops::as_strided, per_arg({[](Ctx& c, Value* t) {
        const TensorMeta &in = c.x(0)->meta(), &out = c.out()->meta();
        bool same_elements = in.sizes == out.sizes && c.n.arg(3).kind == ArgKind::None;
        for (size_t d = 0; same_elements && d < in.sizes.size(); ++d)
          same_elements = in.sizes[d] == 1 || in.strides[d] == out.strides[d];
        if (same_elements) return t;
        if (t->meta().sizes != in.sizes || t->meta().strides != in.strides || c.n.arg(3).kind != ArgKind::None)
          throw Error(
              "as_strided of a tangent laid out unlike its primal (or at an explicit storage offset) is not supported");
        return c.reapply(0, t).at(0);
      }}));
  // linear in x, and the sampling positions' term
  for (Op op : {ops::grid_sampler_2d, ops::grid_sampler_3d, ops::cudnn_grid_sampler})
    r.add(op, per_arg({[](Ctx& c, Value* t) { return c.reapply(0, t).at(0); }, sampling_positions_term}));
  r.add(ops::_embedding_bag, embedding_bag);
  r.add(ops::_embedding_bag_forward_only, embedding_bag);
  r.add(ops::view, per_arg({[](Ctx& c, Value* t) { return c.reshape(t, c.c(1).toIntVector()); }}));
}

}  // namespace jvpc::jvp_rules
