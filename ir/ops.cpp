// Operator lookup, Arg <-> IValue conversion and output-metadata inference.
#include "ir/ops.h"
#include "ir/op.h"

#include "ir/op_contracts.h"
#include "ir/shape_memo.h"
#include "ir/shape_rules.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

std::vector<TensorMeta> infer_outputs(const Node& n, std::vector<int>* return_counts) {
  return infer_outputs(op_info(n.op()), n.args(), n.inputs(), return_counts);
}

std::string one_line(const std::exception& e) {
  std::string msg;
  if (auto* ce = dynamic_cast<const c10::Error*>(&e))
    msg = ce->what_without_backtrace();
  else
    msg = e.what();
  auto nl = msg.find('\n');
  if (nl != std::string::npos) msg = msg.substr(0, nl);
  return msg;
}

bool allocates_uninitialized(const std::string& op) { return Op::find(op).has(kAllocatesUninitialized); }

bool reads_only_metadata_of_self(const std::string& op) { return Op::find(op).has(kReadsOnlyMetadataOfSelf); }

bool is_view_scatter(const std::string& op) { return Op::find(op).has(kViewScatter); }

bool fills_self_at_random(const std::string& op) { return Op::find(op).has(kFillsSelfAtRandom); }

std::string op_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

namespace {

bool alias_written(const c10::AliasInfo* a) {
  if (!a) return false;
  if (a->isWrite()) return true;
  for (const auto& c : a->containedTypes())
    if (alias_written(&c)) return true;
  return false;
}

std::unique_ptr<OpInfo> make_info(const c10::OperatorHandle& h) {
  auto info = std::make_unique<OpInfo>(OpInfo{op_name(h.operator_name()), h});
  const auto& s = h.schema();
  for (const auto& a : s.arguments())
    if (alias_written(a.alias_info())) info->mutates = true;
  for (const auto& r : s.returns())
    if (r.alias_info() && !alias_written(r.alias_info())) info->is_view = true;
  const Op op = Op::find(info->name);
  if (op.has(kUnmarkedView)) info->is_view = true;
  info->seeded_random = h.hasTag(at::Tag::nondeterministic_seeded);
  using K = c10::DispatchKey;
  info->composite_implicit = h.hasKernelForDispatchKey(K::CompositeImplicitAutograd) &&
                             !h.hasKernelForDispatchKey(K::CPU) && !h.hasKernelForDispatchKey(K::CUDA) &&
                             !h.hasKernelForDispatchKey(K::CompositeExplicitAutograd) &&
                             !h.hasKernelForDispatchKey(K::CompositeExplicitAutogradNonFunctional);
  info->allocates_uninitialized = op.has(kAllocatesUninitialized);
  info->reads_only_metadata_of_self = op.has(kReadsOnlyMetadataOfSelf);
  info->view_scatter = op.has(kViewScatter);
  info->fills_self_at_random = op.has(kFillsSelfAtRandom);
  info->commutative = op.has(kCommutative);
  info->matmul = is_matmul(counted_op_name(info->name));
  return info;
}

struct OpTable {
  std::mutex mu;
  std::unordered_map<std::string, std::unique_ptr<OpInfo>> by_name;
  std::unordered_map<const void*, const OpInfo*> by_schema;
};
OpTable& table() {
  static OpTable* t = new OpTable();  // never destroyed: handles outlive static teardown
  return *t;
}

// The passes ask for the same nodes' ops again and again, and the tracer for the same kernels':
// a per-thread cache of recent answers, keyed by an address (where a name lives, a schema), one
// slot of 256 per address, answers most calls without the lock or a hash. (OpInfos are never
// destroyed.)
template <typename Key>
std::pair<const Key*, const OpInfo*>& recent_slot(const Key* key) {
  constexpr size_t kSlots = 256;
  thread_local std::pair<const Key*, const OpInfo*> recent[kSlots] = {};
  return recent[(reinterpret_cast<uintptr_t>(key) >> 4) % kSlots];
}

}  // namespace

const OpInfo& op_info(const std::string& qualified_name) {
  // A name's slot is checked against the name itself: another string may live there now.
  auto& slot_of_name = recent_slot(&qualified_name);
  if (slot_of_name.first == &qualified_name && slot_of_name.second->name == qualified_name) return *slot_of_name.second;
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.by_name.find(qualified_name);
  if (it != t.by_name.end()) {
    slot_of_name = {&qualified_name, it->second.get()};
    return *it->second;
  }
  auto [name, overload] = split_op_name(qualified_name);
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!h) throw Error("unknown op '" + qualified_name + "'");
  auto& slot = t.by_name[qualified_name];
  slot = make_info(*h);
  t.by_schema[&h->schema()] = slot.get();
  return *slot;
}

