// Recognizes attention on LibTorch's math path and attention written by hand in a JVP'd graph,
// and gives each the O(L) form of its tangent (jvpc::attention_tangent), for attention-form to
// choose under the residual budget.
//
// The anchor is a softmax over the last dim of scores S made from one bmm, whose probabilities
// P multiply v in another bmm:
//
//   S3 = bmm(A, Bt)                       A [N, Lq, D] from q; Bt [N, D, Lk] from kᵀ
//   S  = S3 (views to [B, H, Lq, Lk], ·c or /c, + mask or masked_fill(m, −inf), a cast)
//   P  = _safe_softmax(S, −1) | _softmax(S, −1)
//   O3 = bmm(P (views, a cast), V3)       V3 [N, Lk, Dv] from v
//
// (c: a number, or a one-element constant tensor of the graph, as Python wraps a number.)
//
// The views between q, k, v and A, Bt, V3, and between S3 and S and between P and O3, are
// taken by their composite effect (see "Chains of views"): the reshape to [N, L, X], kᵀ the
// transposed one, however matmul's reshapes or einsum's unsqueezes and permutes write it; a
// chain with another effect is not matched. Scores [B, Hkv, G, Lq, Lk] (grouped query heads as
// einsum writes them, unmasked) are attention over the G·Lq query rows of each key head.
//
// The tangent the rules emitted for it is followed the same way, step by step (each rule's
// output is known: a view's tangent is the view of the tangent, a bmm's is bmm(dA, Bt) +
// bmm(A, dBt), a mask's addition adds its tangent, softmax's is _softmax_backward_data), from
// the softmax's tangent up to the tangents of A, Bt and the mask, and down to the tangent of O3;
// a graph where any step differs is left as it is. q, k and v are then taken from above the
// views, scalings and grouped-query repeats (unsqueeze, expand, clone, view; or an expand of
// one key head) that lead to A, Bt and V3, with their tangents, so that the O(L) form holds the
// caller's tensors and never repeats k, v, dk or dv. Masks: an additive mask where(m, 0, −inf)
// is the boolean m; where(tril(ones), 0, −inf) or masked_fill(triu(ones, 1), −inf) is causal;
// masked_fill(m, −inf) is the boolean ¬m; any other additive mask is passed as it is, with its
// tangent.
//
// The logsumexp is an ordinary node, logsumexp(S, −1), on the scores the tracing run holds:
// fold evaluates it once from them, with no second forward; the output O is the traced one.
// The pass runs right after jvp, while O (a primal output) is still in the graph; the
// tangent's readers then read jvpc::attention_tangent, and the P form the rules emitted is
// left to dce. Where attention-form keeps P, matched_p_form emits it again: the same rules on
// the same primal nodes, from the tangents of q, k, v and the mask the match noted, so the
// graph is the one the rules gave (budget inf skips the pass altogether).
#include "passes/passes.h"
#include "ir/op.h"

#include "ir/builder.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/jvp_rules/rules.h"
#include "runtime/attention_tangent.h"

#include <c10/core/WrapDimMinimal.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>
#include <typeinfo>
#include <unordered_map>

