// Whether two graphs are the same structurally: inputs (names, ids, roles, metadata with
// strides, flags, whether a constant has data), nodes (ops, arguments, operands by id, outputs,
// return counts, impure) and outputs (ids and names). Constants' values are not compared.
// The round trips of the text form (parse_text(to_text(g))) are checked with it.
#pragma once

#include "ir/graph.h"
#include "ir/printer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

namespace jvpc::test {

namespace same_structure_detail {

inline bool same_double(double a, double b) {  // bitwise: -0. and 0. differ, nan equals nan
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

inline std::string diff_arg(const Node& na, const Arg& a, const Node& nb, const Arg& b) {
  if (a.kind != b.kind) return std::string(arg_kind_name(a.kind)) + " vs " + arg_kind_name(b.kind);
  auto ids = [](const Node& n, const Arg& x) {
    std::vector<int> out;
    for (int o : x.operands) out.push_back(o < 0 ? -1 : n.input(static_cast<size_t>(o))->id());
    return out;
  };
  if (ids(na, a) != ids(nb, b)) return "other operands";
  bool same = true;
  switch (a.kind) {
    case ArgKind::None:
    case ArgKind::Tensor:
    case ArgKind::TensorList:
    case ArgKind::OptTensorList:
      break;
    case ArgKind::Bool:
      same = a.value.toBool() == b.value.toBool();
      break;
    case ArgKind::Int:
    case ArgKind::ScalarType:
    case ArgKind::Layout:
    case ArgKind::MemoryFormat:
      same = a.value.toInt() == b.value.toInt();
      break;
    case ArgKind::Float:
      same = same_double(a.value.toDouble(), b.value.toDouble());
      break;
    case ArgKind::Str:
      same = a.value.toStringRef() == b.value.toStringRef();
      break;
    case ArgKind::Ints:
      same = a.value.toIntVector() == b.value.toIntVector();
      break;
    case ArgKind::Floats: {
      auto x = a.value.toDoubleVector(), y = b.value.toDoubleVector();
      same = x.size() == y.size();
      for (size_t i = 0; same && i < x.size(); ++i) same = same_double(x[i], y[i]);
      break;
    }
    case ArgKind::Bools:
      same = a.value.toBoolList().vec() == b.value.toBoolList().vec();
      break;
    case ArgKind::Device:
      same = a.value.toDevice() == b.value.toDevice();
      break;
  }
  return same ? "" : "other values";
}

inline bool same_meta(const TensorMeta& a, const TensorMeta& b) {
  return a.sizes == b.sizes && a.strides == b.strides && a.dtype == b.dtype && a.device == b.device;
}

}  // namespace same_structure_detail

/// Success, or the first difference between `a` and `b`.
inline ::testing::AssertionResult same_structure(const Graph& a, const Graph& b) {
  using namespace same_structure_detail;
  auto fail = [&](const std::string& what) {
    return ::testing::AssertionFailure() << what << "\n--- first:\n" << to_text(a) << "--- second:\n" << to_text(b);
  };
  if (a.inputs().size() != b.inputs().size()) return fail("input counts differ");
  for (size_t i = 0; i < a.inputs().size(); ++i) {
    const Input &x = a.inputs()[i], &y = b.inputs()[i];
    std::string at = "input " + std::to_string(i) + " ('" + x.name + "')";
    if (x.name != y.name || x.value->id() != y.value->id() || x.role != y.role) return fail(at + ": name, id or role");
    if (!same_meta(x.value->meta(), y.value->meta())) return fail(at + ": metadata");
    if (x.role == Role::Primal && x.differentiable != y.differentiable) return fail(at + ": differentiable");
    if (x.aliases != y.aliases || x.tangent_of != y.tangent_of) return fail(at + ": aliases or tangent_of");
    if (x.data.defined() != y.data.defined()) return fail(at + ": stored");
  }
  auto na = a.nodes(), nb = b.nodes();
  if (na.size() != nb.size()) return fail("node counts differ");
  for (size_t i = 0; i < na.size(); ++i) {
    const Node &x = *na[i], &y = *nb[i];
    std::string at = "node " + std::to_string(i) + " (" + x.op() + ")";
    if (x.op() != y.op()) return fail(at + ": op");
    if (x.impure() != y.impure() || x.return_counts() != y.return_counts()) return fail(at + ": impure or returns");
    if (x.args().size() != y.args().size()) return fail(at + ": argument counts");
    for (size_t j = 0; j < x.args().size(); ++j) {
      std::string d = diff_arg(x, x.arg(j), y, y.arg(j));
      if (!d.empty()) return fail(at + ": argument " + std::to_string(j) + ": " + d);
    }
    if (x.inputs().size() != y.inputs().size()) return fail(at + ": operand counts");
    for (size_t j = 0; j < x.inputs().size(); ++j)
      if (x.input(j)->id() != y.input(j)->id()) return fail(at + ": operand " + std::to_string(j));
    if (x.outputs().size() != y.outputs().size()) return fail(at + ": output counts");
    for (size_t j = 0; j < x.outputs().size(); ++j)
      if (x.output(j)->id() != y.output(j)->id() || !same_meta(x.output(j)->meta(), y.output(j)->meta()))
        return fail(at + ": output " + std::to_string(j));
  }
  if (a.outputs().size() != b.outputs().size()) return fail("output counts differ");
  for (size_t i = 0; i < a.outputs().size(); ++i)
    if (a.outputs()[i]->id() != b.outputs()[i]->id() || a.output_names()[i] != b.output_names()[i])
      return fail("output " + std::to_string(i));
  return ::testing::AssertionSuccess();
}

}  // namespace jvpc::test
