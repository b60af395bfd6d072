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
// The budget counts the whole tangent graph the pipeline would make, as the cost model predicts
// it (count_tangent_graph): on a copy of the graph, the attentions chosen to hold P are expanded;
// every primal-only value that a tangent-dependent node reads is a residual (what fold binds),
// counted by the storage it keeps alive, each storage once (not the caller's inputs: the graph
// aliases them); the forward is dropped, and graph_cost adds the captured constants, the peak of
// a call's intermediates (liveness) and the largest workspace inside one kernel (the O(L)
// operator's blocks). The sum is what the budget is compared with; the later simplifications
// only take bytes away. A recognized attention (attention_match) is counted with the operator's
// P form; the one it gets, when it keeps P, is the rules' (matched_p_form), which holds the same
// P and is minimised by the same simplifications.
//
// Per attention, the bytes each form takes on its own (AttentionChoice) order the moves: its
// residuals (O(L): out, lse, mask, q, k, v; P: P and the scaled and repeated q, k, v it
// multiplies) plus its peak per call (O(L): the output and the operator's block workspace; P: dS,
// dP and the product of the k tangent, each B·H·Lq·Lk, and the output).
//
// The rule: every attention starts in the P form (fewest FLOPs). While the whole graph's count
// passes the budget, the attention that frees the most bytes per extra FLOP moves to the O(L)
// form, and the graph is counted again; an attention whose O(L) form frees nothing stays. A
// budget that even the graph with every attention in its smaller form passes is an error naming
// that count, the smallest budget that would do. Budget 0 puts every attention in the O(L) form,
// kNoMemoryLimit ("inf") every one in the P form. A budget that a cheap bound on the all-P count
// already meets (all_p_bound: every value the graph could hold; the default budget, a device's
// memory, against a model's graph) keeps P everywhere without counting. The graph changes only
// where an attention keeps P: the O(L) form is what the rules emitted.
#include "passes/passes.h"
#include "ir/checked_math.h"
#include "ir/op.h"

#include "ir/cost/cost_model.h"
#include "ir/builder.h"
#include "ir/io/limits.h"
#include "ir/liveness.h"
#include "ir/verifier.h"
#include "passes/rewrite.h"
#include "runtime/attention_tangent.h"

#include <ATen/TensorUtils.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

