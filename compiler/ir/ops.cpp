// Operator lookup, Arg <-> IValue conversion and output-metadata inference.
#include "compiler/ir/ops.h"

#include "compiler/ir/shape_rules.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

std::vector<TensorMeta> infer_outputs(const Node& n, std::vector<int>* return_counts) {
  std::vector<TensorMeta> inputs;
  for (const Value* v : n.inputs()) inputs.push_back(v->meta());
  return infer_outputs(op_info(n.op()), n.args(), inputs, return_counts);
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

bool allocates_uninitialized(const std::string& op) {
  static const std::unordered_set<std::string> ops = {"aten::empty.memory_format", "aten::empty_strided",
                                                      "aten::empty_like",          "aten::new_empty",
                                                      "aten::new_empty_strided",   "aten::empty_permuted"};
  return ops.count(op) > 0;
}

bool reads_only_metadata_of_self(const std::string& op) {
  static const std::unordered_set<std::string> ops = {
      "aten::empty_like",        "aten::zeros_like", "aten::ones_like", "aten::full_like", "aten::new_empty",
      "aten::new_empty_strided", "aten::new_zeros",  "aten::new_ones",  "aten::new_full",  "aten::fill.Scalar",
      "aten::fill.Tensor",       "aten::zero",       "aten::copy",      "aten::rand_like", "aten::randn_like"};
  return ops.count(op) > 0;
}

bool is_view_scatter(const std::string& op) {
  return op == "aten::slice_scatter" || op == "aten::select_scatter" || op == "aten::diagonal_scatter";
}

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
  // Ops whose schema does not say so but whose result may be their input or a view of it.
  static const std::unordered_set<std::string> unmarked = {
      "aten::_unsafe_view", "aten::unsafe_split.Tensor", "aten::unsafe_split_with_sizes", "aten::unsafe_chunk",
      "aten::dropout",      "aten::feature_dropout",     "aten::alpha_dropout",           "aten::feature_alpha_dropout",
      "aten::type_as",      "aten::sum_to_size"};
  if (unmarked.count(info->name)) info->is_view = true;
  info->seeded_random = h.hasTag(at::Tag::nondeterministic_seeded);
  using K = c10::DispatchKey;
  info->composite_implicit = h.hasKernelForDispatchKey(K::CompositeImplicitAutograd) &&
                             !h.hasKernelForDispatchKey(K::CPU) && !h.hasKernelForDispatchKey(K::CUDA) &&
                             !h.hasKernelForDispatchKey(K::CompositeExplicitAutograd) &&
                             !h.hasKernelForDispatchKey(K::CompositeExplicitAutogradNonFunctional);
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

}  // namespace

const OpInfo& op_info(const std::string& qualified_name) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.by_name.find(qualified_name);
  if (it != t.by_name.end()) return *it->second;
  auto [name, overload] = split_op_name(qualified_name);
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!h) throw Error("unknown op '" + qualified_name + "'");
  auto& slot = t.by_name[qualified_name];
  slot = make_info(*h);
  t.by_schema[&h->schema()] = slot.get();
  return *slot;
}

const OpInfo& op_info(const c10::OperatorHandle& op) {
  auto& t = table();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.by_schema.find(&op.schema());
    if (it != t.by_schema.end()) return *it->second;
  }
  return op_info(op_name(op.operator_name()));
}

// --- Args -----------------------------------------------------------------------------------

namespace {

c10::TypePtr unwrap_optional(const c10::TypePtr& t, bool* optional = nullptr) {
  if (auto o = t->cast<c10::OptionalType>()) {
    if (optional) *optional = true;
    return o->getElementType();
  }
  if (optional) *optional = false;
  return t;
}

c10::TypeKind list_elem_kind(const c10::TypePtr& t, bool* elem_optional = nullptr) {
  auto l = t->cast<c10::ListType>();
  if (!l) return c10::TypeKind::AnyType;
  return unwrap_optional(l->getElementType(), elem_optional)->kind();
}

}  // namespace