const OpInfo& op_info(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* schema = &op.schema();
  auto& slot = recent_slot(schema);
  if (slot.first == schema) return *slot.second;
  auto& t = table();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.by_schema.find(schema);
    if (it != t.by_schema.end()) {
      slot = {schema, it->second};
      return *it->second;
    }
  }
  const OpInfo& info = op_info(op_name(op.operator_name()));
  slot = {schema, &info};
  return info;
}

// --- Args -----------------------------------------------------------------------------------

namespace {

// Raw pointers into the schema's types: they live as long as the schema, and reading them takes
// no reference counts (every traced call and every verified node asks).
const c10::Type* unwrap_optional(const c10::Type* t, bool* optional = nullptr) {
  if (auto o = t->castRaw<c10::OptionalType>()) {
    if (optional) *optional = true;
    return o->getElementType().get();
  }
  if (optional) *optional = false;
  return t;
}

c10::TypeKind list_elem_kind(const c10::Type* t, bool* elem_optional = nullptr) {
  auto l = t->castRaw<c10::ListType>();
  if (!l) return c10::TypeKind::AnyType;
  return unwrap_optional(l->getElementType().get(), elem_optional)->kind();
}

}  // namespace

Arg arg_from_ivalue(const c10::Argument& arg, const c10::IValue& v, c10::function_ref<int(const at::Tensor&)> operand) {
  const c10::Type* base = unwrap_optional(arg.real_type().get());
  auto unsupported = [&]() {
    return Error("argument '" + arg.name() + "' of type " + arg.real_type()->str() + " (value tag " + v.tagKind() +
                 ") is not supported");
  };
  if (v.isNone()) return Arg::none();
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return Arg::none();
    return Arg::tensor(operand(t));
  }
  if (v.isTensorList()) {
    Arg a{ArgKind::TensorList, {}, {}};
    for (const at::Tensor& t : v.toTensorVector()) {
      if (!t.defined()) throw unsupported();
      a.operands.push_back(operand(t));
    }
    return a;
  }
  if (v.isBool()) return Arg::of_bool(v.toBool());
  if (v.isDouble()) return Arg::of_float(v.toDouble());
  if (v.isInt() || v.isSymInt()) {
    int64_t i = v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__);
    switch (base->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return Arg{ArgKind::ScalarType, i, {}};
      case c10::TypeKind::LayoutType:
        return Arg{ArgKind::Layout, i, {}};
      case c10::TypeKind::MemoryFormatType:
        return Arg{ArgKind::MemoryFormat, i, {}};
      default:
        return Arg::of_int(i);
    }
  }
  if (v.isString()) return Arg::of_str(v.toStringRef());
  if (v.isDevice()) return Arg::of_device(v.toDevice());
  if (v.isIntList()) return Arg{ArgKind::Ints, v, {}};  // the list itself: no copy in and out of a vector
  if (v.isDoubleList()) return Arg{ArgKind::Floats, v, {}};
  if (v.isBoolList()) return Arg{ArgKind::Bools, v, {}};
  if (v.isList()) {
    bool elem_optional = false;
    auto elem = list_elem_kind(base, &elem_optional);
    if (elem == c10::TypeKind::TensorType) {
      Arg a{elem_optional ? ArgKind::OptTensorList : ArgKind::TensorList, {}, {}};
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isNone() || (e.isTensor() && !e.toTensor().defined())) {
          if (!elem_optional) throw unsupported();
          a.operands.push_back(-1);
        } else if (e.isTensor()) {
          a.operands.push_back(operand(e.toTensor()));
        } else {
          throw unsupported();
        }
      }
      return a;
    }
    if (elem == c10::TypeKind::IntType || elem == c10::TypeKind::SymIntType) {
      std::vector<int64_t> ints;
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isInt())
          ints.push_back(e.toInt());
        else if (e.isSymInt())
          ints.push_back(e.toSymInt().guard_int(__FILE__, __LINE__));
        else
          throw unsupported();
      }
      return Arg::of_ints(std::move(ints));
    }
  }
  throw unsupported();
}

