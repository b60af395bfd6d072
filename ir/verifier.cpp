#include "ir/verifier.h"

#include "ir/ops.h"
#include "ir/shape_memo.h"

#include <c10/util/flat_hash_map.h>

#include <climits>
#include <algorithm>
#include <string_view>
#include <tuple>
#include <vector>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

namespace {

std::string id_name(const Value* v) { return "%" + std::to_string(v->id()); }

std::string describe(const Node* n, const std::function<std::string(const Value*)>& name) {
  std::string s = n->op();
  if (!n->outputs().empty()) s += " -> " + name(n->output());
  return s;
}

// `what()` names the value in an error; it is called only to report one.
template <typename F>
void check_meta(const TensorMeta& m, const F& what) {
  if (m.strides.size() != m.sizes.size())
    throw Error(what() + ": " + std::to_string(m.sizes.size()) + " sizes but " + std::to_string(m.strides.size()) +
                " strides");
  m.numel();  // negative sizes and overflow
  for (int64_t s : m.strides)
    if (s < 0) throw Error(what() + ": negative stride " + std::to_string(s));
}

// How many tensors a schema return can give: 1 for Tensor and Tensor?, any for Tensor[], 0 else.
int max_tensors(const c10::Argument& r) {
  const c10::TypePtr& t = r.real_type();
  if (t->kind() == c10::TypeKind::TensorType) return 1;
  if (auto o = t->cast<c10::OptionalType>()) return o->getElementType()->kind() == c10::TypeKind::TensorType ? 1 : 0;
  if (auto l = t->cast<c10::ListType>()) return l->getElementType()->kind() == c10::TypeKind::TensorType ? INT_MAX : 0;
  return 0;
}

// Use lists up to this long are searched for each read.
constexpr size_t kShortUses = 16;

// Whether v's use list records its read as operand `index` of `user`.
bool listed(const Value* v, const Node* user, size_t index) {
  const Uses& uses = v->uses();
  return std::find(uses.begin(), uses.end(), Use{const_cast<Node*>(user), index}) != uses.end();
}

Error stale_uses() { return Error("use lists are out of date (a pass edited operands without replace_input)"); }

}  // namespace

std::string describe(const Node* n) { return describe(n, id_name); }

bool ShapeChecks::unchanged(const Node& n) const {
  if (n.shapes_inferred()) return true;  // the same inference a check would run, on the node as it is
  auto it = seen_.find(&n);
  return it != seen_.end() && it->second == n.stamp();
}

void ShapeChecks::passed(const Node& n) {
  if (recording_) seen_[&n] = n.stamp();
}

void ShapeChecks::trust(const Graph& g) {
  seen_.reserve(seen_.size() + g.num_nodes());
  for (const Node* n : g.nodes()) passed(*n);
}

