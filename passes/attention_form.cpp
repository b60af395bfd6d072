// Chooses, per attention, the form of its tangent under a memory budget, and expands the
// attentions that hold P.
//
// The fused attention rules emit jvpc::attention_tangent (runtime/attention_tangent.h): the
// O(L) form, which holds q, k, v, out, the logsumexp and the mask, and recomputes q·kᵀ per call
// (5 bmms per block). The P form holds the probabilities P = exp(S − lse) (B·H·Lq·Lk), computed
// once by fold, and runs 4 bmms per call:
//
//   dS = dq·(kᵀ·scale) + (q·scale)·dkᵀ (+ dmask)   (scaled operands are primal: folded)
//   dP = P·(dS − Σ P·dS)                           one _softmax_backward_data
//   d(out) = dP·v + P·dv                           grouped heads: k, v and their tangents repeated
//
// The bytes each form takes (AttentionChoice): its residuals (O(L): out, lse, mask, q, k, v;
// P: P and the scaled and repeated q, k, v it multiplies) plus its peak per call (O(L): the
// output and the operator's block workspace; P: dS, dP and the product of the k tangent, each
// B·H·Lq·Lk, and the output). Only the attentions' own bytes are counted: what the rest of the
// tangent graph holds is the same in either form.
//
// The rule: every attention starts in the P form (fewest FLOPs). While the total passes the
// budget, the attention that frees the most bytes per extra FLOP moves to the O(L) form; an
// attention whose O(L) form frees nothing stays. A budget that even the all-O(L) total passes
// is an error naming that total, the smallest budget that would do. Budget 0 puts every
// attention in the O(L) form, kNoMemoryLimit ("inf") every one in the P form.
#include "passes/passes.h"

#include "compiler/cost/cost_model.h"
#include "compiler/ir/builder.h"
#include "compiler/ir/limits.h"
#include "compiler/ir/verifier.h"
#include "runtime/attention_tangent.h"

#include <ATen/TensorUtils.h>

#include <algorithm>
#include <limits>