Arg arg_from_ivalue(const c10::Argument& arg, const c10::IValue& v,
                    const std::function<int(const at::Tensor&)>& operand) {
  auto base = unwrap_optional(arg.real_type());
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
  if (v.isIntList()) return Arg::of_ints(v.toIntVector());
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
  auto base = unwrap_optional(arg.real_type(), &optional);
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

c10::IValue arg_to_ivalue(const Arg& a, const std::function<at::Tensor(int)>& operand) {
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

namespace {

using ShapeRule = std::function<std::vector<TensorMeta>(const std::vector<Arg>&, const std::vector<TensorMeta>&)>;

const TensorMeta& operand_meta(const std::vector<Arg>& args, size_t i, const std::vector<TensorMeta>& in) {
  if (i >= args.size() || args[i].kind != ArgKind::Tensor)
    throw Error("argument " + std::to_string(i) + " must be a tensor");
  return in.at(static_cast<size_t>(args[i].operands[0]));
}

TensorMeta like(const TensorMeta& m, std::vector<int64_t> sizes, c10::ScalarType dtype) {
  return TensorMeta::contiguous(std::move(sizes), dtype, m.device);
}

/// The metadata of a Meta tensor a shape rule made, on the device of `like`.
TensorMeta on_device_of(const at::Tensor& meta, const TensorMeta& like) {
  TensorMeta m = TensorMeta::of(meta);
  m.device = like.device;
  return m;
}

/// An elementwise result laid out like `x` where x is dense, as TensorIterator and empty_like
/// (preserve format) do it.
TensorMeta preserving_layout(const TensorMeta& x) {
  return on_device_of(at::empty_like(on_meta(x), at::MemoryFormat::Preserve), x);
}

/// A result of x's shape in x's suggested memory format (contiguous or channels-last).
TensorMeta preserving_format(const TensorMeta& x) {
  at::Tensor meta = on_meta(x);
  return on_device_of(at::empty(x.sizes, meta.options().memory_format(meta.suggest_memory_format())), x);
}

// Shape rules for kernels without a Meta implementation in C++ (PyTorch registers theirs from
// Python). Each mirrors the kernel's output allocation.
std::unordered_map<std::string, ShapeRule> make_shape_rules() {
  std::unordered_map<std::string, ShapeRule> rules = {
      {"aten::where.self",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto &c = operand_meta(a, 0, in), &x = operand_meta(a, 1, in), &y = operand_meta(a, 2, in);
         auto sizes = at::infer_size(at::infer_size(c.sizes, x.sizes), y.sizes);
         // Type promotion as the kernel does it: a 0-dim operand does not widen a dimensioned one.
         return std::vector<TensorMeta>{like(x, sizes, at::result_type(on_meta(x), on_meta(y)))};
       }},
      // where with one scalar branch (the tangent of a where with one differentiable branch).
      {"aten::where.ScalarOther",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto &c = operand_meta(a, 0, in), &x = operand_meta(a, 1, in);
         return std::vector<TensorMeta>{
             like(x, at::infer_size(c.sizes, x.sizes), at::result_type(on_meta(x), a.at(2).value.toScalar()))};
       }},
      {"aten::where.ScalarSelf",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto &c = operand_meta(a, 0, in), &y = operand_meta(a, 2, in);
         return std::vector<TensorMeta>{
             like(y, at::infer_size(c.sizes, y.sizes), at::result_type(on_meta(y), a.at(1).value.toScalar()))};
       }},
      // The math path of attention (the reference for graph files with fused kernels): its
      // composite runs _safe_softmax, which has no Meta kernel.
      {"aten::_scaled_dot_product_attention_math",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto &q = operand_meta(a, 0, in), &k = operand_meta(a, 1, in), &v = operand_meta(a, 2, in);
         if (q.sizes.size() < 2 || k.sizes.size() < 2 || v.sizes.size() < 2)
           throw Error("query, key and value need 2 dims");
         auto out = q.sizes, attn = q.sizes;
         out.back() = v.sizes.back();
         attn.back() = k.sizes[k.sizes.size() - 2];
         return std::vector<TensorMeta>{like(q, out, q.dtype), like(q, attn, q.dtype)};
       }},
      {"aten::_safe_softmax",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& x = operand_meta(a, 0, in);
         auto dt = a.size() > 2 && a[2].kind == ArgKind::ScalarType ? static_cast<c10::ScalarType>(a[2].value.toInt())
                                                                    : x.dtype;
         return std::vector<TensorMeta>{like(x, x.sizes, dt)};
       }},
      // flip keeps the input's layout where it is dense (empty_like, preserve format); roll's
      // result is contiguous.
      {"aten::flip",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& x = operand_meta(a, 0, in);
         for (int64_t d : a.at(1).value.toIntVector()) c10::maybe_wrap_dim(d, static_cast<int64_t>(x.sizes.size()));
         return std::vector<TensorMeta>{preserving_layout(x)};
       }},
      {"aten::roll",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& x = operand_meta(a, 0, in);
         auto shifts = a.at(1).value.toIntVector(), dims = a.at(2).value.toIntVector();
         if (dims.empty() ? shifts.size() != 1 : shifts.size() != dims.size())
           throw Error("shifts and dims must have the same length (or one shift and no dims)");
         for (int64_t d : dims) c10::maybe_wrap_dim(d, static_cast<int64_t>(x.sizes.size()));
         return std::vector<TensorMeta>{like(x, x.sizes, x.dtype)};
       }},
      {"aten::index_select",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& x = operand_meta(a, 0, in);
         const auto& idx = operand_meta(a, 2, in);
         auto sizes = x.sizes;
         int64_t dim = c10::maybe_wrap_dim(a.at(1).value.toInt(), static_cast<int64_t>(sizes.size()));
         sizes.at(static_cast<size_t>(dim)) = idx.numel();
         return std::vector<TensorMeta>{like(x, sizes, x.dtype)};
       }},
      {"aten::dot",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& x = operand_meta(a, 0, in);
         return std::vector<TensorMeta>{like(x, {}, x.dtype)};
       }},
      {"aten::mv",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& m = operand_meta(a, 0, in);
         if (m.sizes.size() != 2) throw Error("aten::mv: the matrix must be 2-D");
         return std::vector<TensorMeta>{like(m, {m.sizes[0]}, m.dtype)};
       }},
      {"aten::native_layer_norm",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& x = operand_meta(a, 0, in);
         auto normalized = a.at(1).value.toIntVector();
         if (normalized.size() > x.sizes.size()) throw Error("normalized_shape has more dims than the input");
         auto stat = x.sizes;
         for (size_t i = stat.size() - normalized.size(); i < stat.size(); ++i) stat[i] = 1;
         // float16/bfloat16 statistics are float32 on CUDA; the CPU kernel keeps the input's
         // dtype unless the weight or bias is of another (float32) dtype.
         auto other_dtype = [&](size_t i) {
           return a.at(i).kind == ArgKind::Tensor && operand_meta(a, i, in).dtype != x.dtype;
         };
         bool wide = c10::isReducedFloatingType(x.dtype) && (!x.device.is_cpu() || other_dtype(2) || other_dtype(3));
         auto acc = wide ? c10::kFloat : x.dtype;
         return std::vector<TensorMeta>{like(x, x.sizes, x.dtype), like(x, stat, acc), like(x, stat, acc)};
       }},
      // native_group_norm(x, w, b, N, C, HxW, group, eps): its composite fallback views x, which
      // fails for a channels-last x; the kernel keeps x's memory format. Statistics [N, group],
      // in x's dtype unless a reduced-precision x meets float32 weights (as layer norm).
      {"aten::native_group_norm",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto& x = operand_meta(a, 0, in);
         int64_t n = a.at(3).value.toInt(), c = a.at(4).value.toInt(), hw = a.at(5).value.toInt(),
                 g = a.at(6).value.toInt();
         if (x.sizes.size() < 2 || x.sizes[0] != n || x.sizes[1] != c || n * c * hw != x.numel() || g < 1 || c % g != 0)
           throw Error("N, C, HxW and group do not describe the input");
         for (size_t i : {size_t{1}, size_t{2}})
           if (a.at(i).kind == ArgKind::Tensor && operand_meta(a, i, in).sizes != std::vector<int64_t>{c})
             throw Error("weight and bias must have C elements");
         auto other_dtype = [&](size_t i) {
           return a.at(i).kind == ArgKind::Tensor && operand_meta(a, i, in).dtype != x.dtype;
         };
         auto acc = c10::isReducedFloatingType(x.dtype) && (other_dtype(1) || other_dtype(2)) ? c10::kFloat : x.dtype;
         std::vector<int64_t> stat = {n, g};
         return std::vector<TensorMeta>{preserving_format(x), like(x, stat, acc), like(x, stat, acc)};
       }},
      // convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups); a
      // list of one entry applies to every spatial dim. The result is channels-last when x or w
      // is (as mkldnn and cuDNN choose), else contiguous.
      {"aten::convolution",
       [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
         const auto &x = operand_meta(a, 0, in), &w = operand_meta(a, 1, in);
         if (x.sizes.size() < 3 || w.sizes.size() != x.sizes.size())
           throw Error("input and weight need the same rank, 3 or more");
         size_t space = x.sizes.size() - 2;
         auto at_dim = [&](size_t arg, size_t d) {
           auto v = a.at(arg).value.toIntVector();
           if (v.size() != 1 && v.size() != space)
             throw Error("stride, padding and dilation need 1 or " + std::to_string(space) + " entries");
           return v.size() == 1 ? v[0] : v[d];
         };
         bool transposed = a.at(6).value.toBool();
         int64_t groups = a.at(8).value.toInt();
         std::vector<int64_t> out = {x.sizes[0], transposed ? w.sizes[1] * groups : w.sizes[0]};
         for (size_t d = 0; d < space; ++d) {
           int64_t in = x.sizes[d + 2], k = w.sizes[d + 2], s = at_dim(3, d), p = at_dim(4, d), dl = at_dim(5, d);
           if (s < 1 || dl < 1 || p < 0) throw Error("stride and dilation must be positive and padding not negative");
           if (!transposed && dl * (k - 1) + 1 > in + 2 * p) throw Error("the kernel is larger than the padded input");
           out.push_back(transposed ? (in - 1) * s - 2 * p + dl * (k - 1) + at_dim(7, d) + 1
                                    : (in + 2 * p - dl * (k - 1) - 1) / s + 1);
           if (out.back() < 1) throw Error("the output would have no elements along spatial dim " + std::to_string(d));
         }
         auto format = on_meta(x).suggest_memory_format();
         if (format == at::MemoryFormat::Contiguous) format = on_meta(w).suggest_memory_format();
         return std::vector<TensorMeta>{on_device_of(at::empty(out, on_meta(x).options().memory_format(format)), x)};
       }},
  };
  // Elementwise kernels of one operand's shape and dtype (the backward kernels read a gradient
  // of the operand's shape): the result is laid out like operand 0, as TensorIterator does it
  // for a dense operand.
  // abs of a complex operand is real.
  for (const char* op : {"aten::relu", "aten::abs", "aten::hardtanh_backward", "aten::hardswish_backward",
                         "aten::log_sigmoid_backward", "aten::binary_cross_entropy_backward", "aten::_conj_physical"})
    rules.emplace(op,
                  [abs = std::string(op) == "aten::abs"](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
                    TensorMeta out = preserving_layout(operand_meta(a, 0, in));
                    if (abs) out.dtype = c10::toRealValueType(out.dtype);
                    return std::vector<TensorMeta>{out};
                  });
  // ... and some that allocate their result contiguous whatever the operand's layout (index_add's
  // C++ Meta kernel also fails on an empty index: found by a probe).
  for (const char* op :
       {"aten::smooth_l1_loss_backward", "aten::huber_loss_backward", "aten::linalg_matrix_exp", "aten::index_add"})
    rules.emplace(op, [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
      const auto& x = operand_meta(a, 0, in);
      return std::vector<TensorMeta>{like(x, x.sizes, x.dtype)};
    });
  // linalg_solve_triangular(A, B, ...), cholesky_solve(B, L, upper): B's matrix shape over the
  // broadcast batch, each matrix column-major (as LAPACK writes it).
  for (auto [op, matrix] : {std::pair{"aten::linalg_solve_triangular", 0}, std::pair{"aten::cholesky_solve", 1}})
    rules.emplace(op,
                  [matrix = static_cast<size_t>(matrix)](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
                    const auto &A = operand_meta(a, matrix, in), &B = operand_meta(a, 1 - matrix, in);
                    if (A.sizes.size() < 2 || B.sizes.size() < 2)
                      throw Error("the matrix and the right-hand side must be matrices or batches of them");
                    auto batch = at::infer_size(c10::IntArrayRef(A.sizes).slice(0, A.sizes.size() - 2),
                                                c10::IntArrayRef(B.sizes).slice(0, B.sizes.size() - 2));
                    std::vector<int64_t> transposed = batch;
                    transposed.insert(transposed.end(), {B.sizes.end()[-1], B.sizes.end()[-2]});
                    return std::vector<TensorMeta>{on_device_of(at::empty(transposed, on_meta(B).options()).mT(), B)};
                  });
  // linalg_pinv(A, atol, rtol, hermitian): [.., n, m], contiguous (in C++ the Meta path is missing).
  rules.emplace("aten::linalg_pinv.atol_rtol_tensor", [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
    const auto& A = operand_meta(a, 0, in);
    if (A.sizes.size() < 2) throw Error("the input must be a matrix or a batch of them");
    std::vector<int64_t> sizes = A.sizes;
    std::swap(sizes.end()[-1], sizes.end()[-2]);
    return std::vector<TensorMeta>{like(A, sizes, A.dtype)};
  });
  // linalg_lstsq(A, B, rcond, driver) -> (solution, residuals, rank, singular_values), as LAPACK
  // leaves them: each solution column-major in a buffer of max(m, n) rows, narrowed to n.
  // Residuals exist for m > n with a driver other than gelsy, and A of full rank, which this
  // rule assumes; the graph's declared shape is trusted there (value_dependent_shape).
  rules.emplace("aten::linalg_lstsq", [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
    const auto &A = operand_meta(a, 0, in), &B = operand_meta(a, 1, in);
    if (A.sizes.size() < 2) throw Error("the input must be a matrix or a batch of them");
    bool vector = B.sizes.size() + 1 == A.sizes.size();
    if (B.sizes.size() < (vector ? 1 : 2))
      throw Error("the right-hand side must be a vector, a matrix or a batch of them");
    int64_t m = A.sizes.end()[-2], n = A.sizes.back(), k = vector ? 1 : B.sizes.back();
    if ((vector ? B.sizes.back() : B.sizes.end()[-2]) != m) throw Error("A and B must have the same number of rows");
    auto batch = at::infer_size(c10::IntArrayRef(A.sizes).slice(0, A.sizes.size() - 2),
                                c10::IntArrayRef(B.sizes).slice(0, B.sizes.size() - (vector ? 1 : 2)));
    auto with = [&](std::vector<int64_t> tail) {
      std::vector<int64_t> s = batch;
      s.insert(s.end(), tail.begin(), tail.end());
      return s;
    };
    auto options = on_meta(A).options();
    at::Tensor X = vector ? at::empty(with({std::max(m, n)}), options).narrow(-1, 0, n)
                          : at::empty(with({k, std::max(m, n)}), options).mT().narrow(-2, 0, n);
    std::string driver =
        a.at(3).kind == ArgKind::None ? (A.device.is_cpu() ? "gelsy" : "gels") : a.at(3).value.toStringRef();
    bool residuals = m > n && driver != "gelsy", singular = driver == "gelsd" || driver == "gelss";
    std::vector<TensorMeta> out = {on_device_of(X, A),
                                   like(A, residuals ? with({k}) : std::vector<int64_t>{0}, A.dtype),
                                   like(A, driver == "gels" ? std::vector<int64_t>{0} : batch, c10::kLong),
                                   like(A, singular ? with({std::min(m, n)}) : std::vector<int64_t>{0}, A.dtype)};
    return out;
  });
  // grid_sampler_{2,3}d_backward(grad, input, grid, ..., output_mask): gradients of input and grid,
  // contiguous.
  for (const char* op : {"aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward"})
    rules.emplace(op, [](const std::vector<Arg>& a, const std::vector<TensorMeta>& in) {
      const auto &x = operand_meta(a, 1, in), &grid = operand_meta(a, 2, in);
      return std::vector<TensorMeta>{like(x, x.sizes, x.dtype), like(grid, grid.sizes, grid.dtype)};
    });
  detail::add_shape_rules(rules);  // compiler/ir/shape_rules.cpp
  return rules;
}

