// LibTorch's own profiler (Kineto), reduced to the kernel level the tracer records: events of
// ops that are not CompositeImplicitAutograd decompositions and are not inside another such
// event. Nesting is recovered from time intervals on the calling thread, as PyTorch's Python
// profiler does. (The peak of a call's allocations: ir/cost/peak_bytes.h.)
#pragma once

#include "ir/ops.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace jvpc::test {

struct ProfiledKernel {
  std::string op;  // "aten::mul.Scalar"
  int64_t flops;   // the profiler's own FLOP count (with_flops)
};

// The profiler records op names without overloads, and the type of each argument ("float",
// "Scalar", "ScalarList", "" for None). The overload is the schema those types fit.
inline bool fits(const c10::FunctionSchema& s, const std::vector<std::string>& types) {
  if (s.arguments().size() != types.size()) return false;
  for (size_t i = 0; i < types.size(); ++i) {
    const auto& arg = s.arguments()[i];
    bool optional = arg.real_type()->kind() == c10::TypeKind::OptionalType;
    auto base = optional ? arg.real_type()->castRaw<c10::OptionalType>()->getElementType() : arg.real_type();
    const std::string& t = types[i];
    bool tensor = base->kind() == c10::TypeKind::TensorType;
    bool list = base->kind() == c10::TypeKind::ListType;
    bool scalar_like = t == "Scalar" || t == "ScalarList";
    if (t.empty() && !optional && tensor) return false;
    if (!t.empty() && tensor == scalar_like) return false;
    if ((t == "ScalarList") != (list && !tensor && scalar_like)) return false;
    if (base->kind() == c10::TypeKind::StringType && t == "Scalar") return false;  // e.g. select.Dimname
  }
  return true;
}

inline std::string resolve_overload(const std::string& name, const std::vector<std::string>& types) {
  std::vector<std::string> fit;
  for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
    if (n.name != name) continue;
    const OpInfo& info = op_info(op_name(n));
    if (!info.mutates || name.back() == '_')  // out= overloads never run here
      if (fits(info.schema(), types)) fit.push_back(info.name);
  }
  if (fit.empty()) return name;
  // Several overloads may fit (int and float scalars look alike): any one that decomposes
  // the same way will do, and the traced name is preferred when it is among them.
  return fit.front();
}

inline std::vector<ProfiledKernel> profile_kernels(const std::function<void()>& fn) {
  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  impl::ProfilerConfig cfg(impl::ProfilerState::KINETO, /*report_input_shapes=*/true, false, false,
                           /*with_flops=*/true);
  prof::prepareProfiler(cfg, {impl::ActivityType::CPU});
  prof::enableProfiler(cfg, {impl::ActivityType::CPU}, {at::RecordScope::FUNCTION});
  fn();
  auto result = prof::disableProfiler();
  uint64_t me = at::RecordFunction::currentThreadId();
  struct Ev {
    uint64_t start, end;
    std::string op;
    int64_t flops;
  };
  std::vector<Ev> evs;
  for (const auto& e : result->events()) {
    if (e.startThreadId() != me || e.deviceType() != c10::DeviceType::CPU) continue;
    std::string name = e.name();
    if (name.rfind("aten::", 0) != 0) continue;
    std::vector<std::string> types(e.dtypes().begin(), e.dtypes().end());
    evs.push_back({e.startNs(), e.endNs(), resolve_overload(name, types), static_cast<int64_t>(e.flops())});
  }
  std::stable_sort(evs.begin(), evs.end(),
                   [](const Ev& a, const Ev& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; });
  std::vector<ProfiledKernel> out;
  std::vector<uint64_t> open_kernels;  // end times of enclosing kernel-level events
  for (const Ev& e : evs) {
    while (!open_kernels.empty() && open_kernels.back() < e.end) open_kernels.pop_back();
    if (!open_kernels.empty()) continue;             // inside a kernel: its internals
    if (op_info(e.op).composite_implicit) continue;  // a decomposition: what it calls is kernel level
    out.push_back({e.op, e.flops});
    open_kernels.push_back(e.end);
  }
  return out;
}

}  // namespace jvpc::test