void verify(const Graph& g, const VerifyOptions& options) {
  const auto name = id_name;                 // a loaded graph has its file's ids (Graph::renumber)
  ska::flat_hash_set<const Value*> defined;  // open addressing: no allocation per value
  ska::flat_hash_set<int> ids;
  std::unordered_set<std::string_view> names;  // views of the inputs' own names
  // Every read (an operand, or an output returned) must be in its value's use list: looked up
  // there for a short list, compared sorted for a long one (a graph file's constant read by a
  // million nodes costs a sort, not a million scans of a million entries).
  size_t reads = 0;
  using Read = std::tuple<const Value*, const Node*, size_t>;
  std::vector<Read> long_reads;
  auto read = [&](const Value* v, const Node* user, size_t index) {
    ++reads;
    if (v->uses().size() > kShortUses)
      long_reads.emplace_back(v, user, index);
    else if (!listed(v, user, index))
      throw stale_uses();
  };
  const size_t values = g.inputs().size() + 2 * g.num_nodes();  // about: most nodes have one output
  defined.reserve(values);
  ids.reserve(values);
  names.reserve(g.inputs().size());

  auto define = [&](const Value* v, const auto& where) {
    if (!ids.insert(v->id()).second) throw Error(where() + ": value id " + name(v) + " is defined twice");
    defined.insert(v);
  };

  for (const Input& in : g.inputs()) {
    std::string where = "input '" + in.name + "'";
    if (in.name.empty()) throw Error("an input has no name");
    if (!names.insert(in.name).second) throw Error(where + " is declared twice");
    if (in.value->producer()) throw Error(where + ": value " + name(in.value) + " has a producer");
    check_meta(in.value->meta(), [&] { return where; });
    if (in.role == Role::Constant && in.data.defined()) {
      const TensorMeta& declared = in.value->meta();
      if (in.data.sizes() != c10::IntArrayRef(declared.sizes) || in.data.scalar_type() != declared.dtype ||
          in.data.device() != declared.device)
        throw Error(where + ": bound tensor is " + TensorMeta::of(in.data).str() + " but the graph declares " +
                    declared.str());
    }
    if (in.role != Role::Constant && in.data.defined()) throw Error(where + ": only constants carry data");
    define(in.value, [&] { return where; });
  }

  std::vector<bool> referenced;  // per node: which operands its arguments pass
  for (const Node* n : g.nodes()) {
    // The node as errors name it, made only for an error: describing every node costs more than checking it.
    auto where = [&] { return "node " + describe(n, name); };
    if (n->graph() != &g) throw Error(where() + " belongs to another graph");
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const Value* v = n->inputs()[i];
      if (!defined.count(v))
        throw Error(where() + ": operand " + std::to_string(i) + " (" + name(v) + ") is not defined before use");
      read(v, n, i);
    }
    referenced.assign(n->inputs().size(), false);
    for (const Arg& a : n->args())
      for (int o : a.operands) {
        if (o < -1 || o >= static_cast<int>(n->inputs().size()))
          throw Error(where() + ": argument refers to missing operand " + std::to_string(o));
        if (o == -1 && a.kind != ArgKind::OptTensorList)
          throw Error(where() + ": absent operand outside an optional list");
        if (o >= 0) {
          if (referenced[static_cast<size_t>(o)])
            throw Error(where() + ": operand " + std::to_string(o) + " is passed twice");
          referenced[static_cast<size_t>(o)] = true;
        }
      }
    for (size_t i = 0; i < referenced.size(); ++i)
      if (!referenced[i]) throw Error(where() + ": operand " + std::to_string(i) + " is not passed to any argument");
    int produced = 0;
    for (int c : n->return_counts()) {
      if (c < 0) throw Error(where() + ": negative return count");
      produced += c;
    }
    if (produced != static_cast<int>(n->outputs().size()))
      throw Error(where() + ": return counts add up to " + std::to_string(produced) + " but the node has " +
                  std::to_string(n->outputs().size()) + " outputs");
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      const Value* o = n->outputs()[i];
      if (o->producer() != n || o->output_index() != i)
        throw Error(where() + ": output " + std::to_string(i) + " is not linked to it");
      check_meta(o->meta(), [&] { return where() + " output " + name(o); });
    }

    if (options.check_schemas) {
      const OpInfo& info = op_info(n->op());
      const auto& schema = info.schema();
      if (info.mutates)
        throw Error(where() + ": " + n->op() +
                    " writes to an argument; jvpc graphs are functional (use the out-of-place op)");
      if (n->outputs().empty())
        throw Error(where() + ": produces no tensor; a graph records only ops with tensor results");
      if (n->args().size() != schema.arguments().size())
        throw Error(where() + ": " + n->op() + " takes " + std::to_string(schema.arguments().size()) +
                    " arguments, the node has " + std::to_string(n->args().size()));
      for (size_t i = 0; i < n->args().size(); ++i)
        if (!kind_matches(n->args()[i].kind, schema.arguments()[i]))
          throw Error(where() + ": argument '" + schema.arguments()[i].name() + "' of type " +
                      schema.arguments()[i].real_type()->str() + " cannot take a " + arg_kind_name(n->args()[i].kind));
      if (n->return_counts().size() != schema.returns().size())
        throw Error(where() + ": " + std::to_string(n->return_counts().size()) + " return counts for " +
                    std::to_string(schema.returns().size()) + " schema returns");
      for (size_t i = 0; i < schema.returns().size(); ++i)
        if (n->return_counts()[i] > max_tensors(schema.returns()[i]))
          throw Error(where() + ": return " + std::to_string(i) + " of " + n->op() + " is " +
                      schema.returns()[i].real_type()->str() + ", which cannot give " +
                      std::to_string(n->return_counts()[i]) + " tensor(s)");
      if (options.check_shapes && !(options.shape_checks && options.shape_checks->unchanged(*n))) {
        try {
          std::vector<int> counts;
          auto expect = infer_outputs(*n, &counts);
          if (counts != n->return_counts()) throw Error(where() + ": outputs do not match the op's returns");
          for (size_t i = 0; i < expect.size(); ++i) {
            const TensorMeta& got = n->outputs()[i]->meta();
            bool value_dependent = value_dependent_shape(*n, i);
            bool sizes_differ = got.sizes != expect[i].sizes && !value_dependent;
            if (!options.trust_declared_shapes && value_dependent && got.numel() > expect[i].numel())
              sizes_differ = true;  // bounded by the shape inferred
            if (sizes_differ || got.dtype != expect[i].dtype)
              throw Error(where() + ": output " + name(n->outputs()[i]) + " is declared " + got.str() + " but " +
                          n->op() + " produces " + expect[i].str());
          }
          if (options.shape_checks) options.shape_checks->passed(*n);
        } catch (const NoShapeRule&) {
          // Kernels without a Meta implementation or shape rule: declared shapes are trusted,
          // except in graphs from files.
          if (!options.trust_declared_shapes)
            throw Error(where() + ": " + n->op() +
                        " has no Meta kernel or shape rule, so its declared shapes cannot be checked");
          if (options.shape_checks) options.shape_checks->passed(*n);
        }
      }
    }
    for (const Value* o : n->outputs()) define(o, where);
  }

  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* v = g.outputs()[i];
    if (!defined.count(v)) throw Error("output " + std::to_string(i) + " (" + name(v) + ") is not defined");
    read(v, g.return_node(), i);  // returning a value is a use of it
  }
  if (g.return_node()->graph() != &g || !g.return_node()->args().empty() || !g.return_node()->outputs().empty())
    throw Error("the return node is not this graph's, or has arguments or outputs");

  // Use lists must list exactly the reads. The reads are distinct (one per operand slot): with
  // each short list's reads found in it, the long lists equal to theirs, and no more entries in
  // all the lists than there are reads, the lists hold each read once and nothing else.
  size_t uses = 0;
  std::vector<Read> long_listed;
  long_listed.reserve(long_reads.size());
  for (const Value* v : defined) {
    if (v->erased()) throw Error("value " + name(v) + " is erased but still in the graph");
    uses += v->uses().size();
    if (v->uses().size() > kShortUses)
      for (const Use& u : v->uses()) long_listed.emplace_back(v, u.user, u.index);
  }
  std::sort(long_reads.begin(), long_reads.end());
  std::sort(long_listed.begin(), long_listed.end());
  if (uses != reads || long_listed != long_reads) throw stale_uses();
}

}  // namespace jvpc