const std::unordered_map<std::string, ShapeRule>& shape_rules() {
  static const std::unordered_map<std::string, ShapeRule> rules = make_shape_rules();
  return rules;
}

}  // namespace

bool value_dependent_shape(const std::string& op, size_t output) {
  return (op == "aten::linalg_lstsq" && output == 1) || (op == "aten::cudnn_batch_norm" && output == 3) ||
         ((op == "aten::masked_select" || op == "aten::index.Tensor") && output == 0);
}

bool value_dependent_shape(const Node& n, size_t output) {
  if (n.op() != "aten::index.Tensor") return value_dependent_shape(n.op(), output);
  // index.Tensor depends on values only with a boolean (or uint8) mask among its indices.
  if (output != 0 || n.args().size() < 2) return false;
  for (int o : n.arg(1).operands)
    if (o >= 0 && static_cast<size_t>(o) < n.inputs().size()) {
      auto t = n.input(static_cast<size_t>(o))->meta().dtype;
      if (t == c10::kBool || t == c10::kByte) return true;
    }
  return false;
}

bool is_fused_attention(const std::string& op) {
  return op == "aten::_scaled_dot_product_flash_attention_for_cpu" ||
         op == "aten::_scaled_dot_product_flash_attention" || op == "aten::_scaled_dot_product_efficient_attention" ||
         op == "aten::_scaled_dot_product_cudnn_attention";
}

std::vector<TensorMeta> infer_outputs(const OpInfo& info, const std::vector<Arg>& args,
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
  // caller's linearize) must not see its kernels on Meta tensors.
  c10::impl::ExcludeDispatchKeyGuard no_python_modes(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
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
  auto rule = shape_rules().find(info.name);
  if (rule != shape_rules().end()) {
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
