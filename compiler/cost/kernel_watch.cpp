#include "compiler/cost/kernel_watch.h"

#include "compiler/cost/cost_model.h"
#include "compiler/ir/ops.h"

#include <ATen/record_function.h>

namespace jvpc {

namespace {
thread_local KernelWatch* t_watch = nullptr;
struct Entered : at::ObserverContext {};
}  // namespace

struct KernelWatchAccess {
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    KernelWatch* w = t_watch;
    if (!w) return nullptr;
    auto name = fn.operator_name();
    if (!name) return nullptr;
    const OpInfo* info = nullptr;
    try {
      info = &op_info(op_name(*name));
    } catch (const Error&) {
      return nullptr;
    }
    if (info->composite_implicit) return nullptr;
    // Shape inference runs kernels on Meta tensors: nothing is computed, nothing is counted.
    bool meta = false;
    for (const c10::IValue& v : fn.inputs()) meta |= v.isTensor() && v.toTensor().defined() && v.toTensor().is_meta();
    bool top = w->depth_++ == 0;
    if (top && !meta) w->kernels_.push_back(info->name);
    if ((top || w->nested_matmuls_) && !meta) {
      std::vector<std::vector<int64_t>> shapes;
      for (const c10::IValue& v : fn.inputs()) {
        if (v.isTensor() && v.toTensor().defined()) shapes.push_back(v.toTensor().sizes().vec());
        else if (v.isNone() || v.isTensor()) shapes.emplace_back();
      }
      // In-place forms (baddbmm_, which the runtime uses to reuse buffers) cost what their
      // functional forms cost.
      auto [base, overload] = split_op_name(info->name);
      std::string functional = info->name;
      if (!base.empty() && base.back() == '_') functional = base.substr(0, base.size() - 1) + (overload.empty() ? "" : "." + overload);
      int64_t f = -1;
      try {
        f = matmul_flops_for(functional, shapes);
      } catch (const std::exception&) {
      }
      if (f > 0) {
        w->matmul_flops_ += f;
        w->by_op_[functional] += f;
      }
    }
    return std::make_unique<Entered>();
  }
  static void end(const at::RecordFunction&, at::ObserverContext* ctx) {
    if (ctx && t_watch) t_watch->depth_--;
  }
};

KernelWatch::KernelWatch(bool nested_matmuls) : outer_(t_watch), nested_matmuls_(nested_matmuls) {
  t_watch = this;
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&KernelWatchAccess::start, &KernelWatchAccess::end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

KernelWatch::~KernelWatch() {
  at::removeCallback(handle_);
  t_watch = outer_;
}

}  // namespace jvpc