namespace {

// The P form of one jvpc::attention_tangent node, built before it; returns d(out).
Value* p_form(Builder& b, const Node& n) {
  auto call = [&](const std::string& op, std::vector<BArg> args) { return b.call(op, std::move(args)); };
  auto add = [&](Value* x, Value* y) { return x ? call(ops::add_Tensor, {x, y}) : y; };
  auto tensor = [&](size_t arg) { return n.arg(arg).kind == ArgKind::Tensor ? n.tensor_arg(arg) : nullptr; };
  // [b, h, s, d] -> [b·h, s, d], copying only if the value cannot be viewed that way.
  auto as3d = [&](Value* x) {
    const auto& s = x->meta().sizes;
    std::vector<int64_t> shape = {s[0] * s[1], s[2], s[3]};
    return reshape(b, x, shape);
  };
  auto as4d = [&](Value* x, std::vector<int64_t> shape) { return call(ops::view, {x, shape}); };
  // Repeats the heads of k or v ([b, h_k, s, d]) to `heads`, as grouped-query attention does.
  auto repeat_heads = [&](Value* x, int64_t heads) {
    auto s = x->meta().sizes;
    if (s[1] == heads) return x;
    int64_t r = heads / s[1];
    Value* e = call(ops::expand, {call(ops::unsqueeze, {x, 2}), std::vector<int64_t>{s[0], s[1], r, s[2], s[3]}});
    e = call(ops::clone, {e, c10::MemoryFormat::Contiguous});
    return call(ops::view, {e, std::vector<int64_t>{s[0], heads, s[2], s[3]}});
  };
  auto cast = [&](Value* x, c10::ScalarType dt) { return x->meta().dtype == dt ? x : call(ops::_to_copy, {x, dt}); };

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
  Value* kt3 = as3d(call(ops::transpose_int, {kr, -2, -1}));
  Value* v3 = as3d(vr);
  // The scale goes on the primal operands the tangent multiplies, which fold precomputes.
  // Scores in the accumulation type, as the kernels compute them (bf16 scores would put their
  // rounding error into P): from a scaled operand where the tangent has one in that type, which
  // saves scaling the B·H·Lq·Lk scores. A scaled operand the scores do not read comes after P,
  // so that it is not held while P's temporaries are (fold evaluates in this order).
  Value* kt3_scaled = tq && dt == acc ? call(ops::mul_Scalar, {kt3, scale}) : nullptr;
  Value* q3_scaled = nullptr;
  Value* s = nullptr;
  if (kt3_scaled) {
    s = call(ops::bmm, {q3, kt3_scaled});
  } else if (dt == acc && tk) {
    q3_scaled = call(ops::mul_Scalar, {q3, scale});
    s = call(ops::bmm, {q3_scaled, kt3});
  } else {
    s = call(ops::mul_Scalar, {call(ops::bmm, {cast(q3, acc), cast(kt3, acc)}), scale});
  }
  s = as4d(s, {B, H, Sq, Sk});
  if (m) {
    if (m->meta().dtype == c10::kBool) m = call(ops::where_Scalar, {m, 0.0, -std::numeric_limits<double>::infinity()});
    s = call(ops::add_Tensor, {s, cast(m, acc)});
  }
  if (causal) {
    Value* full = call(ops::full, {std::vector<int64_t>{Sq, Sk}, -std::numeric_limits<double>::infinity(), acc,
                                   std::nullopt, q->meta().device});
    s = call(ops::add_Tensor, {s, call(ops::triu, {full, 1})});
  }
  Value* l4 = call(ops::view, {cast(lse, acc), std::vector<int64_t>{B, H, Sq, 1}});
  Value* p = cast(call(ops::exp, {call(ops::sub_Tensor, {s, l4})}), dt);

  // Tangent.
  if (tq && !kt3_scaled) kt3_scaled = call(ops::mul_Scalar, {kt3, scale});
  if (tk && !q3_scaled) q3_scaled = call(ops::mul_Scalar, {q3, scale});
  Value* ds = nullptr;
  if (tq) ds = call(ops::bmm, {as3d(tq), kt3_scaled});
  if (tk) {
    Value* tkt = as3d(call(ops::transpose_int, {repeat_heads(tk, H), -2, -1}));
    ds = add(ds, call(ops::bmm, {q3_scaled, tkt}));
  }
  Value* dout = nullptr;
  if (ds) ds = as4d(ds, {B, H, Sq, Sk});
  if (tm) {
    Value* tm4 = call(ops::expand, {cast(tm, dt), std::vector<int64_t>{B, H, Sq, Sk}});
    ds = ds ? call(ops::add_Tensor, {ds, tm4}) : call(ops::clone, {tm4, c10::MemoryFormat::Contiguous});
  }
  if (ds) {
    Value* dp = call(ops::_softmax_backward_data, {ds, p, -1, dt});
    dout = call(ops::bmm, {as3d(dp), v3});
  }
  if (tv) dout = add(dout, call(ops::bmm, {as3d(p), as3d(repeat_heads(tv, H))}));
  return as4d(dout, {B, H, Sq, Dv});
}

int64_t mul(std::initializer_list<int64_t> xs) {
  return checked::product(xs).value_or(std::numeric_limits<int64_t>::max() / 4);
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
  c.score_elements = scores;
  return c;
}

// Expands the P form of attention node `n` in place.
void expand_p_form(Graph& g, Node* n) {
  Builder b(g);
  Value* dout = nullptr;
  {
    InsertionGuard at(g, n);
    dout = p_form(b, *n);
  }
  replace_output(g, n, dout);
}

std::vector<Node*> attention_nodes(const Graph& g) {
  std::vector<Node*> nodes;
  for (Node* n : g.nodes())
    if (n->is(ops::jvpc_attention_tangent)) nodes.push_back(n);
  return nodes;
}

// The budget's count of the tangent graph that `g` (before fold) becomes with attention i in the
// O(L) form where o_l[i]: residual bytes, and a call's peak (intermediates and the largest
// workspace). See the banner.
struct Count {
  int64_t residual = 0, peak = 0;
  int64_t total() const { return residual > kNoMemoryLimit - peak ? kNoMemoryLimit : residual + peak; }
};
Count count_tangent_graph(const Graph& g, const std::vector<bool>& o_l) {
  std::unique_ptr<Graph> c = g.clone();
  std::vector<Node*> nodes = attention_nodes(*c);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (!o_l[i]) expand_p_form(*c, nodes[i]);
  const ValueSet varying = tangent_dependent(*c);
  // The residuals as fold takes them; an input stays what it is (a constant is counted as one).
  std::vector<Value*> residuals = residual_values(*c, varying, 0, [](const Input&) { return false; });
  // As fold binds them: a residual keeps its whole storage alive (views of one storage count it
  // once), and one in the caller's input is an alias, not counted. Each becomes an input the
  // cost model does not count (the bytes are summed here), which cuts the forward off.
  Liveness live = analyze_liveness(*c);
  std::unordered_set<const Value*> storages;
  int64_t held = 0;
  for (size_t i = 0; i < residuals.size(); ++i) {
    Value* v = residuals[i];
    const Value* s = live.covers(v) ? live.storage_root(v) : v;
    bool alias = c->is_input(s) && c->input_of(s).role == Role::Primal;
    if (!alias && storages.insert(s).second)
      held = held > kNoMemoryLimit - s->meta().nbytes() ? kNoMemoryLimit : held + s->meta().nbytes();
    v->replace_all_uses_with(c->add_input("budget_r" + std::to_string(i), v->meta(), Role::Primal));
  }
  dce(*c);
  GraphCost cost = graph_cost(*c);
  Count r;
  r.residual = held > kNoMemoryLimit - cost.residual_bytes ? kNoMemoryLimit : held + cost.residual_bytes;
  r.peak =
      cost.peak_bytes > kNoMemoryLimit - cost.workspace_bytes ? kNoMemoryLimit : cost.peak_bytes + cost.workspace_bytes;
  return r;
}

// A bound on count_tangent_graph(g, every attention in the P form) that needs no copy of the
// graph: every value of g held at once (a constant by its whole storage), each attention's P form
// taking 32 score-sized and 32 operand-sized values of 8 bytes an element (p_form builds fewer than
// 20 of each), and every attention's O(L) workspace. Where it is within the budget, so is the
// count, and nothing needs counting.
int64_t all_p_bound(const Graph& g, const std::vector<Node*>& attentions) {
  int64_t total = 0;
  auto add = [&](int64_t b) { total = total > kNoMemoryLimit - b ? kNoMemoryLimit : total + b; };
  for (const Input& in : g.inputs())
    add(in.data.defined() && in.data.has_storage()
            ? std::max<int64_t>(in.data.storage().nbytes(), in.value->meta().nbytes())
            : in.value->meta().nbytes());
  for (const Node* n : g.nodes())
    for (const Value* v : n->outputs()) add(v->meta().nbytes());
  for (const Node* n : attentions) {
    AttentionTangentShape a = attention_tangent_shape(*n);
    int64_t operands = mul({a.B, a.H, std::max(a.Lq, a.Lk), std::max(a.D, a.Dv)});
    add(mul({32, 8, mul({a.B, a.H, a.Lq, a.Lk})}));
    add(mul({32, 8, operands}));
    add(attention_tangent_workspace_bytes(a));
  }
  return total;
}

std::string describe_count(const Count& c) {
  return describe_bytes(c.total()) + " (residuals " + describe_bytes(c.residual) + ", a call's peak " +
         describe_bytes(c.peak) + ")";
}

}  // namespace

