// Graph, Node and Value: construction, use lists and mutation.
#include "ir/graph.h"

#include "ir/dtypes.h"

#include <unordered_set>

#include <algorithm>
#include <sstream>
#include <unordered_map>

namespace jvpc {

// --- TensorMeta ---------------------------------------------------------------------------

TensorMeta TensorMeta::of(const at::Tensor& t) {
  return TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.device()};
}

TensorMeta TensorMeta::contiguous(std::vector<int64_t> sizes, c10::ScalarType dtype, c10::Device device) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    if (__builtin_mul_overflow(s, std::max<int64_t>(sizes[i], 1), &s))
      throw Error("element count of a tensor of " + std::to_string(sizes.size()) + " dims overflows 64 bits");
  }
  return TensorMeta{std::move(sizes), std::move(strides), dtype, device};
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s < 0) throw Error("negative size " + std::to_string(s) + " in " + str());
    if (__builtin_mul_overflow(n, s, &n)) throw Error("element count of " + str() + " overflows 64 bits");
  }
  return n;
}

int64_t TensorMeta::nbytes() const {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel(), static_cast<int64_t>(c10::elementSize(dtype)), &bytes))
    throw Error("byte size of " + str() + " overflows 64 bits");
  return bytes;
}

bool TensorMeta::is_contiguous() const {
  numel();  // throws for sizes whose strides would overflow
  return strides == contiguous(sizes, dtype, device).strides;
}

std::string TensorMeta::str() const {
  std::ostringstream os;
  os << short_dtype_name(dtype);
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? "," : "") << sizes[i];
  os << "]";
  if (!device.is_cpu()) os << "@" << device.str();
  return os.str();
}

const char* role_name(Role r) {
  switch (r) {
    case Role::Primal:
      return "primal";
    case Role::Tangent:
      return "tangent";
    case Role::Constant:
      return "constant";
  }
  return "?";
}

const char* arg_kind_name(ArgKind k) {
  switch (k) {
    case ArgKind::None:
      return "none";
    case ArgKind::Bool:
      return "bool";
    case ArgKind::Int:
      return "int";
    case ArgKind::Float:
      return "float";
    case ArgKind::Str:
      return "str";
    case ArgKind::Ints:
      return "ints";
    case ArgKind::Floats:
      return "floats";
    case ArgKind::Bools:
      return "bools";
    case ArgKind::ScalarType:
      return "scalar_type";
    case ArgKind::Layout:
      return "layout";
    case ArgKind::MemoryFormat:
      return "memory_format";
    case ArgKind::Device:
      return "device";
    case ArgKind::Tensor:
      return "tensor";
    case ArgKind::TensorList:
      return "tensors";
    case ArgKind::OptTensorList:
      return "opt_tensors";
  }
  return "?";
}

std::pair<std::string, std::string> split_op_name(const std::string& qualified) {
  auto ns = qualified.find("::");
  auto dot = qualified.find('.', ns == std::string::npos ? 0 : ns + 2);
  if (dot == std::string::npos) return {qualified, ""};
  return {qualified.substr(0, dot), qualified.substr(dot + 1)};
}

// --- Value and Node -----------------------------------------------------------------------

void Value::set_meta(TensorMeta m) {
  meta_ = std::move(m);
  if (producer_) producer_->touch();
  for (const Use& u : uses_) u.user->touch();
}

void Value::replace_all_uses_with(Value* other) {
  if (other == this) return;
  auto uses = uses_;  // replace_input edits uses_
  for (const Use& u : uses) u.user->replace_input(u.index, other);
}

bool Value::is_graph_output() const {
  return std::any_of(uses_.begin(), uses_.end(), [](const Use& u) { return u.user->is_return(); });
}

void Value::remove_use(Use u) {
  auto it = std::find(uses_.begin(), uses_.end(), u);
  if (it == uses_.end())
    throw Error("internal error: use list of %" + std::to_string(id_) + " does not list operand " +
                std::to_string(u.index) + " of " + (u.user ? u.user->op() : std::string("a null node")));
  uses_.erase(it);
}

bool Node::is_return() const { return graph_ && graph_->return_node() == this; }

Value* Node::tensor_arg(size_t i) const {
  const Arg& a = args_.at(i);
  if (a.kind != ArgKind::Tensor)
    throw Error(op_ + ": argument " + std::to_string(i) + " is " + arg_kind_name(a.kind) + ", not a tensor");
  return inputs_.at(static_cast<size_t>(a.operands.at(0)));
}

void Node::replace_input(size_t i, Value* v) {
  Value* old = inputs_.at(i);
  if (!v || v->graph_ != graph_) throw Error(op_ + ": operand from another graph");
  old->remove_use(Use{this, i});
  inputs_[i] = v;
  v->add_use(Use{this, i});
  touch();
}

