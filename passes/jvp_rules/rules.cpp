// The rule table and the rule makers shared by the family files.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

#include <ATen/ExpandUtils.h>
#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <unordered_map>

namespace jvpc::jvp_rules {

Value* Ctx::t(size_t arg) const {
  const Arg& a = n.arg(arg);
  if (a.kind != ArgKind::Tensor) return nullptr;
  return tangents_.at(static_cast<size_t>(a.operands.at(0)));
}

Value* Ctx::add(Value* a, Value* b_) {
  if (!a) return b_;
  if (!b_) return a;
  return call(ops::add_Tensor, {a, b_});
}

Value* Ctx::scale(Value* a, double s) {
  if (!a || s == 1.0) return a;
  return call(ops::mul_Scalar, {a, s});
}

Value* Ctx::mul(Value* t_, Value* factor) {
  if (!t_) return nullptr;
  return call(ops::mul_Tensor, {t_, factor});
}

Value* Ctx::sub(Value* a, Value* b_) {
  if (!b_) return a;
  if (!a) return scale(b_, -1.0);
  return call(ops::sub_Tensor, {a, b_});
}

Value* Ctx::where(Value* cond, Value* a, Value* b_) {
  if (!a && !b_) return nullptr;
  if (a && b_) return call(ops::where_self, {cond, a, b_});
  if (a) return call(ops::where_ScalarOther, {cond, a, 0.0});
  return call(ops::where_ScalarSelf, {cond, 0.0, b_});
}

Value* Ctx::matmul(Value* a, Value* b_) { return a && b_ ? jvp_rules::matmul(*this, a, b_) : nullptr; }

Value* Ctx::per_arg(const std::vector<Term>& terms) {
  Value* sum = nullptr;
  for (size_t i = 0; i < terms.size(); ++i)
    if (Value* ti = terms[i] ? t(i) : nullptr) sum = add(sum, terms[i](*this, ti));
  return sum;
}

Value* Ctx::zeros_like(const Value* v) {
  const TensorMeta& m = v->meta();
  return call(ops::zeros, {m.sizes, m.dtype, std::nullopt, m.device});
}

std::vector<Value*> Ctx::reapply(const std::vector<std::pair<size_t, Value*>>& replaced) {
  std::vector<BArg> args;
  for (size_t i = 0; i < n.args().size(); ++i) args.push_back(BArg::of_arg(n.arg(i), &n));
  for (const auto& [i, v] : replaced) args.at(i) = BArg(v);
  return b.emit(n.op(), std::move(args), &n);  // each v is shaped like the operand it replaces
}

namespace {

bool complex_valued(const std::vector<Value*>& vs) {
  return std::any_of(vs.begin(), vs.end(), [](const Value* v) { return c10::isComplexType(v->meta().dtype); });
}

// Makes a rule's tangent match its primal output: broadcast to the output's shape, cast to its
// dtype (never from complex to real, which would drop the imaginary part: a rule's error).
Value* conform(Builder& b, Value* t, const Value* out) {
  if (c10::isComplexType(t->meta().dtype) && !c10::isComplexType(out->meta().dtype))
    throw Error("a complex tangent for the real output %" + std::to_string(out->id()));
  if (t->meta().sizes != out->meta().sizes) t = b.call(ops::expand, {t, out->meta().sizes});
  if (t->meta().dtype != out->meta().dtype) t = b.call(ops::_to_copy, {t, out->meta().dtype});
  return t;
}

}  // namespace

std::vector<Value*> differentiate(Builder& b, const Node& n, std::vector<Value*> operand_tangents) {
  bool float_out = false;
  for (const Value* o : n.outputs()) float_out |= differentiable_dtype(o->meta().dtype);
  if (!float_out) return {};
  const Rule* rule = registry().find(n.op());
  if (!rule) throw Error("no JVP rule for " + n.op());
  if ((complex_valued(n.inputs()) || complex_valued(n.outputs())) && !registry().holds_for_complex(n.op()))
    throw Error("no JVP rule for " + n.op() + " of complex tensors (its rule is for real ones)");
  Ctx ctx(b, n, std::move(operand_tangents));
  std::vector<Value*> outs;
  try {
    outs = (*rule)(ctx);
    if (outs.size() > n.outputs().size()) throw Error("it returned too many tangents");
    for (size_t i = 0; i < outs.size(); ++i)
      outs[i] = outs[i] && differentiable_dtype(n.output(i)->meta().dtype) ? conform(b, outs[i], n.output(i)) : nullptr;
  } catch (const std::exception& e) {
    throw Error("JVP rule of " + n.op() + ": " + one_line(e));
  }
  return outs;
}

void differentiate_in_order(Builder& b, const std::vector<Node*>& nodes,
                            std::unordered_map<const Value*, Value*>& tangent) {
  Graph& g = b.graph();
  for (Node* n : nodes) {
    std::vector<Value*> in_t;
    bool any = false;
    for (Value* v : n->inputs()) {
      auto it = tangent.find(v);
      in_t.push_back(it == tangent.end() ? nullptr : it->second);
      any |= in_t.back() != nullptr;
    }
    if (!any) continue;
    InsertionGuard at(g, g.next(n));  // restored however the rule ends
    std::vector<Value*> outs = differentiate(b, *n, std::move(in_t));
    for (size_t i = 0; i < outs.size(); ++i)
      if (outs[i]) tangent[n->output(i)] = outs[i];
  }
}

Rule composite(std::function<std::vector<Value*>(Ctx&)> build) {
  return [build](Ctx& c) {
    Graph& g = c.b.graph();
    Node* end = g.insertion_point();  // just after the node: build's nodes go before it
    std::vector<Value*> outs = build(c);
    std::vector<Node*> emitted;
    for (Node* m = g.next(const_cast<Node*>(&c.n)); m != end; m = g.next(m)) emitted.push_back(m);
    std::unordered_map<const Value*, Value*> tangent;
    for (size_t i = 0; i < c.n.inputs().size(); ++i)
      if (Value* t = c.operand_tangent(i)) tangent[c.n.inputs()[i]] = t;
    differentiate_in_order(c.b, emitted, tangent);
    std::vector<Value*> result;  // per output of the node: the schema returns it produced
    for (size_t r = 0; r < outs.size(); ++r) {
      if (r < c.n.return_counts().size() && c.n.return_counts()[r] == 0) continue;
      auto it = outs[r] ? tangent.find(outs[r]) : tangent.end();
      result.push_back(it == tangent.end() ? nullptr : it->second);
    }
    return result;
  };
}

void Registry::allow_complex(const std::string& op) { complex_.insert(op); }

std::vector<std::string> Registry::complex_ops() const {
  std::vector<std::string> out(complex_.begin(), complex_.end());
  std::sort(out.begin(), out.end());
  return out;
}

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    register_elementwise(reg);
    register_activations(reg);
    register_selection(reg);
    register_reductions(reg);
    register_linalg(reg);
    register_views(reg);
    register_normalization(reg);
    register_attention(reg);
    register_solvers(reg);
    register_complex(reg);
    register_recurrent(reg);
    register_random(reg);
    register_backward(reg);
    return reg;
  }();
  return r;
}

