// Grouped-query attention without repeated heads: a bmm whose right operand repeats each
// key/value head r times reads the unrepeated tensor, with the left operand's r matrices of a
// group stacked as rows.
//
// LibTorch's math path repeats k and v over the query heads (repeat_interleave: unsqueeze,
// expand, clone, view), and their tangents copy that chain, so every jvp call would clone dk
// and dv r times. For r matrices A_j of one group and the group's shared matrix X:
// [A_1; ...; A_r]·X = [A_1·X; ...; A_r·X], so
//
//   %e = aten::expand(aten::unsqueeze(%dk, 2), [B, Hk, r, S, D])       (%dk: [B, Hk, S, D])
//   %x = aten::view(aten::transpose.int(aten::view(aten::clone(%e), [B, H, S, D]), -2, -1), [B·H, D, S])
//   %y = aten::bmm(%a, %x)                                             (%a: [B·H, M, D])
//  =>
//   %x' = aten::view(aten::transpose.int(%dk, -2, -1), [B·Hk, D, S])
//   %y' = aten::bmm(aten::view(%a, [B·Hk, r·M, D]), %x')
//   %y  = aten::view(%y', [B·H, M, S])
//
// Same FLOPs, no copy. Between the expand and the bmm the chain may hold views that keep the
// last two dims, transposes of the last two dims, scalar multiplications and clones: each acts
// on every matrix alike, so it is replayed on the unrepeated tensor. Runs before fold, so the
// primal side (the repeated k and v residuals) shrinks by r too.
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/builder.h"

namespace jvpc {

namespace {

bool last_two_kept(const Node* n) {
  const auto &in = n->input(0)->meta().sizes, &out = n->output()->meta().sizes;
  return in.size() >= 2 && out.size() >= 2 && in[in.size() - 1] == out[out.size() - 1] &&
         in[in.size() - 2] == out[out.size() - 2];
}

bool swaps_last_two(const Node* n) {
  int64_t rank = static_cast<int64_t>(n->input(0)->meta().sizes.size());
  if (rank < 2) return false;
  int64_t a = c10::maybe_wrap_dim(n->arg(1).value.toInt(), rank),
          b = c10::maybe_wrap_dim(n->arg(2).value.toInt(), rank);
  return std::min(a, b) == rank - 2 && std::max(a, b) == rank - 1;
}

// One per-matrix step of the chain, to replay on the unrepeated tensor.
bool per_matrix(const Node* n) {
  if (n->outputs().size() != 1 || n->inputs().size() != 1) return false;
  const Op op = n->handle();
  if (op == ops::view) return last_two_kept(n);
  if (op == ops::transpose_int) return swaps_last_two(n);
  if (op == ops::mul_Scalar || op == ops::div_Scalar) return true;
  return op == ops::clone;
}

struct Repeat {
  Value* base;                     // [B, Hk, S, D]
  int64_t r;                       // repeats of each head
  std::vector<const Node*> steps;  // per-matrix steps from the expand to the operand, in order
};

// The operand as steps over expand(unsqueeze(base, 2), [B, Hk, r, S, D]), if it is one.
std::optional<Repeat> repeated(Value* x) {
  std::vector<const Node*> steps;
  const Node* n = x->producer();
  while (n && per_matrix(n)) {
    steps.insert(steps.begin(), n);
    n = n->input(0)->producer();
  }
  if (!n || !n->is(ops::expand) || n->inputs().size() != 1) return std::nullopt;
  const Node* u = n->input(0)->producer();
  if (!u || !u->is(ops::unsqueeze) || u->input(0)->meta().sizes.size() != 4 ||
      c10::maybe_wrap_dim(u->arg(1).value.toInt(), 5) != 2)
    return std::nullopt;
  const auto& e = n->output()->meta().sizes;  // [B, Hk, r, S, D]: only the new dim is expanded
  const auto& base = u->input(0)->meta().sizes;
  if (e.size() != 5 || e[2] <= 1 || e[0] != base[0] || e[1] != base[1] || e[3] != base[2] || e[4] != base[3])
    return std::nullopt;
  return Repeat{u->input(0), e[2], std::move(steps)};
}

}  // namespace

bool group_bmm(Graph& g) {
  return rewrite_nodes(g, [&](Node* n, Builder& b) {
    if (!n->is(ops::bmm)) return false;
    Value *a = n->input(0), *x = n->input(1);
    if (x->meta().sizes.size() != 3) return false;
    std::optional<Repeat> rep = repeated(x);
    if (!rep) return false;
    const auto &as = a->meta().sizes, &xs = x->meta().sizes;
    int64_t groups = xs[0] / rep->r, m = as[1];
    std::vector<int64_t> stacked = {groups, rep->r * m, as[2]};
    if (!viewable(a, stacked)) return false;

    Value* y = rep->base;
    for (const Node* s : rep->steps) {
      if (s->is(ops::transpose_int))
        y = b.call(ops::transpose_int, {y, -2, -1});
      else if (!s->is(ops::view) && !s->is(ops::clone))
        y = b.call(s->op(), {y, BArg::of_arg(s->arg(1), s)});
    }
    std::vector<int64_t> shared = {groups, xs[1], xs[2]};
    y = reshape(b, y, shared);
    Value* out = b.call(ops::bmm, {b.call(ops::view, {a, stacked}), y});
    replace_output(g, n, b.call(ops::view, {out, n->output()->meta().sizes}));
    return true;
  });
}

}  // namespace jvpc