int64_t AttentionChoice::Form::bytes() const { return residual_bytes + peak_bytes; }

std::vector<AttentionChoice> attention_form(Graph& g, std::optional<int64_t> residual_budget,
                                            const std::vector<MatchedAttention>& matched) {
  std::vector<Node*> nodes = attention_nodes(g);
  std::vector<AttentionChoice> choices;
  for (Node* n : nodes) choices.push_back(assess(*n));
  if (choices.empty()) return choices;
  int64_t budget = residual_budget ? *residual_budget : default_memory_limit(nodes[0]->input(0)->meta().device);
  if (budget < 0) throw Error("the residual budget must not be negative");
  std::vector<bool> o_l(choices.size(), budget == 0);
  const int64_t bound = budget != 0 && budget != kNoMemoryLimit ? all_p_bound(g, nodes) : kNoMemoryLimit;
  const bool roomy = bound < kNoMemoryLimit && bound <= budget;
  Count count;
  if (roomy)
    count.residual = bound;
  else
    count = count_tangent_graph(g, o_l);
  for (AttentionChoice& c : choices)
    c.reason = budget == 0                ? "budget 0: the O(L) form everywhere"
               : budget == kNoMemoryLimit ? "budget inf: the P form everywhere"
               : roomy ? "the tangent graph with the P form takes at most " + describe_bytes(count.total()) +
                             ", every value it could hold, within the budget " + describe_bytes(budget)
                       : "the tangent graph with the P form takes " + describe_count(count) + ", within the budget " +
                             describe_bytes(budget);
  if (budget != 0 && budget != kNoMemoryLimit && count.total() > budget) {
    std::vector<bool> smaller(choices.size());
    for (size_t i = 0; i < choices.size(); ++i) smaller[i] = choices[i].o_l.bytes() < choices[i].p.bytes();
    Count smallest = count_tangent_graph(g, smaller);
    if (smallest.total() > budget)
      throw Error("residual budget " + describe_bytes(budget) + " is too small: the tangent graph needs at least " +
                  describe_count(smallest) + " with the O(L) form wherever it takes fewer bytes");
    // Most bytes freed per extra FLOP first.
    std::vector<size_t> order;
    for (size_t i = 0; i < choices.size(); ++i)
      if (smaller[i]) order.push_back(i);
    auto rate = [&](size_t i) {
      const AttentionChoice& c = choices[i];
      double extra = std::max<double>(1.0, double(c.o_l.matmul_flops) - double(c.p.matmul_flops));
      return (double(c.p.bytes()) - double(c.o_l.bytes())) / extra;
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return rate(x) > rate(y); });
    for (size_t i : order) {
      o_l[i] = true;
      Count before = count;
      count = count_tangent_graph(g, o_l);
      choices[i].reason = "the tangent graph took " + describe_count(before) + ", over the budget " +
                          describe_bytes(budget) + "; this attention's O(L) form frees the most bytes per extra FLOP";
      if (count.total() <= budget) break;
    }
    for (size_t i = 0; i < choices.size(); ++i)
      if (!o_l[i])
        choices[i].reason = "the P form fits: with the O(L) form where chosen, the tangent graph takes " +
                            describe_count(count) + ", within the budget " + describe_bytes(budget);
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    choices[i].o_l_form = o_l[i];
    choices[i].counted_bytes = count.total();
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (o_l[i]) continue;
    Node* n = nodes[i];
    // A recognized attention (attention_match): the P form its rules emit, as before the match.
    auto m = std::find_if(matched.begin(), matched.end(), [&](const MatchedAttention& x) { return x.node == n; });
    if (m == matched.end()) {
      expand_p_form(g, n);
      continue;
    }
    Value* p = nullptr;
    {
      InsertionGuard at(g, n);
      p = matched_p_form(g, *m);
    }
    m->o_l->replace_all_uses_with(p);
    erase_if_dead(g, m->o_l->producer());
  }
  return choices;
}

}  // namespace jvpc
