// Arithmetic simplification.
//
//   %4 = aten::mul.Scalar(%3, 1.)          -> readers of %4 read %3
//   %5 = aten::mul.Scalar(%2, 0.125)
//   %6 = aten::mul.Scalar(%5, 2.)          -> %6 = aten::mul.Scalar(%2, 0.25)
//
// Multiplication or division by one, addition or subtraction of zero where exact (x + (-0.0)
// and x - 0.0 are x; x + 0.0 is not where x is -0.0, whose reciprocal changes sign; integers:
// every zero), double negation, and chains of scalar multiplications merged (scales that cancel
// leave none). Only where the result has the operand's shape and dtype (mul.Scalar(int, 1.)
// promotes: kept). Merging scales is a reassociation: in float16 it can keep finite an
// intermediate that the unmerged product overflows.
#include "passes/passes.h"
#include "ir/op.h"

#include <cmath>

namespace jvpc {

namespace {

Value* identity_of(const Node* n) {
  const Op op = n->handle();
  if (n->outputs().size() != 1 || n->inputs().empty()) return nullptr;
  Value *x = n->input(0), *out = n->output();
  if (!x->meta().same_signature(out->meta())) return nullptr;
  if ((op == ops::mul_Scalar || op == ops::div_Scalar) && n->arg(1).is_number(1.0)) return x;
  // x + 0 and x - 0 are x, except that -0.0 + 0.0 is +0.0 (1/x then changes sign): in floating
  // point only x + (-0.0) and x - (+0.0) are exact.
  if ((op == ops::add_Scalar || op == ops::sub_Scalar) && n->arg(1).is_number(0.0) && n->arg(2).is_number(1.0)) {
    bool negative_zero = n->arg(1).kind == ArgKind::Float && std::signbit(n->arg(1).value.toDouble());
    if (!c10::isFloatingType(x->meta().dtype) || negative_zero == (op == ops::add_Scalar)) return x;
  }
  if (op == ops::neg && x->producer() && x->producer()->is(ops::neg)) return x->producer()->input(0);
  return nullptr;
}

}  // namespace

bool simplify_arith(Graph& g) {
  return rewrite_nodes(g, [&](Node* n, Builder&) {
    if (Value* x = identity_of(n)) {
      replace_output(g, n, x);
      return true;
    }
    // mul.Scalar(mul.Scalar(x, a), b) -> mul.Scalar(x, a·b)
    if (!n->is(ops::mul_Scalar)) return false;
    Node* p = n->input(0)->producer();
    if (!p || !p->is(ops::mul_Scalar) || !p->input(0)->meta().same_signature(n->output()->meta()) ||
        !c10::isFloatingType(n->output()->meta().dtype) || !n->arg(1).number() || !p->arg(1).number())
      return false;
    n->set_constant_arg(1, Arg::of_float(*n->arg(1).number() * *p->arg(1).number()));
    n->replace_input(0, p->input(0));
    erase_if_dead(g, p);
    if (Value* x = identity_of(n)) replace_output(g, n, x);  // the factors cancelled
    return true;
  });
}

}  // namespace jvpc