bool kind_matches(ArgKind k, const c10::Argument& arg) {
  bool optional = false;
  const c10::Type* base = unwrap_optional(arg.real_type().get(), &optional);
  auto kind = base->kind();
  bool elem_optional = false;
  auto elem = list_elem_kind(base, &elem_optional);
  using T = c10::TypeKind;
  switch (k) {
    case ArgKind::None:
      return optional || kind == T::NoneType;
    case ArgKind::Tensor:
      return kind == T::TensorType;
    case ArgKind::TensorList:
      return elem == T::TensorType && !elem_optional;
    case ArgKind::OptTensorList:
      return elem == T::TensorType && elem_optional;
    case ArgKind::Bool:
      return kind == T::BoolType || kind == T::NumberType || kind == T::SymBoolType;
    case ArgKind::Int:
      return kind == T::IntType || kind == T::SymIntType || kind == T::NumberType;
    case ArgKind::Float:
      return kind == T::FloatType || kind == T::NumberType || kind == T::SymFloatType;
    case ArgKind::Str:
      return kind == T::StringType;
    case ArgKind::Ints:
      return elem == T::IntType || elem == T::SymIntType;
    case ArgKind::Floats:
      return elem == T::FloatType;
    case ArgKind::Bools:
      return elem == T::BoolType;
    case ArgKind::ScalarType:
      return kind == T::ScalarTypeType;
    case ArgKind::Layout:
      return kind == T::LayoutType;
    case ArgKind::MemoryFormat:
      return kind == T::MemoryFormatType;
    case ArgKind::Device:
      return kind == T::DeviceObjType;
  }
  return false;
}

c10::IValue arg_to_ivalue(const Arg& a, c10::function_ref<at::Tensor(int)> operand) {
  switch (a.kind) {
    case ArgKind::None:
      return c10::IValue();
    case ArgKind::Tensor:
      return operand(a.operands.at(0));
    case ArgKind::TensorList: {
      c10::List<at::Tensor> l;
      for (int o : a.operands) l.push_back(operand(o));
      return l;
    }
    case ArgKind::OptTensorList: {
      c10::List<std::optional<at::Tensor>> l;
      for (int o : a.operands) l.push_back(o < 0 ? std::optional<at::Tensor>() : std::optional<at::Tensor>(operand(o)));
      return l;
    }
    default:
      return a.value;
  }
}

bool is_impure(const OpInfo& info, const std::vector<Arg>& args) {
  if (!info.seeded_random) return false;
  const auto& schema = info.schema().arguments();
  for (size_t i = 0; i < args.size() && i < schema.size(); ++i) {
    const auto& name = schema[i].name();
    if ((name == "dropout_p" || name == "p") && args[i].kind == ArgKind::Float && args[i].value.toDouble() == 0.0)
      return false;
    if (name == "train" && args[i].kind == ArgKind::Bool && !args[i].value.toBool()) return false;
  }
  return true;
}

// --- Output metadata ------------------------------------------------------------------------

bool value_dependent_shape(const std::string& op, size_t output) {
  return (op == ops::linalg_lstsq && output == 1) || (op == ops::cudnn_batch_norm && output == 3) ||
         ((op == ops::masked_select || op == ops::index_Tensor) && output == 0);
}

bool value_dependent_shape(const Node& n, size_t output) {
  if (!n.is(ops::index_Tensor)) return value_dependent_shape(n.op(), output);
  // index.Tensor depends on values only with a boolean (or uint8) mask among its indices.
  if (output != 0 || n.args().size() < 2) return false;
  for (int o : n.arg(1).operands)
    if (o >= 0 && static_cast<size_t>(o) < n.inputs().size()) {
      auto t = n.input(static_cast<size_t>(o))->meta().dtype;
      if (t == c10::kBool || t == c10::kByte) return true;
    }
  return false;
}

bool is_fused_attention(const std::string& op) { return Op::find(op).has(kFusedAttention); }

const std::vector<std::string>& matmul_ops() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (Op op : Op::all())
      if (op.has(kMatmul)) out.push_back(op.name());
    return out;
  }();
  return names;
}

bool is_matmul(const std::string& op) { return Op::find(op).has(kMatmul); }

// The position of the '_' that makes `name` an in-place op's ("aten::add_.Tensor"), or npos.
static size_t inplace_underscore(const std::string& name) {
  const size_t dot = std::min(name.find('.'), name.size());
  return dot > 0 && name[dot - 1] == '_' ? dot - 1 : std::string::npos;
}

std::string counted_op_name(const std::string& name) {
  const size_t u = inplace_underscore(name);
  return u == std::string::npos ? name : name.substr(0, u) + name.substr(u + 1);
}