void Node::set_constant_arg(size_t i, Arg a) {
  if (a.is_tensor_kind() || args_.at(i).is_tensor_kind())
    throw Error("set_constant_arg: tensor arguments are edited with replace_input");
  args_[i] = std::move(a);
  touch();
}

void Node::touch() {
  if (graph_) stamp_ = ++graph_->last_stamp_;
}

// --- Graph --------------------------------------------------------------------------------

Graph::Graph() : return_(std::make_unique<Node>()) {
  return_->graph_ = this;
  return_->op_ = "prim::Return";
}

InsertionGuard::InsertionGuard(Graph& g) : g_(g), saved_(g.insert_before_) { g_.saved_points_.push_back(&saved_); }

InsertionGuard::InsertionGuard(Graph& g, Node* before) : InsertionGuard(g) { move_to(before); }

InsertionGuard::~InsertionGuard() {
  g_.insert_before_ = saved_;
  g_.saved_points_.pop_back();
}

Value* Graph::new_value(TensorMeta meta) {
  auto v = std::make_unique<Value>();
  v->graph_ = this;
  v->id_ = next_id_++;
  v->meta_ = std::move(meta);
  values_.push_back(std::move(v));
  return values_.back().get();
}

Value* Graph::add_input(std::string name, TensorMeta meta, Role role, bool differentiable) {
  Value* v = new_value(std::move(meta));
  inputs_.push_back(Input{std::move(name), v, role, differentiable, {}, "", "", std::nullopt});
  return v;
}

std::optional<int64_t> version_counter(const at::Tensor& t) {
  if (!t.defined() || t.is_inference()) return std::nullopt;
  return t._version();
}

void Input::bind(at::Tensor t) {
  data = std::move(t);
  data_version = version_counter(data);
}

void Input::check_unwritten() const {
  if (data_version && data.defined() && data._version() != *data_version) throw Error(written_error());
}

std::string Input::written_error() const {
  if (!aliases.empty())
    return "constant '" + name + "' aliases the input '" + aliases +
           "', which was written in place after the graph was compiled; the graph's other constants hold values "
           "computed from the old one: compile (linearize) again";
  return "constant '" + name +
         "' was written in place after the graph was compiled (it is a tensor the traced "
         "function captured, or one a caller holds): compile (linearize) again";
}

Value* Graph::add_constant(std::string name, at::Tensor data, std::string aliases) {
  Value* v = add_input(std::move(name), TensorMeta::of(data), Role::Constant);
  inputs_.back().bind(std::move(data));
  inputs_.back().aliases = std::move(aliases);
  return v;
}

const Input& Graph::input_of(const Value* v) const {
  for (const Input& in : inputs_)
    if (in.value == v) return in;
  throw Error("%" + std::to_string(v->id()) + " is not a graph input");
}

size_t Graph::erase_inputs_if(const std::function<bool(const Input&)>& erase) {
  std::vector<bool> erased(inputs_.size(), false);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (!erase(inputs_[i])) continue;
    const Value* v = inputs_[i].value;
    if (v->is_graph_output()) throw Error("erase_inputs_if: input '" + inputs_[i].name + "' is an output");
    if (v->has_uses()) throw Error("erase_inputs_if: input '" + inputs_[i].name + "' is used");
    erased[i] = true;
  }
  size_t kept = 0;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (erased[i]) {
      inputs_[i].value->erased_ = true;
      continue;
    }
    if (kept != i) inputs_[kept] = std::move(inputs_[i]);
    ++kept;
  }
  const size_t removed = inputs_.size() - kept;
  inputs_.resize(kept);
  return removed;
}

const Input* Graph::find_input(const std::string& name) const {
  for (const Input& in : inputs_)
    if (in.name == name) return &in;
  return nullptr;
}

void Graph::add_output(Value* v, std::string name) {
  if (!v || v->graph_ != this || v->erased_) throw Error("add_output: the value is not in this graph");
  auto& outs = return_->inputs_;
  if (name.empty()) name = "out" + std::to_string(outs.size());
  v->add_use(Use{return_.get(), outs.size()});
  outs.push_back(v);
  output_names_.push_back(std::move(name));
}

void Graph::erase_output(size_t i) {
  auto& outs = return_->inputs_;
  if (i >= outs.size()) throw Error("erase_output: no output " + std::to_string(i));
  outs[i]->remove_use(Use{return_.get(), i});
  // The outputs after it move up one place, and so do their uses' indices.
  for (size_t j = i + 1; j < outs.size(); ++j) {
    outs[j]->remove_use(Use{return_.get(), j});
    outs[j]->add_use(Use{return_.get(), j - 1});
  }
  outs.erase(outs.begin() + static_cast<std::ptrdiff_t>(i));
  output_names_.erase(output_names_.begin() + static_cast<std::ptrdiff_t>(i));
}

