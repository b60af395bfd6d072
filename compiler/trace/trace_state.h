// What the tracer knows about the tensors it has seen, shared by recording (tracer.cpp) and
// functionalization (functionalize.cpp): which graph value each tensor stands for, which values
// share a storage, which are computed from the inputs or allocated without contents, and the
// values kept for folding. Internal to compiler/trace.
#pragma once

#include "ir/graph.h"
#include "compiler/trace/tracer.h"

#include <c10/core/DispatchKey.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace jvpc {

/// The dispatch key whose fallback records; excluded wherever the tracer runs kernels itself
/// (shape inference runs them on Meta).
constexpr c10::DispatchKey kTraceKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

struct TraceState {
  TraceState(Graph& graph, const TraceOptions& options) : g(graph), keep_values(options.keep_values) {
    // A model's forward runs hundreds of kernels: tables that start this large are not rehashed
    // again and again as the trace grows.
    constexpr size_t kExpectedValues = 1024;
    value_of.reserve(kExpectedValues);
    by_storage.reserve(kExpectedValues);
    from_inputs.reserve(kExpectedValues);
    if (keep_values) values.reserve(kExpectedValues);
    keep.reserve(kExpectedValues);
  }

  /// The storage `t` lives in (the TensorImpl itself for a tensor without storage).
  static const void* storage_of(const at::Tensor& t) {
    return t.has_storage() ? static_cast<const void*>(t.storage().unsafeGetStorageImpl())
                           : static_cast<const void*>(t.unsafeGetTensorImpl());
  }

  /// `t` stands for `v` from now on.
  void bind(const at::Tensor& t, Value* v) {
    value_of[t.unsafeGetTensorImpl()] = v;
    by_storage[storage_of(t)].push_back({v, t.unsafeGetTensorImpl()});
    keep.push_back(t);
    if (keep_values) values[v->id()] = t;
  }

  // A tensor the trace has not produced (or whose recorded producer left it uninitialized)
  // becomes a constant holding `value`; `t` stands for it from now on.
  Value* capture(const at::Tensor& t, const at::Tensor& value) {
    std::string name;  // c0, c1, ...: fresh, whatever the inputs are called (an LSTM's c0)
    do name = "c" + std::to_string(constants++);
    while (input_names.count(name));
    Value* c = g.add_constant(name, value);
    bind(t, c);
    if (value.is_same(t)) protected_storages.emplace(storage_of(t), "");  // a copy may be written on
    return c;
  }

  /// Bookkeeping for a value the tracer built itself (not a recorded kernel's result).
  void derived(Value* v, std::initializer_list<const Value*> from) {
    for (const Value* f : from)
      if (from_inputs.count(f)) from_inputs.insert(v);
  }

  Graph& g;
  bool keep_values;
  // Open-addressing tables (LibTorch's): no allocation per entry, for the entries every
  // recorded kernel adds.
  ska::flat_hash_map<const c10::TensorImpl*, Value*> value_of;
  /// A tensor bound to a value (bind()), listed under its storage.
  struct Bound {
    Value* value;
    const c10::TensorImpl* impl;
  };
  ska::flat_hash_map<const void*, c10::SmallVector<Bound, 2>> by_storage;
  ska::flat_hash_set<const Value*> from_inputs;                    // values computed from the inputs
  ska::flat_hash_set<const Value*> uninitialized;                  // outputs of empty and its kin
  std::unordered_map<const Value*, std::string> allocated_inside;  // ... allocated by a decomposed op
  /// Storages no recorded op may write: the inputs' (-> the input's name) and the captured
  /// tensors the trace read (-> "").
  ska::flat_hash_map<const void*, std::string> protected_storages;
  /// The storages of the state inputs (TraceInput::state), which recorded ops may write.
  ska::flat_hash_set<const void*> state_storages;
  /// Value id -> tensor computed by the tracing run, when keep_values.
  TensorsById values;
  std::vector<at::Tensor> keep;  // keeps TensorImpl pointers unique for the whole trace
  int constants = 0;
  /// The traced function's inputs' names, which the constants' names (c0, c1, ...) avoid.
  std::unordered_set<std::string> input_names;
};

}  // namespace jvpc