Rule linear_in(size_t arg) {
  return [arg](Ctx& c) -> std::vector<Value*> {
    Value* t = c.t(arg);
    if (!t) return {};
    return c.reapply(arg, t);
  };
}

Rule linear_in_list(size_t arg) {
  return [arg](Ctx& c) -> std::vector<Value*> {
    const Arg& a = c.n.arg(arg);
    std::vector<Value*> ts;
    bool any = false;
    for (int o : a.operands) {
      Value* t = c.operand_tangent(static_cast<size_t>(o));
      any |= t != nullptr;
      ts.push_back(t ? t : c.zeros_like(c.n.input(static_cast<size_t>(o))));
    }
    if (!any) return {};
    std::vector<BArg> args;
    for (size_t i = 0; i < c.n.args().size(); ++i) args.push_back(i == arg ? BArg(ts) : BArg::of_arg(c.n.arg(i), &c.n));
    return c.b.emit(c.n.op(), std::move(args));
  };
}

Rule per_arg(std::vector<Term> terms) {
  return [terms = std::move(terms)](Ctx& c) -> std::vector<Value*> { return {c.per_arg(terms)}; };
}

Rule per_arg_outputs(std::vector<Terms> terms) {
  return [terms = std::move(terms)](Ctx& c) -> std::vector<Value*> {
    std::vector<Value*> sum;
    for (size_t i = 0; i < terms.size(); ++i) {
      Value* ti = terms[i] ? c.t(i) : nullptr;
      if (!ti) continue;
      std::vector<Value*> parts = terms[i](c, ti);
      sum.resize(std::max(sum.size(), parts.size()), nullptr);
      for (size_t k = 0; k < parts.size(); ++k) sum[k] = c.add(sum[k], parts[k]);
    }
    return sum;
  };
}