namespace jvpc {

namespace {

// The P form of one jvpc::attention_tangent node, built before it; returns d(out).
Value* p_form(Builder& b, const Node& n) {
  auto call = [&](const std::string& op, std::vector<BArg> args) { return b.call(op, std::move(args)); };
  auto add = [&](Value* x, Value* y) { return x ? call("aten::add.Tensor", {x, y}) : y; };
  auto tensor = [&](size_t arg) { return n.arg(arg).kind == ArgKind::Tensor ? n.tensor_arg(arg) : nullptr; };
  // [b, h, s, d] -> [b·h, s, d], copying only if the value cannot be viewed that way.
  auto as3d = [&](Value* x) {
    const auto& s = x->meta().sizes;
    std::vector<int64_t> shape = {s[0] * s[1], s[2], s[3]};
    if (!at::detail::computeStride(s, x->meta().strides, shape))
      x = call("aten::clone", {x, c10::MemoryFormat::Contiguous});
    return call("aten::view", {x, shape});
  };
  auto as4d = [&](Value* x, std::vector<int64_t> shape) { return call("aten::view", {x, shape}); };
  // Repeats the heads of k or v ([b, h_k, s, d]) to `heads`, as grouped-query attention does.
  auto repeat_heads = [&](Value* x, int64_t heads) {
    auto s = x->meta().sizes;
    if (s[1] == heads) return x;
    int64_t r = heads / s[1];
    Value* e = call("aten::expand", {call("aten::unsqueeze", {x, 2}), std::vector<int64_t>{s[0], s[1], r, s[2], s[3]}});
    e = call("aten::clone", {e, c10::MemoryFormat::Contiguous});
    return call("aten::view", {e, std::vector<int64_t>{s[0], heads, s[2], s[3]}});
  };
  auto cast = [&](Value* x, c10::ScalarType dt) { return x->meta().dtype == dt ? x : call("aten::_to_copy", {x, dt}); };

  Value *q = tensor(0), *k = tensor(1), *v = tensor(2), *lse = tensor(4);
  Value *tq = tensor(5), *tk = tensor(6), *tv = tensor(7), *m = tensor(8), *tm = tensor(9);
  bool causal = n.arg(10).value.toBool();
  double scale = n.arg(11).value.toDouble();
  const auto& qs = q->meta().sizes;
  int64_t B = qs[0], H = qs[1], Sq = qs[2];
  int64_t Sk = k->meta().sizes[2], Dv = v->meta().sizes[3];
  c10::ScalarType dt = q->meta().dtype;
  c10::ScalarType acc = c10::isReducedFloatingType(dt) ? c10::kFloat : dt;

  // Primal: the probabilities P, from the definition and the logsumexp.
  Value* kr = repeat_heads(k, H);
  Value* vr = repeat_heads(v, H);
  Value* q3 = as3d(q);
  Value* kt3 = as3d(call("aten::transpose.int", {kr, -2, -1}));
  Value* v3 = as3d(vr);
  // Scores in the accumulation type, as the kernels compute them (bf16 scores would put their
  // rounding error into P).
  Value* s = call("aten::bmm", {cast(q3, acc), cast(kt3, acc)});
  s = as4d(call("aten::mul.Scalar", {s, scale}), {B, H, Sq, Sk});
  if (m) {
    if (m->meta().dtype == c10::kBool)
      m = call("aten::where.Scalar", {m, 0.0, -std::numeric_limits<double>::infinity()});
    s = call("aten::add.Tensor", {s, cast(m, acc)});
  }
  if (causal) {
    Value* full = call("aten::full", {std::vector<int64_t>{Sq, Sk}, -std::numeric_limits<double>::infinity(), acc,
                                      std::nullopt, q->meta().device});
    s = call("aten::add.Tensor", {s, call("aten::triu", {full, 1})});
  }
  Value* l4 = call("aten::view", {cast(lse, acc), std::vector<int64_t>{B, H, Sq, 1}});
  Value* p = cast(call("aten::exp", {call("aten::sub.Tensor", {s, l4})}), dt);

  // Tangent. The scale goes on the primal operands, which fold precomputes.
  Value* ds = nullptr;
  if (tq) ds = call("aten::bmm", {as3d(tq), call("aten::mul.Scalar", {kt3, scale})});
  if (tk) {
    Value* tkt = as3d(call("aten::transpose.int", {repeat_heads(tk, H), -2, -1}));
    ds = add(ds, call("aten::bmm", {call("aten::mul.Scalar", {q3, scale}), tkt}));
  }
  Value* dout = nullptr;
  if (ds) ds = as4d(ds, {B, H, Sq, Sk});
  if (tm) {
    Value* tm4 = call("aten::expand", {cast(tm, dt), std::vector<int64_t>{B, H, Sq, Sk}});
    ds = ds ? call("aten::add.Tensor", {ds, tm4}) : call("aten::clone", {tm4, c10::MemoryFormat::Contiguous});
  }
  if (ds) {
    Value* dp = call("aten::_softmax_backward_data", {ds, p, -1, dt});
    dout = call("aten::bmm", {as3d(dp), v3});
  }
  if (tv) dout = add(dout, call("aten::bmm", {as3d(p), as3d(repeat_heads(tv, H))}));
  return as4d(dout, {B, H, Sq, Dv});
}

int64_t mul(std::initializer_list<int64_t> xs) {
  int64_t r = 1;
  for (int64_t x : xs)
    if (__builtin_mul_overflow(r, x, &r)) return std::numeric_limits<int64_t>::max() / 4;
  return r;
}

// What each form of one attention takes.
AttentionChoice assess(const Node& n) {
  AttentionChoice c;
  AttentionTangentShape a = attention_tangent_shape(n);
  int64_t e = a.dtype_bytes, G = a.H / a.Hkv;
  int64_t scores = mul({a.B, a.H, a.Lq, a.Lk});
  int64_t out = mul({a.B, a.H, a.Lq, a.Dv, e});
  int64_t q = mul({a.B, a.H, a.Lq, a.D, e}), k = mul({a.B, a.Hkv, a.Lk, a.D, e}), v = mul({a.B, a.Hkv, a.Lk, a.Dv, e});
  int64_t mask = n.arg(8).kind == ArgKind::Tensor ? n.tensor_arg(8)->meta().nbytes() : 0;
  c.o_l.residual_bytes = out + mul({a.B, a.H, a.Lq, 4}) + mask + q + k + v;
  c.o_l.peak_bytes = out + attention_tangent_workspace_bytes(a);
  c.o_l.matmul_flops = attention_tangent_matmul_flops(a);
  c.p.residual_bytes = mul({scores, e}) + q + k * G + v * G;
  int64_t per_call = (a.dq || a.dk || a.dmask ? 2 : 0) + (a.dq && a.dk ? 1 : 0);
  c.p.peak_bytes = mul({scores, e, per_call}) + out;
  bool ds = a.dq || a.dk || a.dmask;
  c.p.matmul_flops = mul({2, scores, a.D * (a.dq + a.dk) + a.Dv * (int64_t(ds) + a.dv)});
  c.node = describe(&n);
  return c;
}

}  // namespace

int64_t AttentionChoice::Form::bytes() const { return residual_bytes + peak_bytes; }

std::vector<AttentionChoice> attention_form(Graph& g, std::optional<int64_t> residual_budget,
                                            const std::vector<MatchedAttention>& matched) {
  std::vector<Node*> nodes;
  for (Node* n : g.nodes())
    if (n->op() == runtime::kAttentionTangentOp) nodes.push_back(n);
  std::vector<AttentionChoice> choices;
  for (Node* n : nodes) choices.push_back(assess(*n));
  if (choices.empty()) return choices;
  int64_t budget = residual_budget ? *residual_budget : default_memory_limit(nodes[0]->input(0)->meta().device);
  if (budget < 0) throw Error("the residual budget must not be negative");
  int64_t total = 0, smallest = 0;
  for (const AttentionChoice& c : choices) {
    total += c.p.bytes();
    smallest += std::min(c.p.bytes(), c.o_l.bytes());
  }
  for (AttentionChoice& c : choices) {
    c.o_l_form = budget == 0;
    c.reason = budget == 0                ? "budget 0: the O(L) form everywhere"
               : budget == kNoMemoryLimit ? "budget inf: the P form everywhere"
                                          : "the P form fits the budget";
  }
  if (budget != 0 && budget != kNoMemoryLimit && total > budget) {
    if (smallest > budget)
      throw Error("residual budget " + describe_bytes(budget) + " is too small: the attentions need at least " +
                  describe_bytes(smallest) + " (the O(L) form wherever it takes fewer bytes)");
    // Most bytes freed per extra FLOP first.
    std::vector<size_t> order;
    for (size_t i = 0; i < choices.size(); ++i)
      if (choices[i].o_l.bytes() < choices[i].p.bytes()) order.push_back(i);
    auto rate = [&](size_t i) {
      const AttentionChoice& c = choices[i];
      double extra = std::max<double>(1.0, double(c.o_l.matmul_flops) - double(c.p.matmul_flops));
      return (double(c.p.bytes()) - double(c.o_l.bytes())) / extra;
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return rate(x) > rate(y); });
    for (size_t i : order) {
      if (total <= budget) break;
      AttentionChoice& c = choices[i];
      c.o_l_form = true;
      total -= c.p.bytes() - c.o_l.bytes();
      c.reason = "the P form's " + describe_bytes(c.p.bytes()) + " passed the budget " + describe_bytes(budget) +
                 "; the O(L) form takes " + describe_bytes(c.o_l.bytes());
    }
    for (AttentionChoice& c : choices)
      if (!c.o_l_form) c.reason = "the P form fits the budget once the others take the O(L) form";
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node* n = nodes[i];
    if (choices[i].o_l_form) continue;
    // A recognized attention (attention_match): the P form its rules emit, as before the match.
    auto m = std::find_if(matched.begin(), matched.end(), [&](const MatchedAttention& x) { return x.node == n; });
    if (m != matched.end()) {
      Value* p = nullptr;
      {
        InsertionGuard at(g, n);
        p = matched_p_form(g, *m);
      }
      m->o_l->replace_all_uses_with(p);
      erase_if_dead(g, m->o_l->producer());
      continue;
    }
    Builder b(g);
    Value* dout = nullptr;
    {
      InsertionGuard at(g, n);
      dout = p_form(b, *n);
    }
    replace_output(g, n, dout);
  }
  return choices;
}

}  // namespace jvpc
