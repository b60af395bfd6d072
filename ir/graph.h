// jvpc's IR: an SSA graph of ATen kernel calls.
//
// A Graph owns Nodes (in execution order) and Values. Every Value is a tensor with static
// metadata (sizes, strides, dtype, device); it is either a graph input or the output of
// exactly one Node. A Node names the ATen operator with its overload ("aten::mul.Tensor",
// "aten::bmm") and holds one Arg per schema argument, in schema order: tensor arguments
// refer to the node's inputs, everything else is a typed constant. That is enough to run
// the node through the dispatcher (runtime/), to cost it (ir/cost/) and to rewrite it
// (passes/).
//
//   graph(%0 : f32[1,5,128,64] q, %1 : f32[1,5,128,64] k):
//     %2 : f32[1,5,128,64] = aten::mul.Scalar(%0, 0.3535)
//     %3 : f32[1,5,64,128] = aten::transpose.int(%1, -2, -1)
//     ...
//
// The graph's outputs are the operands of its return node (Graph::return_node(), "prim::Return",
// as in TorchScript), which the graph owns apart from nodes(): returning a value is a use of
// it, so a value with no uses is dead, and replace_all_uses_with redirects outputs as it
// redirects any reader.
//
// Invariants (checked by verify()):
//  - every input of a node is a graph input or the output of an earlier node, and every
//    output is a graph input or the output of a node;
//  - Value::uses() lists exactly the (node, operand) pairs that read the value, the return
//    node's included; removing a use that is not listed throws jvpc::Error;
//  - a node's Args refer to valid operand indices, and its op exists with that many arguments;
//  - a value whose node or input was erased is neither a graph input nor an output of a node
//    (Value::erased()).
// The insertion point of new nodes is set only through an InsertionGuard, so a rule or pass
// that throws cannot leave it set.
#pragma once

#include "ir/op.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace jvpc {

/// The one error type jvpc throws for bad input and broken invariants. Its message is one line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Static metadata of a tensor value.
struct TensorMeta {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::kCPU);

  static TensorMeta of(const at::Tensor& t);
  /// Contiguous strides for `sizes`.
  static TensorMeta contiguous(std::vector<int64_t> sizes, c10::ScalarType dtype, c10::Device device);
  /// Number of elements; throws jvpc::Error when it overflows int64.
  int64_t numel() const;
  /// numel() × element size; throws jvpc::Error when it overflows int64.
  int64_t nbytes() const;
  bool is_contiguous() const;
  /// Same sizes, dtype and device (strides are a layout detail).
  bool same_signature(const TensorMeta& other) const {
    return sizes == other.sizes && dtype == other.dtype && device == other.device;
  }
  /// "f32[5,128,64]" (device omitted for CPU).
  std::string str() const;
};

class Node;
class Graph;

/// A read of a value: operand `index` of `user`. A graph output is a use by the graph's return
/// node (Graph::return_node(); `index` is the output's position).
struct Use {
  Node* user;
  size_t index;
  bool operator==(const Use& o) const { return user == o.user && index == o.index; }
};

/// What a graph input stands for.
enum class Role : uint8_t {
  Primal,    ///< an input of the traced function
  Tangent,   ///< a tangent (a direction) for a primal input
  Constant,  ///< a tensor bound into the graph: a captured constant or a folded residual
};
const char* role_name(Role r);

/// A value's uses: most values are read once or twice, and those keep their uses inline.
using Uses = c10::SmallVector<Use, 2>;

class Value {
 public:
  int id() const { return id_; }
  const TensorMeta& meta() const { return meta_; }
  /// New metadata: its producer and its readers change (Node::stamp).
  void set_meta(TensorMeta m);
  /// The node that computes this value, or nullptr for a graph input.
  Node* producer() const { return producer_; }
  /// Position in producer()->outputs().
  size_t output_index() const { return index_; }
  /// Every read of this value, graph outputs included: a value without uses is dead.
  const Uses& uses() const { return uses_; }
  bool has_uses() const { return !uses_.empty(); }
  /// Whether the graph returns this value (one of its uses is by the return node).
  bool is_graph_output() const;
  /// Whether its node (or, for a graph input, the input) was erased: it is no longer part of
  /// the graph, though the object stays allocated (ids are never reused).
  bool erased() const { return erased_; }
  /// Makes every reader of this value read `other` instead. Graph outputs are redirected too.
  void replace_all_uses_with(Value* other);
  Graph* graph() const { return graph_; }