namespace jvpc {

namespace {

Node* producer(const Value* v) { return v ? v->producer() : nullptr; }

bool is_op(const Value* v, Op op) {
  const Node* n = producer(v);
  return n && n->is(op);
}

std::string constant_key(const Arg& a) {
  if (a.kind == ArgKind::Float) return format_double(a.value.toDouble());
  std::ostringstream os;
  os << a.value;
  return os.str();
}

// Whether `t` is `p`'s op applied to `t_in` in operand `path` and to `p`'s other operands and
// constants: the tangent of an op linear in that operand, by its rule.
bool mirrors(const Node* p, const Value* t, const Value* t_in, size_t path = 0) {
  const Node* n = producer(t);
  if (!n || n->op() != p->op() || n->args().size() != p->args().size()) return false;
  if (n->inputs().size() != p->inputs().size() || path >= n->inputs().size() || n->input(path) != t_in) return false;
  for (size_t j = 0; j < p->inputs().size(); ++j)
    if (j != path && n->input(j) != p->input(j)) return false;
  for (size_t i = 0; i < p->args().size(); ++i) {
    const Arg &a = p->arg(i), &b = n->arg(i);
    if (a.kind != b.kind) return false;
    if (!a.is_tensor_kind() && constant_key(a) != constant_key(b)) return false;
  }
  return true;
}

// A primal value and its tangent (null: zero), and the scalar by which the value reaching the
// matmul is larger than `p`.
struct Side {
  Value* p = nullptr;
  Value* t = nullptr;
  double factor = 1.0;
};

// One step up through `p`'s producer `n` (its operand `path`), if `t` is that op's tangent too.
bool step(Side& s, Node* n, size_t path = 0) {
  Node* tn = producer(s.t);
  if (s.t && !(tn && path < tn->inputs().size() && mirrors(n, s.t, tn->input(path), path))) return false;
  s.p = n->input(path);
  if (s.t) s.t = tn->input(path);
  return true;
}

// The number a one-element constant of the graph holds (a Python scalar that LibTorch wrapped
// in a tensor, a captured scale).
std::optional<double> constant_number(const Value* v) {
  if (!v->graph() || v->producer() || v->meta().numel() != 1) return std::nullopt;
  for (const Input& in : v->graph()->inputs())
    if (in.value == v) {
      if (in.role != Role::Constant || !in.data.defined() || in.data.is_complex()) return std::nullopt;
      // Read as the compiler reads metadata: a Python dispatch mode (FlopCounterMode around
      // linearize) must not see it, and would get a wrapped number as a Python int.
      c10::impl::ExcludeDispatchKeyGuard no_python_modes(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      return in.data.item<double>();
    }
  return std::nullopt;
}

// mul.Tensor or div.Tensor of a value by such a constant: the operand it scales and the factor.
std::optional<std::pair<size_t, double>> tensor_scaling(const Node* n) {
  bool mul = n->is(ops::mul_Tensor), div = n->is(ops::div_Tensor);
  if ((!mul && !div) || n->inputs().size() != 2) return std::nullopt;
  for (size_t path : {size_t(0), size_t(1)}) {
    if (div && path == 1) break;
    std::optional<double> c = constant_number(n->input(1 - path));
    const Value* x = n->input(path);
    if (!c || *c == 0.0 || !std::isfinite(*c) || x->meta().sizes != n->output(0)->meta().sizes ||
        x->meta().dtype != n->output(0)->meta().dtype)
      continue;
    return std::make_pair(path, mul ? *c : 1.0 / *c);
  }
  return std::nullopt;
}

// One step up through a scaling by a number (mul or div by a Scalar or by a one-element constant
// of the graph), whose factor goes into `factor`.
bool peel_scaling(Side& s) {
  Node* n = producer(s.p);
  if (!n || n->inputs().empty() || n->arg(0).kind != ArgKind::Tensor) return false;
  if (auto sc = tensor_scaling(n)) {
    if (!step(s, n, sc->first)) return false;
    s.factor *= sc->second;
    return true;
  }
  const Op op = n->handle();
  if (op != ops::mul_Scalar && op != ops::div_Scalar) return false;
  std::optional<double> c = n->arg(1).number();
  if (!c || *c == 0.0 || !std::isfinite(*c)) return false;
  if (n->inputs().size() != 1 || n->input(0)->meta().dtype != s.p->meta().dtype || !step(s, n)) return false;
  s.factor *= op == ops::mul_Scalar ? *c : 1.0 / *c;
  return true;
}

// Up through ops that keep the sizes and the values up to a scalar: scalings, clones, identity
// expands and views.
void peel_same(Side& s, bool scalings = true) {
  for (;;) {
    if (scalings && peel_scaling(s)) continue;
    Node* n = producer(s.p);
    if (!n || n->inputs().size() != 1 || n->arg(0).kind != ArgKind::Tensor) return;
    const Op op = n->handle();
    bool same = op == ops::clone || op == ops::alias ||
                ((op == ops::expand || op == ops::view || op == ops::_unsafe_view || op == ops::reshape) &&
                 n->input(0)->meta().sizes == s.p->meta().sizes);
    if (!same || n->input(0)->meta().dtype != s.p->meta().dtype || !step(s, n)) return;
  }
}

// --- Chains of views ----------------------------------------------------------------------------
//
// matmul, einsum and the math path reach the bmms through different views of the same tensors:
// matmul reshapes its operands to [N, L, X] and the result back; einsum unsqueezes and permutes
// them to one order of its labels first, reshapes them to [N, L, X], and views and permutes the
// result back. What the match needs is only a chain's composite effect, an index map, so it
// computes that: the strides the chain gives the elements of a contiguous tensor at its top (each
// view is a row-major reshape of its input's elements, whatever their layout), compared with the
// strides of the reshape (or the transposed reshape) it must be. A chain whose effect differs
// (another order of the elements) is not taken.

bool is_reshape_op(Op op) {
  return op == ops::view || op == ops::_unsafe_view || op == ops::reshape || op == ops::unsqueeze ||
         op == ops::squeeze || op == ops::squeeze_dim || op == ops::squeeze_dims;
}

// An op that moves its input's elements without changing them: a reshape, a permutation, a copy,
// an identity expand.
bool is_view_step(const Node* n) {
  if (!n || n->inputs().size() != 1 || n->outputs().size() != 1 || n->arg(0).kind != ArgKind::Tensor) return false;
  const TensorMeta &in = n->input(0)->meta(), &out = n->output(0)->meta();
  if (in.dtype != out.dtype) return false;
  const Op op = n->handle();
  if (is_reshape_op(op) || op == ops::permute || op == ops::transpose_int || op == ops::clone || op == ops::alias)
    return true;
  return op == ops::expand && in.sizes == out.sizes;
}

// Where each element of a tensor is, as offsets into the elements of the chain's top.
struct Strided {
  std::vector<int64_t> sizes, strides;
};

Strided contiguous(const std::vector<int64_t>& sizes) {
  Strided s{sizes, std::vector<int64_t>(sizes.size(), 1)};
  for (size_t i = sizes.size(); i-- > 1;) s.strides[i - 1] = s.strides[i] * std::max<int64_t>(sizes[i], 1);
  return s;
}

// The layout after the view step `n`; false where no strides express it (a reshape of permuted
// elements that would need a copy).
bool apply(Strided& s, const Node* n) {
  const Op op = n->handle();
  const std::vector<int64_t>& out = n->output(0)->meta().sizes;
  if (is_reshape_op(op)) {
    auto st = view_strides(s.sizes, s.strides, out);
    if (!st) return false;
    s = {out, *st};
    return true;
  }
  if (op == ops::permute || op == ops::transpose_int) {
    int64_t r = static_cast<int64_t>(s.sizes.size());
    std::vector<int64_t> perm(s.sizes.size());
    for (int64_t i = 0; i < r; ++i) perm[i] = i;
    if (op == ops::permute) {
      std::vector<int64_t> dims = n->arg(1).value.toIntVector();
      if (static_cast<int64_t>(dims.size()) != r) return false;
      for (int64_t i = 0; i < r; ++i) perm[i] = c10::maybe_wrap_dim(dims[i], r);
    } else {
      std::swap(perm[c10::maybe_wrap_dim(n->arg(1).value.toInt(), r)],
                perm[c10::maybe_wrap_dim(n->arg(2).value.toInt(), r)]);
    }
    Strided t;
    for (int64_t d : perm) t.sizes.push_back(s.sizes[d]), t.strides.push_back(s.strides[d]);
    if (t.sizes != out) return false;
    s = std::move(t);
    return true;
  }
  return s.sizes == out;  // a copy, an identity expand
}

// The layout `steps` (top first) give the elements of a contiguous tensor of `top` sizes;
// nullopt where no strides express it. Null steps (scalings, casts) keep it.
std::optional<Strided> composite(const std::vector<int64_t>& top, const std::vector<const Node*>& steps) {
  Strided s = contiguous(top);
  for (const Node* n : steps)
    if (n && !apply(s, n)) return std::nullopt;
  return s;
}

// Whether two layouts put every element at the same place (dims of size 1 have no stride).
bool same_elements(const std::optional<Strided>& a, const Strided& b) {
  if (!a || a->sizes != b.sizes) return false;
  for (size_t i = 0; i < b.sizes.size(); ++i)
    if (b.sizes[i] != 1 && a->strides[i] != b.strides[i]) return false;
  return true;
}

// The layout of X.reshape(sizes) for a contiguous X, or (`transposed`) of
// X.reshape(sizes with the last two swapped).transpose(-2, -1).
Strided reshaped(std::vector<int64_t> sizes, bool transposed) {
  if (!transposed || sizes.size() < 2) return contiguous(sizes);
  std::swap(sizes.end()[-1], sizes.end()[-2]);
  Strided s = contiguous(sizes);
  std::swap(s.sizes.end()[-1], s.sizes.end()[-2]);
  std::swap(s.strides.end()[-1], s.strides.end()[-2]);
  return s;
}

// Up from `s` through view steps and (`scalings`) scalings whose tangents mirror them, to the
// highest value X whose sizes are one of `tops` and of which `s` is, element for element, the
// reshape (`transposed`: the transposed reshape, as kᵀ is of k). False, `s` as it was, where
// there is none.
bool peel_to(Side& s, const std::vector<std::vector<int64_t>>& tops, bool transposed, bool scalings) {
  std::vector<Side> at = {s};
  std::vector<const Node*> steps;  // steps[i] leads from at[i + 1] to at[i]
  for (int guard = 0; guard < 24; ++guard) {
    Side x = at.back();
    Node* n = producer(x.p);
    if (scalings && peel_scaling(x)) {
      steps.push_back(nullptr);
    } else if (is_view_step(n) && step(x, n)) {
      steps.push_back(n);
    } else {
      break;
    }
    at.push_back(x);
  }
  const Strided want = reshaped(s.p->meta().sizes, transposed);
  for (size_t i = at.size(); i-- > 0;) {
    const std::vector<int64_t>& top = at[i].p->meta().sizes;
    if (std::find(tops.begin(), tops.end(), top) == tops.end()) continue;
    std::vector<const Node*> down(steps.rbegin() + static_cast<std::ptrdiff_t>(steps.size() - i), steps.rend());
    if (!same_elements(composite(top, down), want)) continue;
    s = at[i];
    return true;
  }
  return false;
}

// Up through the repeat of key heads [B, Hkv, L, X] -> [B, Hkv·G, L, X]: unsqueeze(2), expand,
// clone (or not), view; or an expand of a single head. Every step's tangent must mirror it.
bool peel_repeat(Side& s) {
  const auto& sz = s.p->meta().sizes;
  if (sz.size() != 4) return false;
  Node* n = producer(s.p);
  if (!n) return false;
  if (n->is(ops::expand) && n->input(0)->meta().sizes.size() == 4 && n->input(0)->meta().sizes[1] == 1) {
    const auto& in = n->input(0)->meta().sizes;
    if (in[0] != sz[0] || in[2] != sz[2] || in[3] != sz[3]) return false;
    return step(s, n);
  }
  if (!n->is(ops::view) && !n->is(ops::_unsafe_view) && !n->is(ops::reshape)) return false;
  Side x = s;
  if (!step(x, n)) return false;
  if (is_op(x.p, ops::clone) && !step(x, producer(x.p))) return false;
  Node* e = producer(x.p);
  if (!e || !e->is(ops::expand)) return false;
  const auto& five = x.p->meta().sizes;
  if (five.size() != 5 || five[0] != sz[0] || five[1] * five[2] != sz[1] || five[3] != sz[2] || five[4] != sz[3])
    return false;
  if (!step(x, e)) return false;
  Node* u = producer(x.p);
  if (!u || !u->is(ops::unsqueeze) || u->arg(1).value.toInt() != 2) return false;
  if (!step(x, u)) return false;
  s = x;
  return true;
}

// q, k or v as the operator takes it: [B, Hx, L, X] or [N, L, X], from the bmm operand `s`
// ([N, L, X], a reshape of it through the views a matmul or an einsum adds) or from `s` above its
// transposition, as high up as the steps mirror.
// (`scalings`: through scalar multiplications too, whose product goes into `factor`).
// (`grouped`: q's [B, H, G, Lq, D] of grouped scores, another size it may have.)
Side operand(Side s, int64_t B, int64_t H, bool repeats, bool scalings, const std::vector<int64_t>& grouped = {}) {
  const auto sz = s.p->meta().sizes;
  if (sz.size() == 3) {
    std::vector<std::vector<int64_t>> tops = {{B, H, sz[1], sz[2]}, sz};
    if (!grouped.empty()) tops.push_back(grouped);
    peel_to(s, tops, false, scalings);
  }
  peel_same(s, scalings);
  if (repeats && s.p->meta().sizes.size() == 4 && peel_repeat(s)) peel_same(s, scalings);
  return s;
}

// The operator's [B, H, Lq] for scores [N, Lq, Lk], [B, H, Lq, Lk], or [B, H, G, Lq, Lk]: grouped
// query heads as an einsum over q [B, Hkv, G, Lq, D] and k [B, Hkv, Lk, D] writes them, whose bmm
// takes the G·Lq query rows of each key head together.
std::array<int64_t, 3> rows_of(const std::vector<int64_t>& ps) {
  if (ps.size() == 3) return {1, ps[0], ps[1]};
  if (ps.size() == 4) return {ps[0], ps[1], ps[2]};
  return {ps[0], ps[1], ps[2] * ps[3]};
}

// Views `v` ([N, L, X], [B, Hx, L, X] or grouped [B, Hx, G, Lq, X]) as [B, Hx, L, X], copying
// only where it must.
Value* as4d(Builder& b, Value* v, int64_t B) {
  if (!v || v->meta().sizes.size() == 4) return v;
  const auto& s = v->meta().sizes;
  std::vector<int64_t> shape = s.size() == 5 ? std::vector<int64_t>{s[0], s[1], s[2] * s[3], s[4]}
                                             : std::vector<int64_t>{B, s[0] / B, s[1], s[2]};
  return reshape(b, v, shape);
}

bool is_scalar_tensor(const Value* v, double x) {
  const Node* n = producer(v);
  if (!n || !n->is(ops::scalar_tensor)) return false;
  std::optional<double> c = n->arg(0).number();
  return c && (*c == x || (std::isnan(x) && std::isnan(*c)));
}

// ones([Lq, Lk], bool) through tril(·, 0) (`lower`) or triu(·, 1): the causal mask of
// top-left aligned attention, or its complement.
bool is_causal(const Value* m, int64_t Lq, int64_t Lk, bool lower) {
  const Node* n = producer(m);
  if (!n || n->op() != (lower ? ops::tril : ops::triu) || n->arg(1).value.toInt() != (lower ? 0 : 1)) return false;
  const Node* ones = producer(n->input(0));
  return ones && ones->is(ops::ones) && m->meta().dtype == c10::kBool &&
         m->meta().sizes == std::vector<int64_t>{Lq, Lk};
}

// Whether `v` is a bmm's result, through views and scalings.
bool reaches_bmm(const Value* v) {
  for (int guard = 0; guard < 16 && v; ++guard) {
    const Node* n = producer(v);
    if (!n) return false;
    if (n->is(ops::bmm)) return true;
    const Op op = n->handle();
    if (auto sc = tensor_scaling(n)) {
      v = n->input(sc->first);
      continue;
    }
    if (!is_view_step(n) && op != ops::mul_Scalar && op != ops::div_Scalar && op != ops::_to_copy) return false;
    v = n->input(0);
  }
  return false;
}

// One step of the scores' chain between the bmm and the softmax.
struct ScoreStep {
  Node* n;
  bool mask = false;  // add.Tensor or masked_fill: the mask step (operand `path` is the scores)
  size_t path = 0;
};

struct Match {
  Node* softmax;
  Node* scores_bmm;
  Node* out_bmm;
  std::vector<ScoreStep> steps;  // from the softmax up to the bmm
  double scale = 1.0;
  Value* mask = nullptr;           // as the operator takes it (null: none)
  Value* mask_value = nullptr;     // the primal the mask step reads
  bool keep_mask_negated = false;  // masked_fill(m, −inf): the operator's mask is ¬m
  bool causal = false;
  Side a, bt, v3;             // the matmuls' operands A, Bt, V3 and their tangents
  Side q, k, v;               // q, k and v as the operator takes them (3-d or 4-d)
  bool k_transposed = false;  // k is [.., Lk, D] (else it is kᵀ, [.., D, Lk])
  Value* dmask = nullptr;
  Value* dout3 = nullptr;
};

// The scores' chain from the softmax's input up to a bmm; false if it has another shape.
bool score_chain(Match& m) {
  Value* s = m.softmax->input(0);
  bool masked = false;
  bool moved = false;  // a view below that moves elements across the last dim: no mask above it
  const int64_t Lq = s->meta().sizes.end()[-2], Lk = s->meta().sizes.back();
  for (int guard = 0; guard < 24; ++guard) {
    Node* n = producer(s);
    if (!n) return false;
    const Op op = n->handle();
    if (op == ops::bmm) {
      // The views between, together, must be the reshape of the bmm's result to the scores.
      std::vector<const Node*> down;
      for (auto it = m.steps.rbegin(); it != m.steps.rend(); ++it)
        down.push_back(!it->mask && is_view_step(it->n) ? it->n : nullptr);
      if (!same_elements(composite(n->output(0)->meta().sizes, down), contiguous(m.softmax->input(0)->meta().sizes)))
        return false;
      m.scores_bmm = n;
      return true;
    }
    ScoreStep st{n};
    if (auto sc = tensor_scaling(n)) {
      m.scale *= sc->second;
      st.path = sc->first;
    } else if (is_view_step(n)) {
      const auto& in = n->input(0)->meta().sizes;
      bool keeps_rows = (op == ops::view || op == ops::_unsafe_view || op == ops::reshape || op == ops::clone) &&
                        in.size() >= 3 && in.back() == Lk;
      moved |= !keeps_rows;
    } else if (op == ops::mul_Scalar || op == ops::div_Scalar) {
      std::optional<double> c = n->arg(1).number();
      if (!c || *c == 0.0 || !std::isfinite(*c)) return false;
      m.scale *= op == ops::mul_Scalar ? *c : 1.0 / *c;
    } else if (op == ops::_to_copy) {
      // Scores cast up (softmax in float32 over bf16/f16 scores): the operator computes them in
      // float32 itself.
      c10::ScalarType from = n->input(0)->meta().dtype, to = s->meta().dtype;
      if (!(c10::isReducedFloatingType(from) && to == c10::kFloat) || n->inputs().size() != 1) return false;
    } else if (moved) {
      return false;  // a mask on permuted scores would be misplaced in the operator's [.., Lq, Lk]
    } else if (op == ops::add_Tensor && !masked && n->arg(2).is_number(1.0)) {
      if (n->arg(0).kind != ArgKind::Tensor || n->arg(1).kind != ArgKind::Tensor) return false;
      // The scores are the operand with the full shape that leads to the bmm.
      auto path_ok = [&](size_t i) {
        const Value* x = n->tensor_arg(i);
        return x->meta().sizes == s->meta().sizes && x->meta().dtype == s->meta().dtype && reaches_bmm(x);
      };
      size_t path = path_ok(0) ? 0 : 1;
      if (!path_ok(path)) return false;
      Value* mask = n->tensor_arg(1 - path);
      if (!c10::isFloatingType(mask->meta().dtype)) return false;
      st.mask = true;
      st.path = path;
      masked = true;
      m.mask_value = mask;
      Node* w = producer(mask);
      if (w && w->is(ops::where_self) && is_scalar_tensor(w->input(1), 0.0) &&
          is_scalar_tensor(w->input(2), -std::numeric_limits<double>::infinity()) &&
          w->input(0)->meta().dtype == c10::kBool) {
        if (is_causal(w->input(0), Lq, Lk, true))
          m.causal = true;
        else
          m.mask = w->input(0);
      } else {
        m.mask = mask;
      }
    } else if (op == ops::masked_fill_Scalar && !masked) {
      std::optional<double> c = n->arg(2).number();
      if (!c || *c != -std::numeric_limits<double>::infinity()) return false;
      Value* cond = n->input(1);
      st.mask = true;
      masked = true;
      m.mask_value = cond;
      if (is_causal(cond, Lq, Lk, false))
        m.causal = true;
      else if (is_op(cond, ops::logical_not) || is_op(cond, ops::bitwise_not))
        m.mask = producer(cond)->input(0);
      else
        m.mask = cond, m.keep_mask_negated = true;
    } else {
      return false;
    }
    m.steps.push_back(st);
    s = n->tensor_arg(st.path);
  }
  return false;
}

// The tangent of the bmm's output from the tangent `t` of the softmax's input, following the
// chain's rules up; sets the tangents of A, Bt and the mask.
bool tangent_up(Match& m, size_t i, Value* t) {
  if (i == m.steps.size()) {
    Node* s = m.scores_bmm;
    Value *A = s->input(0), *Bt = s->input(1);
    if (!t) return true;
    auto left = [&](Value* x) {
      return is_op(x, ops::bmm) && producer(x)->input(1) == Bt ? producer(x)->input(0) : nullptr;
    };
    auto right = [&](Value* x) {
      return is_op(x, ops::bmm) && producer(x)->input(0) == A ? producer(x)->input(1) : nullptr;
    };
    if (Value* l = left(t)) {
      m.a.t = l;
      return true;
    }
    if (Value* r = right(t)) {
      m.bt.t = r;
      return true;
    }
    Node* add = producer(t);
    if (add && add->is(ops::add_Tensor) && add->arg(2).is_number(1.0) && add->inputs().size() == 2) {
      Value *l = left(add->input(0)), *r = right(add->input(1));
      if (l && r) {
        m.a.t = l;
        m.bt.t = r;
        return true;
      }
    }
    return false;
  }
  const ScoreStep& st = m.steps[i];
  if (!st.mask || st.n->is(ops::masked_fill_Scalar)) {
    if (!t) return tangent_up(m, i + 1, nullptr);
    Node* n = producer(t);
    if (!n || st.path >= n->inputs().size() || !mirrors(st.n, t, n->input(st.path), st.path)) {
      // masked_fill's tangent is masked_fill(t, m, 0): same op and mask, another value.
      if (!(st.n->is(ops::masked_fill_Scalar) && n && n->op() == st.n->op() && n->input(1) == st.n->input(1) &&
            n->arg(2).is_number(0.0)))
        return false;
    }
    return tangent_up(m, i + 1, n->input(st.path));
  }
  // The mask's addition: the tangent is the scores' (the mask has none), their sum (in the
  // primal's order), or the mask's alone, broadcast to the scores by the JVP pass.
  Value* saved_a = m.a.t;
  Value* saved_bt = m.bt.t;
  if (t && tangent_up(m, i + 1, t)) return true;
  m.a.t = saved_a, m.bt.t = saved_bt;
  Node* n = producer(t);
  if (n && n->is(ops::add_Tensor) && n->arg(2).is_number(1.0) && n->inputs().size() == 2 &&
      tangent_up(m, i + 1, n->input(st.path))) {
    m.dmask = n->input(1 - st.path);
    return true;
  }
  m.a.t = saved_a, m.bt.t = saved_bt;
  if (!t) return tangent_up(m, i + 1, nullptr);
  // The mask's tangent alone: no tangent reaches the scores.
  Value* d = t;
  while (is_op(d, ops::expand) || is_op(d, ops::_to_copy)) d = producer(d)->input(0);
  if (d->meta().sizes != m.mask_value->meta().sizes || !tangent_up(m, i + 1, nullptr)) return false;
  m.dmask = d;
  return true;
}

// Follows `t`, the tangent of `p`, down through the primal steps from `p` to `to` (views, casts),
// each time to the user of `t` that is the step's rule output; null where one is missing.
Value* tangent_down(const std::vector<Node*>& steps, Value* t) {
  for (Node* s : steps) {
    Value* next = nullptr;
    for (const Use& u : t->uses())
      if (!u.user->is_return() && u.index == 0 && mirrors(s, u.user->output(0), t)) next = u.user->output(0);
    if (!next) return nullptr;
    t = next;
  }
  return t;
}

// The path from the probabilities P to the bmm that multiplies them with v (operand 0), through
// views and casts; primal users only.
bool out_chain(Value* p, const ValueSet& tangent, std::vector<Node*>& steps, Node*& bmm) {
  for (const Use& u : p->uses()) {
    Node* n = u.user;
    if (n->is_return() || u.index != 0 || n->outputs().size() != 1 || tangent.count(n->output(0))) continue;
    if (n->is(ops::bmm)) {
      // The views between, together, must be the reshape of P to the bmm's [N, Lq, Lk].
      const Value* top = steps.empty() ? p : steps.front()->input(0);
      std::vector<const Node*> down;
      for (const Node* s : steps) down.push_back(is_view_step(s) ? s : nullptr);
      if (!same_elements(composite(top->meta().sizes, down), contiguous(p->meta().sizes))) continue;
      bmm = n;
      return true;
    }
    bool view = is_view_step(n) || (n->is(ops::_to_copy) && n->inputs().size() == 1);
    if (!view || steps.size() > 12) continue;
    steps.push_back(n);
    if (out_chain(n->output(0), tangent, steps, bmm)) return true;
    steps.pop_back();
  }
  return false;
}

// Recognizes the attention around one softmax node; false if it is not one jvpc can take.
bool recognize(Node* softmax, const ValueSet& tangent, Match& m) {
  m.softmax = softmax;
  Value* p = softmax->output(0);
  const auto& ps = p->meta().sizes;
  int64_t rank = static_cast<int64_t>(ps.size());
  if (rank < 3 || rank > 5) return false;
  int64_t dim = softmax->arg(1).value.toInt();
  if (dim != -1 && dim != rank - 1) return false;
  if (softmax->is(ops::_softmax) && softmax->arg(2).value.toBool()) return false;  // half to float
  if (softmax->is(ops::_safe_softmax) && !softmax->arg(2).value.isNone()) return false;
  if (!score_chain(m)) return false;
  // Grouped scores: a mask or causal over [Lq, Lk] is not the operator's over the G·Lq rows.
  if (rank == 5 && m.mask_value) return false;
  std::vector<Node*> down;
  if (!out_chain(p, tangent, down, m.out_bmm)) return false;
  const std::array<int64_t, 3> rows = rows_of(ps);
  const int64_t B = rows[0], H = rows[1], Lq = rows[2], Lk = ps[rank - 1];
  const auto& s3 = m.scores_bmm->output(0)->meta().sizes;
  if (s3.size() != 3 || s3[0] != B * H || s3[1] != Lq || s3[2] != Lk) return false;
  const auto& o3 = m.out_bmm->output(0)->meta().sizes;
  if (m.out_bmm->input(0)->meta().sizes != s3 || o3[0] != B * H || o3[1] != Lq) return false;

  // The tangent of the scores, from the softmax's rule, and up the chain.
  Value* ds = nullptr;
  Value* dp = nullptr;
  for (const Use& u : p->uses())
    if (u.user->is(ops::_softmax_backward_data) && u.index == 1) {
      if (dp) return false;
      dp = u.user->output(0);
      ds = u.user->input(0);
    }
  // The rule casts the tangent to the softmax's output dtype where they differ.
  if (ds && ds->meta().dtype != softmax->input(0)->meta().dtype && is_op(ds, ops::_to_copy))
    ds = producer(ds)->input(0);
  m.a.p = m.scores_bmm->input(0);
  m.bt.p = m.scores_bmm->input(1);
  if (!tangent_up(m, 0, ds)) return false;
  if (dp && !m.a.t && !m.bt.t && !m.dmask) return false;

  // The tangent of the output: bmm(dP, V3) + bmm(P, dV3), by the bmm's rule.
  Value *pv = m.out_bmm->input(0), *v3 = m.out_bmm->input(1);
  Value* dpv = dp ? tangent_down(down, dp) : nullptr;
  if (dp && !dpv) return false;
  Value* term_p = nullptr;
  if (dpv)
    for (const Use& u : dpv->uses())
      if (u.user->is(ops::bmm) && u.index == 0 && u.user->input(1) == v3) term_p = u.user->output(0);
  if (dpv && !term_p) return false;
  Value* term_v = nullptr;
  for (const Use& u : pv->uses())
    if (u.user != m.out_bmm && u.user->is(ops::bmm) && u.index == 0 && tangent.count(u.user->input(1))) {
      if (term_v) return false;
      term_v = u.user->output(0);
    }
  m.v3 = {v3, term_v ? producer(term_v)->input(1) : nullptr};
  if (term_p && term_v) {
    for (const Use& u : term_p->uses())
      if (u.user->is(ops::add_Tensor) && u.index == 0 && u.user->input(1) == term_v && u.user->arg(2).is_number(1.0))
        m.dout3 = u.user->output(0);
  } else {
    m.dout3 = term_p ? term_p : term_v;
  }
  if (!m.dout3) return false;

  // q, k and v above the views, scalings and repeats that lead to the matmuls. v's scalings stay
  // (the output is P times the values the bmm reads).
  m.q = operand(
      m.a, B, H, false, true,
      rank == 5 ? std::vector<int64_t>{ps[0], ps[1], ps[2], ps[3], m.a.p->meta().sizes[2]} : std::vector<int64_t>{});
  // Bt is kᵀ: k ([B, H, Lk, D] or [N, Lk, D]) reshaped to [N, Lk, D] and transposed (matmul's
  // view of k.transpose(-2, -1), einsum's permutes); or k as the caller transposed it.
  Side bt = m.bt;
  const auto bs = bt.p->meta().sizes;
  m.k_transposed = peel_to(bt, {{B, H, bs[2], bs[1]}, {bs[0], bs[2], bs[1]}}, true, true);
  if (!m.k_transposed) {
    peel_to(bt, {{B, H, bs[1], bs[2]}, bs}, false, true);
    peel_same(bt);
  }
  auto heads = [&](const Side& x) { return x.p->meta().sizes.size() == 4 ? x.p->meta().sizes[1] : H; };
  m.k = m.k_transposed ? operand(bt, B, H, true, true) : bt;
  m.v = operand(m.v3, B, H, true, false);
  if (heads(m.k) != heads(m.v)) {  // grouped differently: the repeated k and v
    m.k = m.k_transposed ? operand(bt, B, H, false, true) : bt;
    m.v = operand(m.v3, B, H, false, false);
  }
  int64_t hk = heads(m.k);
  if (hk <= 0 || H % hk != 0 || heads(m.v) != hk) return false;
  for (const Side* x : {&m.q, &m.k, &m.v}) {
    const auto& sz = x->p->meta().sizes;
    if (sz.size() == 4 && sz[0] != B) return false;
    if (sz.size() == 3 && sz[0] != B * H) return false;
    if (sz.size() == 5 && (x != &m.q || sz[0] != B || sz[1] != H || sz[2] * sz[3] != Lq)) return false;
    if (sz.size() < 3 || sz.size() > 5) return false;
  }
  return true;
}

// Builds jvpc::attention_tangent for a match at the insertion point; returns the node and
// d(O3) (its result in O3's shape).
std::pair<Node*, Value*> build(Graph& g, const Match& m) {
  Builder b(g);
  Value* s = m.softmax->input(0);
  const std::array<int64_t, 3> rows = rows_of(s->meta().sizes);
  const int64_t B = rows[0], H = rows[1], Lq = rows[2];
  Value* q4 = as4d(b, m.q.p, B);
  Value* dq4 = as4d(b, m.q.t, B);
  Value* k4 = as4d(b, m.k.p, B);
  Value* dk4 = as4d(b, m.k.t, B);
  if (!m.k_transposed) {
    k4 = b.call(ops::transpose_int, {k4, -2, -1});
    if (dk4) dk4 = b.call(ops::transpose_int, {dk4, -2, -1});
  }
  Value* v4 = as4d(b, m.v.p, B);
  Value* dv4 = as4d(b, m.v.t, B);
  Value* o3 = m.out_bmm->output(0);
  Value* out4 = as4d(b, o3, B);
  // The logsumexp of the scores, which fold computes once from the tracing run's.
  Value* lse = b.call(ops::logsumexp, {s, std::vector<int64_t>{-1}, false});
  if (lse->meta().sizes != std::vector<int64_t>{B, H, Lq})
    lse = b.call(ops::view, {lse, std::vector<int64_t>{B, H, Lq}});
  Value* mask = m.mask;
  if (mask && m.keep_mask_negated) mask = b.call(ops::eq_Scalar, {mask, 0});  // ¬m
  auto opt = [](Value* t) { return t ? BArg(t) : BArg(std::nullopt); };
  Value* r = b.call(ops::jvpc_attention_tangent,
                    {q4, k4, v4, out4, lse, opt(dq4), opt(dk4), opt(dv4), opt(mask), opt(m.dmask), m.causal,
                     m.scale * m.q.factor * m.k.factor, runtime::kAttentionBlockQ, runtime::kAttentionBlockK});
  Node* node = producer(r);
  if (r->meta().sizes != o3->meta().sizes) r = b.call(ops::view, {r, o3->meta().sizes});
  return {node, r};
}

// An exception's first line, or its type where it has no message.
std::string detail_of(const std::exception& e) {
  std::string msg = one_line(e);
  return msg.empty() ? std::string("an error without a message (") + typeid(e).name() + ")" : msg;
}

}  // namespace

std::vector<MatchedAttention> attention_match(Graph& g) {
  ValueSet tangent = tangent_dependent(g);
  std::vector<Match> matches;
  for (Node* n : g.nodes()) {
    if (!n->is(ops::_safe_softmax) && !n->is(ops::_softmax)) continue;
    if (tangent.count(n->output(0))) continue;
    Match m;
    try {
      if (recognize(n, tangent, m)) matches.push_back(m);
    } catch (const std::exception& e) {
      throw Error("could not match the attention around the softmax " + describe(n) + ": " + detail_of(e));
    }
  }
  std::vector<MatchedAttention> out;
  for (Match& m : matches) {
    InsertionGuard at(g, m.dout3->producer());
    std::pair<Node*, Value*> built;
    try {
      built = build(g, m);
    } catch (const std::exception& e) {
      throw Error("could not build the O(L) form of the attention " + describe(m.out_bmm) + ": " + detail_of(e));
    }
    auto [node, r] = built;
    m.dout3->replace_all_uses_with(r);
    MatchedAttention a{node, r, m.out_bmm->output(0), {{m.q.p, m.q.t}, {m.k.p, m.k.t}, {m.v.p, m.v.t}}};
    if (m.mask_value) a.seeds.emplace_back(m.mask_value, m.dmask);
    out.push_back(std::move(a));
  }
  return out;
}

Value* matched_p_form(Graph& g, const MatchedAttention& m) {
  std::unordered_map<const Value*, Value*> tangent;
  for (const auto& [p, t] : m.seeds)
    if (t) tangent[p] = t;
  // The primal nodes the output depends on, up to the seeds.
  std::unordered_set<const Node*> between;
  std::vector<const Value*> stack = {m.out};
  while (!stack.empty()) {
    const Value* v = stack.back();
    stack.pop_back();
    Node* n = v->producer();
    if (tangent.count(v) || !n || !between.insert(n).second) continue;
    for (const Value* in : n->inputs()) stack.push_back(in);
  }
  // Their rules in graph order, each tangent right after its primal node, as the jvp pass
  // emits them, or after the operand tangents it reads where one is defined later (a seed the
  // jvp pass made after the node: the contiguous copy a view's rule takes of a strided tangent).
  // A position is an index into the graph's nodes before any of this was emitted, and emitting
  // after position i inserts before node i + 1, so that what is emitted there stays in order.
  const std::vector<Node*> order = g.nodes();
  std::unordered_map<const Node*, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::unordered_map<const Value*, size_t> emitted_after;  // tangents emitted here
  auto defined_at = [&](const Value* v, size_t at_least) {
    auto e = emitted_after.find(v);
    if (e != emitted_after.end()) return std::max(at_least, e->second);
    auto p = v->producer() ? position.find(v->producer()) : position.end();
    return p == position.end() ? at_least : std::max(at_least, p->second);
  };
  Builder b(g);
  const auto& rules = jvp_rules::registry();
  for (size_t i = 0; i < order.size(); ++i) {
    Node* n = order[i];
    if (!between.count(n)) continue;
    std::vector<Value*> in_t;
    bool any = false;
    size_t after = i;
    for (const Value* v : n->inputs()) {
      auto it = tangent.find(v);
      in_t.push_back(it == tangent.end() ? nullptr : it->second);
      any |= in_t.back() != nullptr;
      if (in_t.back()) after = defined_at(in_t.back(), after);
    }
    bool float_out = false;
    for (const Value* o : n->outputs()) float_out |= differentiable_dtype(o->meta().dtype);
    if (!any || !float_out) continue;
    const jvp_rules::Rule* rule = rules.find(n->op());
    if (!rule) throw Error("no JVP rule for " + n->op());
    InsertionGuard at(g, after + 1 < order.size() ? order[after + 1] : nullptr);
    jvp_rules::Ctx ctx(b, *n, std::move(in_t));
    std::vector<Value*> outs = (*rule)(ctx);
    for (size_t i = 0; i < outs.size() && i < n->outputs().size(); ++i) {
      Value* t = outs[i];
      const Value* o = n->output(i);
      if (!t || !differentiable_dtype(o->meta().dtype)) continue;
      if (t->meta().sizes != o->meta().sizes) t = b.call(ops::expand, {t, o->meta().sizes});
      if (t->meta().dtype != o->meta().dtype) t = b.call(ops::_to_copy, {t, o->meta().dtype});
      tangent[o] = t;
      emitted_after[t] = after;
    }
  }
  auto it = tangent.find(m.out);
  if (it == tangent.end()) throw Error("internal error: the P form of " + describe(m.node) + " has no tangent");
  return it->second;
}

}  // namespace jvpc
