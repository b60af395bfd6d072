// View simplification: the traced math path of attention reshapes every operand
// (expand to the same shape, view to 3-D, view back); its tangent copies those chains.
//
//   %3 = aten::expand(%0, [1, 5, 128, 64], false)   // %0 is already [1,5,128,64]
//   %4 = aten::view(%3, [5, 128, 64])
//  =>
//   %4 = aten::view(%0, [5, 128, 64])
//
// Rules: expand/view/alias to the same shape and strides is the identity; a clone or a same-
// dtype copy of a contiguous value is the identity (the IR is functional); transposing the
// same two dims twice is the identity; view of a view and expand of an expand collapse; an add
// of two views to one shape is a view of the add; a slice (select) of a slice_scatter
// (select_scatter) reads the source it wrote, or the base where it did not write.
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/builder.h"

#include <algorithm>
#include <optional>

namespace jvpc {

namespace {

std::pair<int64_t, int64_t> dims_of(const Node* n) {
  int64_t rank = static_cast<int64_t>(n->input(0)->meta().sizes.size());
  int64_t a = c10::maybe_wrap_dim(n->arg(1).value.toInt(), rank),
          b = c10::maybe_wrap_dim(n->arg(2).value.toInt(), rank);
  return {std::min(a, b), std::max(a, b)};
}

// The value `n` computes anyway, or nullptr.
Value* identity_of(const Node* n) {
  const Op op = n->handle();
  if (n->outputs().size() != 1 || n->inputs().empty()) return nullptr;
  Value *x = n->input(0), *out = n->output();
  if ((op == ops::expand || op == ops::view || op == ops::alias) && same_layout(x, out)) return x;
  if ((op == ops::clone || op == ops::_to_copy) && same_layout(x, out) && x->meta().is_contiguous()) return x;
  const Node* p = x->producer();
  if (op == ops::transpose_int && p && p->is(ops::transpose_int) && dims_of(n) == dims_of(p) &&
      same_layout(p->input(0), out))
    return p->input(0);
  if (op == ops::t && p && p->is(ops::t) && same_layout(p->input(0), out)) return p->input(0);
  return nullptr;
}

// The [begin, end) a slice with step 1 takes along `dim` of a dim of `size`, as ATen clamps it;
// nullopt for other steps.
std::optional<std::pair<int64_t, int64_t>> slice_range(const Node* n, size_t start_arg, int64_t size) {
  if (n->arg(start_arg + 2).kind != ArgKind::Int || n->arg(start_arg + 2).value.toInt() != 1) return std::nullopt;
  auto bound = [&](size_t i, int64_t none) {
    int64_t v = n->arg(i).kind == ArgKind::Int ? n->arg(i).value.toInt() : none;
    if (v < 0) v += size;
    return std::clamp<int64_t>(v, 0, size);
  };
  return std::pair{bound(start_arg, 0), bound(start_arg + 1, size)};
}

// Reading back what a scatter wrote, or what it left alone:
//   slice(slice_scatter(base, src, d, a, b), d, a, b) -> src
//   slice(slice_scatter(base, src, d, a, b), d, c, e) -> slice(base, d, c, e) for [c, e) apart from [a, b)
// and the same for select and select_scatter (writes through views leave these, and the tangent
// graph copies them).
bool read_around_scatter(Graph& g, Node* n) {
  bool slice = n->is(ops::slice_Tensor);
  if ((!slice && !n->is(ops::select_int)) || n->inputs().size() != 1) return false;
  Node* p = n->input(0)->producer();
  if (!p || p->op() != (slice ? ops::slice_scatter : ops::select_scatter) || p->inputs().size() != 2) return false;
  const TensorMeta& m = p->output()->meta();
  int64_t rank = static_cast<int64_t>(m.sizes.size());
  int64_t dim = c10::maybe_wrap_dim(n->arg(1).value.toInt(), rank);
  if (dim != c10::maybe_wrap_dim(p->arg(2).value.toInt(), rank)) return false;
  int64_t size = m.sizes.at(static_cast<size_t>(dim));
  bool same = false, apart = false;
  if (slice) {
    auto read = slice_range(n, 2, size), wrote = slice_range(p, 3, size);
    if (!read || !wrote) return false;
    same = *read == *wrote;
    apart = read->second <= wrote->first || wrote->second <= read->first;
  } else {
    auto index = [&](const Node* x, size_t i) {
      int64_t v = x->arg(i).value.toInt();
      return v < 0 ? v + size : v;
    };
    same = index(n, 2) == index(p, 3);
    apart = !same;
  }
  // (the source may be laid out more compactly than the view it replaces: anything taken of the
  // view can be taken of it)
  if (same && p->input(1)->meta().same_signature(n->output()->meta()) &&
      (p->input(1)->meta().is_contiguous() || same_layout(p->input(1), n->output()))) {
    replace_output(g, n, p->input(1));
    return true;
  }
  if (apart && same_layout(p->input(0), p->output())) {
    n->replace_input(0, p->input(0));
    erase_if_dead(g, p);
    return true;
  }
  return false;
}

bool has_negative(const std::vector<int64_t>& v) {
  return std::any_of(v.begin(), v.end(), [](int64_t s) { return s < 0; });
}

}  // namespace

bool simplify_views(Graph& g) {
  return rewrite_nodes(g, [&](Node* n, Builder& b) {
    if (Value* x = identity_of(n)) {
      replace_output(g, n, x);
      return true;
    }
    if (read_around_scatter(g, n)) return true;
    const Op op = n->handle();
    if (op == ops::add_Tensor && n->inputs().size() == 2) {
      // add(view(a, s), view(b, s)) -> view(add(a, b), s), for a and b of one layout: the
      // products of grouped bmms (group_bmm.cpp) then meet fuse_matmul_add unviewed.
      const Node *p = n->input(0)->producer(), *q = n->input(1)->producer();
      if (p && q && p->is(ops::view) && q->is(ops::view) && same_layout(p->input(0), q->input(0)) &&
          same_layout(n->input(0), n->output()) && same_layout(n->input(1), n->output()) &&
          p->input(0)->meta().is_contiguous()) {
        Value* sum = b.call(ops::add_Tensor, {p->input(0), q->input(0), BArg::of_arg(n->arg(2), n)});
        replace_output(g, n, b.call(ops::view, {sum, n->output()->meta().sizes}));
        return true;
      }
    }
    // view(view(x)) -> view(x); expand(expand(x)) -> expand(x)  (the outer node reads x)
    if ((op == ops::view || op == ops::expand) && !n->inputs().empty()) {
      Node* p = n->input(0)->producer();
      if (p && p->op() == op && !(op == ops::expand && has_negative(n->arg(1).value.toIntVector()))) {
        n->replace_input(0, p->input(0));
        erase_if_dead(g, p->output()->producer());
        return true;
      }
    }
    return false;
  });
}

}  // namespace jvpc
