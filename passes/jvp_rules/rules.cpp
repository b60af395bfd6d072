// The rule table and the rule makers shared by the family files.
#include "passes/jvp_rules/rules.h"

#include <algorithm>

namespace jvpc::jvp_rules {

Value* Ctx::t(size_t arg) const {
  const Arg& a = n.arg(arg);
  if (a.kind != ArgKind::Tensor) return nullptr;
  return tangents_.at(static_cast<size_t>(a.operands.at(0)));
}

Value* Ctx::add(Value* a, Value* b_) {
  if (!a) return b_;
  if (!b_) return a;
  return call("aten::add.Tensor", {a, b_});
}

Value* Ctx::scale(Value* a, double s) {
  if (!a || s == 1.0) return a;
  return call("aten::mul.Scalar", {a, s});
}

Value* Ctx::mul(Value* t_, Value* factor) {
  if (!t_) return nullptr;
  return call("aten::mul.Tensor", {t_, factor});
}

std::vector<Value*> Ctx::reapply(size_t arg, Value* v) {
  std::vector<BArg> args;
  for (size_t i = 0; i < n.args().size(); ++i) args.push_back(i == arg ? BArg(v) : BArg::of_arg(n.arg(i), &n));
  return b.emit(n.op(), std::move(args), &n);  // v is shaped like the operand it replaces
}

void Registry::add(const std::string& op, Rule r) { rules_[op] = std::move(r); }

const Rule* Registry::find(const std::string& op) const {
  auto it = rules_.find(op);
  return it == rules_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : rules_) out.push_back(k);
  std::sort(out.begin(), out.end());
  return out;
}

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    register_elementwise(reg);
    register_reductions(reg);
    register_linalg(reg);
    register_views(reg);
    register_normalization(reg);
    register_attention(reg);
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
      ts.push_back(t ? t : c.call("aten::zeros_like", {c.n.input(static_cast<size_t>(o))}));
    }
    if (!any) return {};
    std::vector<BArg> args;
    for (size_t i = 0; i < c.n.args().size(); ++i) args.push_back(i == arg ? BArg(ts) : BArg::of_arg(c.n.arg(i), &c.n));
    return c.b.emit(c.n.op(), std::move(args));
  };
}

Rule bilinear() {
  return [](Ctx& c) -> std::vector<Value*> {
    Value* left = c.t(0) ? c.reapply(0, c.t(0)).at(0) : nullptr;
    Value* right = c.t(1) ? c.reapply(1, c.t(1)).at(0) : nullptr;
    return {c.add(left, right)};
  };
}

Rule unary(std::function<Value*(Ctx&)> derivative) {
  return [derivative](Ctx& c) -> std::vector<Value*> {
    Value* t = c.t(0);
    if (!t) return {};
    return {c.mul(t, derivative(c))};
  };
}

}  // namespace jvpc::jvp_rules