 private:
  friend class Graph;
  friend class Node;
  Graph* graph_ = nullptr;
  int id_ = -1;
  TensorMeta meta_;
  Node* producer_ = nullptr;
  size_t index_ = 0;
  bool erased_ = false;
  Uses uses_;
  void add_use(Use u) { uses_.push_back(u); }
  /// Throws jvpc::Error (a broken invariant) if `u` is not listed.
  void remove_use(Use u);
};

/// How a schema argument is given. Tensor kinds refer to Node operands; the rest are constants
/// stored as the boxed calling convention stores them (ScalarType, Layout and MemoryFormat as
/// Int, Scalar as Int, Float or Bool).
enum class ArgKind : uint8_t {
  None,
  Bool,
  Int,
  Float,
  Str,
  Ints,
  Floats,
  Bools,
  ScalarType,
  Layout,
  MemoryFormat,
  Device,
  Tensor,
  TensorList,
  OptTensorList,
};
const char* arg_kind_name(ArgKind k);

struct Arg {
  ArgKind kind = ArgKind::None;
  c10::IValue value;          ///< the constant, for non-tensor kinds
  std::vector<int> operands;  ///< tensor kinds: indices into Node::inputs(), -1 for an absent entry

  bool is_tensor_kind() const {
    return kind == ArgKind::Tensor || kind == ArgKind::TensorList || kind == ArgKind::OptTensorList;
  }
  /// An Int or Float argument as a number (a Scalar's value), or nullopt.
  std::optional<double> number() const {
    if (kind == ArgKind::Int) return static_cast<double>(value.toInt());
    if (kind == ArgKind::Float) return value.toDouble();
    return std::nullopt;
  }
  bool is_number(double v) const { return number() == v; }
  static Arg none() { return Arg{}; }
  static Arg of_bool(bool b) { return Arg{ArgKind::Bool, b, {}}; }
  static Arg of_int(int64_t i) { return Arg{ArgKind::Int, i, {}}; }
  static Arg of_float(double d) { return Arg{ArgKind::Float, d, {}}; }
  static Arg of_str(std::string s) { return Arg{ArgKind::Str, std::move(s), {}}; }
  static Arg of_ints(std::vector<int64_t> v) { return Arg{ArgKind::Ints, std::move(v), {}}; }
  static Arg of_scalar_type(c10::ScalarType t) { return Arg{ArgKind::ScalarType, static_cast<int64_t>(t), {}}; }
  static Arg of_device(c10::Device d) { return Arg{ArgKind::Device, d, {}}; }
  static Arg tensor(int operand) { return Arg{ArgKind::Tensor, {}, {operand}}; }
};