Rule bilinear() {
  return [](Ctx& c) -> std::vector<Value*> {
    Value* left = c.linear_in(0);
    return {c.add(left, c.linear_in(1))};
  };
}

Rule unary(std::function<Value*(Ctx&)> derivative) {
  return per_arg({[derivative](Ctx& c, Value* t) { return c.mul(t, derivative(c)); }});
}

std::vector<int64_t> reduced_dims(const Value* x, const c10::IValue& dims) {
  int64_t rank = static_cast<int64_t>(x->meta().sizes.size());
  std::vector<int64_t> out;
  if (dims.isInt()) {
    out.push_back(c10::maybe_wrap_dim(dims.toInt(), rank));
  } else if (dims.isIntList() && !dims.toIntVector().empty()) {
    for (int64_t d : dims.toIntVector()) out.push_back(c10::maybe_wrap_dim(d, rank));
  } else {
    for (int64_t d = 0; d < rank; ++d) out.push_back(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Value* keep_dims(Ctx& c, Value* r, const Value* x, const std::vector<int64_t>& dims) {
  if (r->meta().sizes.size() == x->meta().sizes.size()) return r;
  for (int64_t d : dims) r = c.unsqueeze(r, d);
  return r;
}

Value* matmul(Ctx& c, Value* a, Value* b) {
  const auto &sa = a->meta().sizes, &sb = b->meta().sizes;
  if (sa.size() == 2 && sb.size() == 2) return c.call(ops::mm, {a, b});
  std::vector<int64_t> batch =
      at::infer_size(c10::IntArrayRef(sa).slice(0, sa.size() - 2), c10::IntArrayRef(sb).slice(0, sb.size() - 2));
  int64_t n = c10::multiply_integers(batch);
  auto flat = [&](Value* v, int64_t rows, int64_t cols) {
    std::vector<int64_t> full = batch;
    full.insert(full.end(), {rows, cols});
    return reshape(c.b, c.call(ops::expand, {v, full}), {n, rows, cols});
  };
  int64_t p = sa.end()[-2], k = sa.back(), r = sb.back();
  std::vector<int64_t> out = batch;
  out.insert(out.end(), {p, r});
  return c.call(ops::view, {c.call(ops::bmm, {flat(a, p, k), flat(b, k, r)}), out});
}

Value* mT(Ctx& c, Value* v) { return c.call(ops::transpose_int, {v, -2, -1}); }

Value* narrow(Ctx& c, Value* v, int64_t dim, int64_t start, int64_t length) {
  return c.call(ops::narrow, {v, dim, start, length});
}

Value* per_channel(Ctx& c, Value* v, size_t rank) {
  std::vector<int64_t> sizes = {v->meta().numel()};
  sizes.resize(std::max<size_t>(rank, 2) - 1, 1);
  return reshape(c.b, v, sizes);
}

Value* tie_shares(Ctx& c, Value* hits, const std::vector<int64_t>& dims) {
  Value* h = c.cast(hits, c.out()->meta().dtype);
  return c.div(h, c.sum(h, dims, true));
}

double scalar(const c10::IValue& v, double if_none) {
  if (v.isNone()) return if_none;
  return v.isInt() ? static_cast<double>(v.toInt()) : v.isBool() ? v.toBool() : v.toDouble();
}

Rule zero() {
  return [](Ctx&) -> std::vector<Value*> { return {}; };
}

Rule masked(std::function<Value*(Ctx&)> mask) {
  return per_arg({[mask](Ctx& c, Value* t) { return c.where(mask(c), t, nullptr); }});
}

}  // namespace jvpc::jvp_rules
