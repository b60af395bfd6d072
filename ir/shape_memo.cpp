// The memo of shape inference (shape_memo.h).
#include "ir/shape_memo.h"

#include <c10/core/DefaultDtype.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace jvpc {

namespace {

thread_local ShapeInferenceStats t_stats;

struct Entry {
  std::vector<TensorMeta> outputs;
  std::vector<int> counts;
};

struct Memo {
  std::mutex mu;
  std::unordered_map<std::string, Entry> table;
};
Memo& memo() {
  static Memo* m = new Memo();  // never destroyed: used until the process ends
  return *m;
}

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_ints(std::string& key, const std::vector<int64_t>& v) {
  put(key, v.size());
  key.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

void put_arg(std::string& key, const Arg& a) {
  put(key, a.kind);
  switch (a.kind) {
    case ArgKind::None:
      break;
    case ArgKind::Bool:
      put(key, a.value.toBool());
      break;
    case ArgKind::Int:
    case ArgKind::ScalarType:
    case ArgKind::Layout:
    case ArgKind::MemoryFormat:
      put(key, a.value.toInt());
      break;
    case ArgKind::Float:
      put(key, a.value.toDouble());
      break;
    case ArgKind::Ints: {  // put_ints' bytes, read in place (toIntVector would copy the list)
      c10::ArrayRef<c10::IValue> list = a.value.toListRef();
      put(key, static_cast<size_t>(list.size()));
      for (const c10::IValue& i : list) put(key, i.toInt());
      break;
    }
    case ArgKind::Tensor:
    case ArgKind::TensorList:
    case ArgKind::OptTensorList:
      put(key, a.operands.size());
      key.append(reinterpret_cast<const char*>(a.operands.data()), a.operands.size() * sizeof(int));
      break;
    default: {  // strings, devices, lists of floats or bools: their printed form
      std::ostringstream os;
      os << a.value;
      std::string s = os.str();
      put(key, s.size());
      key += s;
    }
  }
}

void put_meta(std::string& key, const TensorMeta& m) {
  put_ints(key, m.sizes);
  put_ints(key, m.strides);
  put(key, m.dtype);
  put(key, m.device.type());
  put(key, m.device.index());
}

// The op, the default dtype (factories without a dtype take it) and the constant arguments.
void put_call(std::string& key, const std::string& op, const std::vector<Arg>& args) {
  key += op;
  key += '\0';
  put(key, c10::get_default_dtype_as_scalartype());
  put(key, args.size());
  for (const Arg& a : args) put_arg(key, a);
}

// Keys are built in one buffer per thread, whose capacity stays: building one allocates nothing.
// A key is used before the next is built (a memo miss copies its key before computing).
std::string& fresh_key() {
  thread_local std::string key;
  key.clear();
  return key;
}

const std::string& signature(const std::string& op, const std::vector<Arg>& args,
                             c10::ArrayRef<const TensorMeta*> inputs) {
  std::string& key = fresh_key();
  put_call(key, op, args);
  put(key, inputs.size());
  for (const TensorMeta* m : inputs) put_meta(key, *m);
  return key;
}

}  // namespace

const ShapeInferenceStats& shape_inference_stats() { return t_stats; }

namespace detail {

std::vector<TensorMeta> memoized_shapes(const std::string& op, const std::vector<Arg>& args,
                                        c10::ArrayRef<const TensorMeta*> inputs, std::vector<int>* return_counts,
                                        c10::function_ref<std::vector<TensorMeta>(std::vector<int>*)> compute) {
  ++t_stats.calls;
  Memo& m = memo();
  std::string key;
  {
    const std::string& built = signature(op, args, inputs);
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.table.find(built);
    if (it != m.table.end()) {
      if (return_counts) *return_counts = it->second.counts;
      return it->second.outputs;
    }
    key = built;  // compute() may build keys of its own
  }
  auto t0 = std::chrono::steady_clock::now();
  Entry e;
  e.outputs = compute(&e.counts);  // an error propagates, and is not memoized
  ++t_stats.computed;
  t_stats.computed_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (return_counts) *return_counts = e.counts;
  std::vector<TensorMeta> out = e.outputs;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.table.size() >= kShapeMemoCapacity) m.table.clear();
  m.table.emplace(std::move(key), std::move(e));
  return out;
}

}  // namespace detail

}  // namespace jvpc