class Node {
 public:
  /// Qualified operator name with overload: "aten::bmm", "aten::mul.Tensor".
  const std::string& op() const { return op_; }
  /// The op's handle (ir/op.h), Op() for an op the code does not name.
  Op handle() const { return handle_; }
  /// Whether the node applies `op`: `n->is(ops::bmm)`.
  bool is(Op op) const { return handle_ == op; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  Value* input(size_t i) const { return inputs_.at(i); }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* output(size_t i = 0) const { return outputs_.at(i); }
  const std::vector<Arg>& args() const { return args_; }
  const Arg& arg(size_t i) const { return args_.at(i); }
  /// The value passed for schema argument `i`, which must be of kind Tensor.
  Value* tensor_arg(size_t i) const;
  /// For each schema return: how many outputs it produced (1 for Tensor, n for Tensor[],
  /// 0 for a return that is not a tensor, or was undefined when traced, and is dropped).
  const std::vector<int>& return_counts() const { return return_counts_; }
  /// Random ops: never folded, deduplicated or differentiated.
  bool impure() const { return impure_; }
  Graph* graph() const { return graph_; }
  /// Whether this is its graph's return node (Graph::return_node()).
  bool is_return() const;
  /// Changes whenever the node's arguments or operands, or its operands' or outputs' metadata,
  /// change; no two nodes of a graph ever have the same one (ShapeChecks compares it).
  uint64_t stamp() const { return stamp_; }
  /// Whether the outputs' metadata is what shape inference gives for the node as it is now: set
  /// by mark_shapes_inferred() (the Builder, which inferred it), lost with the next change.
  bool shapes_inferred() const { return inferred_at_ == stamp_; }
  void mark_shapes_inferred() { inferred_at_ = stamp_; }

  void replace_input(size_t i, Value* v);
  /// Replaces schema argument `i`, a constant, by another constant.
  void set_constant_arg(size_t i, Arg a);

 private:
  friend class Graph;
  friend class Value;
  Graph* graph_ = nullptr;
  std::string op_;
  Op handle_;
  std::vector<Value*> inputs_;
  std::vector<Arg> args_;
  std::vector<Value*> outputs_;
  std::vector<int> return_counts_;
  bool impure_ = false;
  uint64_t stamp_ = 0;
  uint64_t inferred_at_ = ~uint64_t{0};  // the stamp at mark_shapes_inferred(); none before
  std::list<std::unique_ptr<Node>>::iterator self_;
  void touch();
};

/// Floating and complex dtypes: the ones that have tangents.
inline bool differentiable_dtype(c10::ScalarType t) { return c10::isFloatingType(t) || c10::isComplexType(t); }

/// A tensor's version counter, which in-place writes advance; none for an undefined tensor or an
/// inference tensor, which keeps none.
std::optional<int64_t> version_counter(const at::Tensor& t);

/// Tensors by value id (Value::id): what a tracing run computed, what fold knows.
using TensorsById = ska::flat_hash_map<int, at::Tensor>;

/// A graph input: a named value with a role. Constants carry their tensor in `data`.
struct Input {
  std::string name;
  Value* value = nullptr;
  Role role = Role::Primal;
  /// Primal inputs: differentiated by default.
  bool differentiable = false;
  /// Constant inputs: the bound tensor (may be undefined until bound, e.g. after load()).
  at::Tensor data;
  /// Constant inputs: the name of the caller's input this tensor aliases (a view of a primal
  /// input kept as a residual), or "". Such bytes are owned by the caller, not by the graph.
  std::string aliases;
  /// Tangent inputs: the name of the primal input this is the tangent of ("q" for "dq").
  std::string tangent_of;
  /// Constant inputs: data's version counter when it was bound (none for an inference tensor,
  /// which keeps none). A later version means the tensor was written in place since: by a
  /// caller, into an input a residual aliases or a tensor the traced function captured.
  std::optional<int64_t> data_version;

  /// Sets `data` and notes its version.
  void bind(at::Tensor t);
  /// Throws jvpc::Error, naming this constant, if `data` was written in place since bound.
  void check_unwritten() const;
  /// The error for a constant written in place after the graph was compiled.
  std::string written_error() const;
};

class Graph {
 public:
  Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // --- inputs and outputs -------------------------------------------------------------------
  Value* add_input(std::string name, TensorMeta meta, Role role, bool differentiable = false);
  Value* add_constant(std::string name, at::Tensor data, std::string aliases = "");
  const std::vector<Input>& inputs() const { return inputs_; }
  std::vector<Input>& inputs() { return inputs_; }
  const Input& input_of(const Value* v) const;             ///< throws if v is not a graph input
  const Input* find_input(const std::string& name) const;  ///< nullptr if no input has the name
  bool is_input(const Value* v) const { return v->producer() == nullptr && !v->erased(); }
  /// Removes the inputs for which `erase` holds, each one nothing reads (nor returns), in one
  /// pass; their values become erased(). Throws, erasing none, if one is read or returned.
  /// Returns how many it removed.
  size_t erase_inputs_if(const std::function<bool(const Input&)>& erase);