Node* Graph::create(std::string op, std::vector<Arg> args, std::vector<Value*> inputs, std::vector<TensorMeta> outputs,
                    std::vector<int> return_counts, bool impure) {
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  n->graph_ = this;
  n->stamp_ = ++last_stamp_;
  n->op_ = std::move(op);
  n->handle_ = Op::find(n->op_);
  n->args_ = std::move(args);
  n->impure_ = impure;
  for (const Arg& a : n->args_)
    for (int o : a.operands)
      if (o >= static_cast<int>(inputs.size()))
        throw Error(n->op_ + ": argument refers to operand " + std::to_string(o) + " of " +
                    std::to_string(inputs.size()));
  for (const Value* in : inputs)
    if (!in || in->graph_ != this) throw Error(n->op_ + ": operand from another graph");
  n->inputs_ = std::move(inputs);
  for (size_t i = 0; i < n->inputs_.size(); ++i) n->inputs_[i]->add_use(Use{n, i});
  n->outputs_.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    Value* v = new_value(std::move(outputs[i]));
    v->producer_ = n;
    v->index_ = i;
    n->outputs_.push_back(v);
  }
  if (return_counts.empty()) return_counts.assign(n->outputs_.size(), 1);
  n->return_counts_ = std::move(return_counts);
  auto pos = insert_before_ ? insert_before_->self_ : nodes_.end();
  n->self_ = nodes_.insert(pos, std::move(node));
  if (order_valid_ && !insert_before_) {
    order_.push_back(n);
  } else {
    order_valid_ = false;
  }
  return n;
}

void Graph::erase(Node* n) {
  if (!n || n->graph_ != this || n->is_return()) throw Error("erase: the node is not one of this graph's nodes");
  for (Value* o : n->outputs_) {
    if (o->is_graph_output())
      throw Error("erase: output %" + std::to_string(o->id()) + " of " + n->op_ + " is a graph output");
    if (o->has_uses()) throw Error("erase: output %" + std::to_string(o->id()) + " of " + n->op_ + " is used");
  }
  for (size_t i = 0; i < n->inputs_.size(); ++i) n->inputs_[i]->remove_use(Use{n, i});
  Node* after = next(n);
  if (insert_before_ == n) insert_before_ = after;
  for (Node** p : saved_points_)
    if (*p == n) *p = after;
  // Values stay allocated (ids are never reused) but are detached from the node.
  for (Value* o : n->outputs_) {
    o->producer_ = nullptr;
    o->erased_ = true;
  }
  nodes_.erase(n->self_);
  order_valid_ = false;
}

std::vector<Node*> Graph::nodes() const {
  std::lock_guard<std::mutex> lock(order_mutex_);
  if (!order_valid_) {
    order_.clear();
    order_.reserve(nodes_.size());
    for (const auto& n : nodes_) order_.push_back(n.get());
    order_valid_ = true;
  }
  return order_;
}

Node* Graph::next(Node* n) const {
  auto it = std::next(n->self_);
  return it == nodes_.end() ? nullptr : it->get();
}

void Graph::move_before(Node* n, Node* before) {
  auto pos = before ? before->self_ : nodes_.end();
  nodes_.splice(pos, nodes_, n->self_);
  order_valid_ = false;
}

std::unique_ptr<Graph> Graph::clone(std::unordered_map<const Value*, Value*>* map) const {
  auto g = std::make_unique<Graph>();
  std::unordered_map<const Value*, Value*> local;
  auto& m = map ? *map : local;
  for (const Input& in : inputs_) {
    Value* v = g->add_input(in.name, in.value->meta(), in.role, in.differentiable);
    g->inputs_.back().data = in.data;
    g->inputs_.back().data_version = in.data_version;  // the same tensor: writes since still show
    g->inputs_.back().aliases = in.aliases;
    g->inputs_.back().tangent_of = in.tangent_of;
    m[in.value] = v;
  }
  for (const auto& n : nodes_) {
    std::vector<Value*> ins;
    for (Value* v : n->inputs_) ins.push_back(m.at(v));
    std::vector<TensorMeta> outs;
    for (Value* v : n->outputs_) outs.push_back(v->meta());
    Node* c = g->create(n->op_, n->args_, ins, outs, n->return_counts_, n->impure_);
    for (size_t i = 0; i < outs.size(); ++i) m[n->outputs_[i]] = c->outputs_[i];
  }
  for (size_t i = 0; i < outputs().size(); ++i) g->add_output(m.at(outputs()[i]), output_names_[i]);
  return g;
}

void Graph::renumber(const std::function<int(const Value*)>& id) {
  std::unordered_set<int> seen;
  int next = 0;
  for (const auto& v : values_) {
    int i = id(v.get());
    if (i < 0 || !seen.insert(i).second)
      throw Error("renumber: id %" + std::to_string(i) + " is negative or given twice");
    next = std::max(next, i + 1);
  }
  for (const auto& v : values_) v->id_ = id(v.get());
  next_id_ = next;
}

}  // namespace jvpc
