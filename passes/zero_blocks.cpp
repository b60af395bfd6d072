// Batched matmuls skip the zero blocks of a concatenated tangent.
//
// The tangent of cat([past, new]) with a constant past is cat([zeros, dnew]): a KV cache's
// tangent in a decoding step. A bmm reading it multiplies the zeros too, and every call makes
// and concatenates a cache-sized block of them. The views between the cat and the bmm
// (transposes, views that keep the cat dim whole) are replayed on each block, and then
//
//   bmm(a, cat([Z, t], contracted dim)) -> bmm(slice(a), t)            the zero block adds nothing
//   bmm(a, cat([Z, t], other dim))      -> cat([zeros, bmm(a, t)])     only t's columns computed
//
// and the same for a cat in bmm's left operand; a cat along the batch dim is left alone, and so
// is a chain where a value between the cat and the bmm has another reader. In a decoding step
// with 64 cached positions (sdpa, q [1, 2, 1, 8]) the tangent's matmul FLOPs go from 8,320 to
// 4,224 (what remains reads the cache once, for dq and for the scores' tangent), and no
// cache-sized block is made per call: the zeros left are the size of the scores' cached columns.
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/builder.h"

#include <c10/core/WrapDimMinimal.h>
#include <c10/util/accumulate.h>

namespace jvpc {

namespace {

bool is_zeros(const Value* v) {
  const Node* p = v->producer();
  return p && p->is(ops::zeros) && p->inputs().empty();
}

// A value as blocks along one dim: parts[i] (nullptr for a zero block of sizes[i] there).
struct Blocks {
  std::vector<Value*> parts;
  std::vector<int64_t> sizes;
  int64_t dim;
};

// `x` as the blocks of a cat with a zero block, through the views between them, each replayed on
// the non-zero blocks; every value on the way read only once. The nodes it builds are in `made`.
std::optional<Blocks> blocks_of(Builder& b, Value* x, std::vector<Node*>& made) {
  if (x->uses().size() != 1) return std::nullopt;  // read by the node at hand alone
  Node* n = x->producer();
  if (!n) return std::nullopt;
  int64_t rank = static_cast<int64_t>(x->meta().sizes.size());
  if (n->is(ops::cat)) {
    Blocks bl{{}, {}, c10::maybe_wrap_dim(n->arg(1).value.toInt(), rank)};
    for (int o : n->arg(0).operands) {
      Value* p = n->input(static_cast<size_t>(o));
      bl.parts.push_back(is_zeros(p) ? nullptr : p);
      bl.sizes.push_back(p->meta().sizes.at(static_cast<size_t>(bl.dim)));
    }
    if (std::find(bl.parts.begin(), bl.parts.end(), nullptr) == bl.parts.end()) return std::nullopt;
    return bl;
  }
  if (!n->is(ops::transpose_int) && !n->is(ops::view)) return std::nullopt;
  auto in = blocks_of(b, n->input(0), made);
  if (!in) return std::nullopt;
  Blocks out = *in;
  if (n->is(ops::transpose_int)) {
    int64_t a = c10::maybe_wrap_dim(n->arg(1).value.toInt(), rank),
            c = c10::maybe_wrap_dim(n->arg(2).value.toInt(), rank);
    out.dim = in->dim == a ? c : in->dim == c ? a : in->dim;
    for (Value*& p : out.parts)
      if (p) made.push_back((p = b.call(ops::transpose_int, {p, a, c}))->producer());
    return out;
  }
  // A view that keeps the cat dim and every dim after it, and merges or splits only dims before.
  const auto &from = n->input(0)->meta().sizes, &to = x->meta().sizes;
  size_t d = static_cast<size_t>(in->dim), tail = from.size() - d;
  if (to.size() < tail ||
      !std::equal(from.begin() + static_cast<std::ptrdiff_t>(d), from.end(),
                  to.end() - static_cast<std::ptrdiff_t>(tail)) ||
      c10::multiply_integers(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(d)) !=
          c10::multiply_integers(to.begin(), to.end() - static_cast<std::ptrdiff_t>(tail)))
    return std::nullopt;
  out.dim = static_cast<int64_t>(to.size() - tail);
  for (size_t i = 0; i < out.parts.size(); ++i) {
    if (!out.parts[i]) continue;
    std::vector<int64_t> sizes = to;
    sizes[static_cast<size_t>(out.dim)] = out.sizes[i];
    if (!viewable(out.parts[i], sizes)) return std::nullopt;  // a block whose layout cannot take it
    made.push_back((out.parts[i] = b.call(ops::view, {out.parts[i], sizes}))->producer());
  }
  return out;
}

// bmm(a, b) with operand `side` (0: a, 1: b) given as blocks, the other operand `other`.
Value* multiply_blocks(Builder& b, Value* other, const Blocks& bl, size_t side) {
  auto bmm = [&](Value* part, Value* with) {
    return b.call(ops::bmm, side == 1 ? std::vector<BArg>{with, part} : std::vector<BArg>{part, with});
  };
  bool contracted = bl.dim == (side == 1 ? 1 : 2);
  std::vector<Value*> results;
  int64_t offset = 0;
  for (size_t i = 0; i < bl.parts.size(); offset += bl.sizes[i], ++i) {
    if (contracted) {  // a sum over the blocks: the zero ones add nothing
      if (bl.parts[i])
        results.push_back(
            bmm(bl.parts[i], b.call(ops::slice_Tensor, {other, side == 1 ? 2 : 1, offset, offset + bl.sizes[i]})));
    } else if (bl.parts[i]) {  // the result's rows (left) or columns (right) of each block
      results.push_back(bmm(bl.parts[i], other));
    } else {
      const TensorMeta& m = other->meta();
      std::vector<int64_t> sizes = side == 1 ? std::vector<int64_t>{m.sizes[0], m.sizes[1], bl.sizes[i]}
                                             : std::vector<int64_t>{m.sizes[0], bl.sizes[i], m.sizes[2]};
      results.push_back(b.call(ops::zeros, {sizes, m.dtype, std::nullopt, m.device}));
    }
  }
  if (!contracted) return b.call(ops::cat, {results, bl.dim});
  Value* sum = results.at(0);
  for (size_t i = 1; i < results.size(); ++i) sum = b.call(ops::add_Tensor, {sum, results[i]});
  return sum;
}

}  // namespace

bool zero_blocks(Graph& g) {
  return rewrite_nodes(g, [&](Node* n, Builder& b) {
    if (!n->is(ops::bmm)) return false;
    for (size_t side : {size_t(1), size_t(0)}) {
      std::vector<Node*> made;
      auto bl = blocks_of(b, n->input(side), made);
      if (bl && bl->dim != 0) {
        Value* v = multiply_blocks(b, n->input(1 - side), *bl, side);
        if (same_layout(v, n->output())) {
          replace_output(g, n, v);
          return true;
        }
        made.push_back(v->producer());
      }
      erase_if_dead(g, made);  // what was built for nothing, in one walk
    }
    return false;
  });
}

}  // namespace jvpc