  /// The returned values: the return node's operands.
  const std::vector<Value*>& outputs() const { return return_->inputs(); }
  const std::vector<std::string>& output_names() const { return output_names_; }
  /// Returns `v` as well, under `name` ("out<i>" when empty). A value may be returned twice.
  void add_output(Value* v, std::string name = "");
  void erase_output(size_t i);
  /// The node whose operands are the outputs ("prim::Return"; no args, no outputs). It is not in
  /// nodes(): passes that walk the nodes never see it, but its reads are uses like any other.
  const Node* return_node() const { return return_.get(); }
  /// Gives every value the id `id(v)` (unique, 0 or more; values created later get larger ones):
  /// a loaded graph takes its file's ids, so that every error names values as the file does.
  void renumber(const std::function<int(const Value*)>& id);

  // --- nodes --------------------------------------------------------------------------------
  /// Creates a node at the insertion point. `args` follow the schema; their tensor operands
  /// index `inputs`. Output metadata is given, one per produced output.
  Node* create(std::string op, std::vector<Arg> args, std::vector<Value*> inputs, std::vector<TensorMeta> outputs,
               std::vector<int> return_counts = {}, bool impure = false);
  /// Removes a node none of whose outputs is used (nor returned); its outputs become erased().
  void erase(Node* n);
  /// Where create() puts nodes: before this node, or at the end (nullptr). Set it with an
  /// InsertionGuard.
  Node* insertion_point() const { return insert_before_; }

  /// Nodes in execution order, as a copy: a loop over it may erase the current node.
  size_t num_nodes() const { return nodes_.size(); }
  /// Every value's id() is below this (ids index dense per-value tables).
  int id_bound() const { return next_id_; }
  std::vector<Node*> nodes() const;
  /// The node after `n` in execution order, or nullptr.
  Node* next(Node* n) const;
  /// Moves `n` just before `before` (nullptr: to the end). The caller keeps order valid.
  void move_before(Node* n, Node* before);

  /// A deep copy. `map` (optional) receives old value -> new value.
  std::unique_ptr<Graph> clone(std::unordered_map<const Value*, Value*>* map = nullptr) const;

 private:
  Value* new_value(TensorMeta meta);
  friend class Value;
  friend class Node;
  friend class InsertionGuard;
  std::list<std::unique_ptr<Node>> nodes_;
  // nodes() as of the last change to nodes_: passes ask for it again and again, and walking the
  // list each time reads every node's list entry.
  mutable std::vector<Node*> order_;
  mutable bool order_valid_ = false;
  mutable std::mutex order_mutex_;  // threads may read one const graph at once
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<Input> inputs_;
  std::unique_ptr<Node> return_;  // operands: the outputs
  std::vector<std::string> output_names_;
  Node* insert_before_ = nullptr;
  // The points that live guards restore, innermost last: erase() moves any that is the erased
  // node to the node after it, so that no guard restores a dangling pointer.
  std::vector<Node**> saved_points_;
  int next_id_ = 0;
  uint64_t last_stamp_ = 0;  // Node::stamp
};

/// Sets a graph's insertion point for its lifetime and restores the earlier one when it ends,
/// also when a rule or pass throws:
///
///   InsertionGuard at(g, n);      // nodes are created before n
///   Value* y = b.call(ops::exp, {x});
///   at.move_to(g.next(n));        // and now before the node after n
class InsertionGuard {
 public:
  /// Keeps the current insertion point until move_to().
  explicit InsertionGuard(Graph& g);
  /// Inserts before `before` (nullptr: at the end).
  InsertionGuard(Graph& g, Node* before);
  ~InsertionGuard();
  InsertionGuard(const InsertionGuard&) = delete;
  InsertionGuard& operator=(const InsertionGuard&) = delete;
  void move_to(Node* before) { g_.insert_before_ = before; }

 private:
  Graph& g_;
  Node* saved_;
};

/// Splits "aten::mul.Tensor" into {"aten::mul", "Tensor"}; "aten::bmm" into {"aten::bmm", ""}.
std::pair<std::string, std::string> split_op_name(const std::string& qualified);

}  // namespace jvpc
