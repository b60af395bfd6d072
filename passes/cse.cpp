// Common-subexpression elimination: a node equal to an earlier one (same op, same constant
// arguments, same operands, pure) has its readers moved to the earlier node's outputs, and the
// duplicate, now unread, is erased.
//
//   %5 = aten::transpose.int(%1, -2, -1)
//   %9 = aten::transpose.int(%1, -2, -1)   // readers of %9 now read %5
//
// Products and sums with alpha 1 of two tensors are equal with their operands in either order
// (x·dx and dx·x from a product rule are one product), as they are exactly in floating point;
// differences, and sums with another alpha, are not. Constant arguments are compared exactly
// (floats that differ in the last bit differ), and the outputs must have the same shapes and
// dtypes. Random nodes never merge: their values differ.
#include "passes/passes.h"

#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <sstream>

namespace jvpc {

namespace {

// a·b is b·a and a + b is b + a, exactly in floating point: for these the key takes the two
// operands in id order (x·dx and dx·x from a product rule are one product).
bool commutes(const Node& n) {
  if (n.args().size() < 2 || n.arg(0).kind != ArgKind::Tensor || n.arg(1).kind != ArgKind::Tensor) return false;
  if (!n.handle().has(kCommutative)) return false;
  return !n.is(ops::add_Tensor) || n.arg(2).is_number(1.0);  // add: alpha 1
}

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A key that identifies a node's computation: op and arguments (operands by value id), as bytes.
// Output metadata is compared apart.
std::string key_of(const Node& n) {
  std::string k;
  k.reserve(n.op().size() + 16 * n.args().size() + 16);
  k += n.op();
  k += '\0';
  const bool commutative = commutes(n);
  if (commutative) {
    int a = n.tensor_arg(0)->id(), b = n.tensor_arg(1)->id();
    put(k, std::min(a, b));
    put(k, std::max(a, b));
  }
  for (const Arg& a : n.args()) {
    if (commutative && a.is_tensor_kind()) continue;
    put(k, a.kind);
    if (a.is_tensor_kind()) {
      put(k, a.operands.size());
      for (int o : a.operands) put(k, o < 0 ? -1 : n.input(static_cast<size_t>(o))->id());
    } else if (a.kind == ArgKind::Float) {
      put(k, a.value.toDouble());
    } else if (a.kind == ArgKind::Floats) {
      const std::vector<double> v = a.value.toDoubleVector();
      put(k, v.size());
      for (double d : v) put(k, d);
    } else if (a.value.isInt()) {  // ints, and dtypes, layouts and formats held as ints
      put(k, a.value.toInt());
    } else if (a.value.isIntList()) {
      const auto v = a.value.toIntList();
      put(k, v.size());
      for (int64_t i : v) put(k, i);
    } else if (a.value.isBool()) {
      put(k, a.value.toBool());
    } else {
      std::ostringstream os;
      os << a.value;
      const std::string text = os.str();
      put(k, text.size());
      k += text;
    }
  }
  return k;
}

}  // namespace

bool cse(Graph& g) {
  ska::flat_hash_map<std::string, Node*> seen;
  seen.reserve(g.num_nodes());
  return rewrite_nodes(g, [&](Node* n, Builder&) {
    if (n->impure() || n->outputs().empty()) return false;
    auto [it, added] = seen.emplace(key_of(*n), n);
    if (added) return false;
    Node* first = it->second;
    bool same = first->outputs().size() == n->outputs().size();
    for (size_t i = 0; same && i < n->outputs().size(); ++i)
      same = n->output(i)->meta().same_signature(first->output(i)->meta());
    if (!same) return false;
    bool changed = false;
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      if (n->output(i)->has_uses()) {
        n->output(i)->replace_all_uses_with(first->output(i));
        changed = true;
      }
    }
    erase_if_dead(g, n);
    return changed;
  });
}

}  // namespace jvpc
