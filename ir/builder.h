// Builds nodes from an op name and plain C++ arguments, the way rules and passes write IR:
//
//   Builder b(graph);                    // inserts at graph.insertion_point()
//   Value* y = b.call(ops::bmm, {x, w});
//   Value* z = b.call(ops::sum_dim_IntList, {y, std::vector<int64_t>{-1}, true});
//
// Trailing arguments left out take the schema's defaults. Output metadata is inferred
// (ops.h: infer_outputs), so a rule never states shapes by hand.
#pragma once

#include "ir/graph.h"
#include "ir/ops.h"

#include <optional>

namespace jvpc {

/// One argument as written in C++: a value, a list of values, or a constant.
class BArg {
 public:
  BArg(Value* v) : v_(v), kind_(K::Value) {}
  /// A tensor list; in an optional list (index.Tensor's indices) nullptr is an absent entry.
  BArg(std::vector<Value*> vs) : vs_(std::move(vs)), kind_(K::Values) {}
  BArg(int v) : c_(static_cast<int64_t>(v)) {}
  BArg(int64_t v) : c_(v) {}
  BArg(double v) : c_(v) {}
  BArg(bool v) : c_(v) {}
  BArg(const char* s) : c_(std::string(s)) {}
  BArg(std::string s) : c_(std::move(s)) {}
  BArg(std::vector<int64_t> v) : c_(std::move(v)) {}
  BArg(c10::List<bool> v) : c_(std::move(v)) {}  // bool[] (a backward kernel's output_mask)
  BArg(c10::ScalarType t) : c_(static_cast<int64_t>(t)) {}
  BArg(c10::Device d) : c_(d) {}
  BArg(c10::MemoryFormat m) : c_(static_cast<int64_t>(m)) {}
  BArg(std::nullopt_t) {}
  /// The argument exactly as a node already holds it (copied from another node).
  static BArg of_arg(const Arg& a, const Node* from);

 private:
  friend class Builder;
  enum class K { Value, Values, Const };
  Value* v_ = nullptr;
  std::vector<Value*> vs_;
  c10::IValue c_;
  K kind_ = K::Const;
};

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  /// Creates the node; returns all its outputs. Output metadata comes from the op's Meta kernel
  /// or shape rule; for an op whose output shape depends on data (index with a bool mask), from
  /// `shaped_like`, a node of the same op on operands of the same shapes, when one is given.
  std::vector<Value*> emit(const std::string& op, std::vector<BArg> args, const Node* shaped_like = nullptr);
  /// Creates the node; returns its single output.
  Value* call(const std::string& op, std::vector<BArg> args);
  Graph& graph() { return g_; }

 private:
  Graph& g_;
};

/// The strides of a tensor laid out as (`sizes`, `strides`) viewed as `new_sizes` (no -1), or
/// none where no view expresses it and a reshape would copy (as at::Tensor::view decides).
std::optional<std::vector<int64_t>> view_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                                                 const std::vector<int64_t>& new_sizes);
/// Whether v's layout can be viewed as `sizes` (-1 allowed) without a copy.
bool viewable(const Value* v, const std::vector<int64_t>& sizes);
/// v viewed as `sizes` (-1 allowed), copied to a contiguous layout first where it cannot be
/// viewed so; v itself where it already has them.
Value* reshape(Builder& b, Value* v, const std::vector<int64_t>& sizes);

}  // namespace jvpc