namespace {

std::vector<TensorMeta> infer_outputs_uncached(const OpInfo& info, const std::vector<Arg>& args,
                                               const std::vector<TensorMeta>& inputs, std::vector<int>* return_counts) {
  const auto& schema = info.schema();
  if (args.size() != schema.arguments().size())
    throw Error(info.name + " takes " + std::to_string(schema.arguments().size()) + " arguments, got " +
                std::to_string(args.size()));
  // The device of the result: an explicit device argument, else the first tensor operand's.
  c10::Device device = inputs.empty() ? c10::Device(c10::kCPU) : inputs[0].device;
  for (const Arg& a : args)
    if (a.kind == ArgKind::Device) device = a.value.toDevice();

  // Shape inference computes nothing: Python dispatch modes (FlopCounterMode around a Python
  // caller's linearize) must not see its kernels on Meta tensors. Nor may functorch's layers:
  // inside a vmap rule (vmap(jvp_fn) compiling the batched graph on its first call) they would
  // restore the dispatch keys saved when the vmap began, the Python mode's among them.
  c10::impl::ExcludeDispatchKeyGuard no_python_modes(c10::DispatchKeySet(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
       c10::DispatchKey::FuncTorchDynamicLayerBackMode}));
  check_arguments(info.name, args, inputs);  // values no kernel, Meta kernels included, survives (op_contracts.h)
  std::vector<at::Tensor> metas;
  metas.reserve(inputs.size());
  for (const TensorMeta& m : inputs) {
    m.numel();  // rejects negative and overflowing sizes before ATen sees them
    metas.push_back(on_meta(m));
  }
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i) {
    const Arg& a = args[i];
    if (a.kind == ArgKind::Device ||
        (a.kind == ArgKind::None && inputs.empty() && schema.arguments()[i].name() == "device")) {
      stack.emplace_back(c10::Device(c10::kMeta));
    } else {
      stack.push_back(arg_to_ivalue(a, [&](int o) { return metas.at(static_cast<size_t>(o)); }));
    }
  }
  std::vector<TensorMeta> out;
  std::vector<int> counts;
  // jvpc's own rule where it has one (the op has no Meta kernel in C++, or one that fails on
  // some layouts), else the Meta kernel.
  auto rule = detail::shape_rules().find(info.name);
  if (rule != detail::shape_rules().end()) {
    try {
      out = rule->second(args, inputs);
    } catch (const std::exception& e) {  // inconsistent shapes (c10::Error), bad dims (std::out_of_range)
      throw Error(info.name + ": " + one_line(e));
    }
    // One entry per schema return; one that gives no tensor (an int, an undefined tensor) is absent.
    std::vector<int> rule_counts;
    std::vector<TensorMeta> tensors;
    for (TensorMeta& m : out) {
      rule_counts.push_back(detail::is_absent(m) ? 0 : 1);
      if (!detail::is_absent(m)) tensors.push_back(std::move(m));
    }
    if (return_counts) *return_counts = std::move(rule_counts);
    return tensors;
  }
  try {
    info.handle.callBoxed(stack);
  } catch (const c10::NotImplementedError&) {
    throw NoShapeRule("no shape rule for " + info.name);
  } catch (const c10::Error& e) {
    throw Error(info.name + ": " + one_line(e));
  }
  for (const at::Tensor& t : unpack_returns(stack, 0, counts)) {
    TensorMeta m = TensorMeta::of(t);
    m.device = device;
    out.push_back(std::move(m));
  }
  if (return_counts) *return_counts = std::move(counts);
  return out;
}

}  // namespace

std::vector<TensorMeta> infer_outputs(const OpInfo& info, const std::vector<Arg>& args,
                                      const std::vector<TensorMeta>& inputs, std::vector<int>* return_counts) {
  c10::SmallVector<const TensorMeta*, 8> metas;
  for (const TensorMeta& m : inputs) metas.push_back(&m);
  return detail::memoized_shapes(info.name, args, metas, return_counts, [&](std::vector<int>* counts) {
    return infer_outputs_uncached(info, args, inputs, counts);
  });
}

std::vector<TensorMeta> infer_outputs(const OpInfo& info, const std::vector<Arg>& args,
                                      const std::vector<Value*>& inputs, std::vector<int>* return_counts) {
  c10::SmallVector<const TensorMeta*, 8> metas;
  for (const Value* v : inputs) metas.push_back(&v->meta());
  return detail::memoized_shapes(info.name, args, metas, return_counts, [&](std::vector<int>* counts) {
    std::vector<TensorMeta> copies;  // a signature not seen before: inference reads copies
    for (const TensorMeta* m : metas) copies.push_back(*m);
    return infer_outputs_uncached(info, args, copies, counts);
  });
}

std::vector<at::Tensor> unpack_returns(const std::vector<c10::IValue>& stack, size_t first, std::vector<int>& counts) {
  std::vector<at::Tensor> results;
  counts.clear();
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& r = stack[i];
    if (r.isTensor() && r.toTensor().defined()) {
      results.push_back(r.toTensor());
      counts.push_back(1);
    } else if (r.isTensorList()) {
      auto l = r.toTensorVector();
      results.insert(results.end(), l.begin(), l.end());
      counts.push_back(static_cast<int>(l.size()));
    } else {
      counts.push_back(0);
    }
  }
  return results;
}

at::Tensor on_meta(const TensorMeta& m) {
  return at::empty_strided(m.sizes, m.strides, at::TensorOptions().dtype(m.dtype).device(c10::kMeta));
}

}  // namespace jvpc
