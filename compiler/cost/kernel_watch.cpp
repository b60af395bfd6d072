#include "compiler/cost/kernel_watch.h"

#include "compiler/cost/cost_model.h"
#include "compiler/ir/ops.h"

#include <ATen/record_function.h>

namespace jvpc {

namespace {
thread_local KernelWatch* t_watch = nullptr;
struct Entered : at::ObserverContext {
  // A convolution's FLOPs depend on its output's shape: counted when it returns.
  std::string conv;
  std::vector<std::vector<int64_t>> shapes;
  bool transposed = false;
  // A jvpc:: operator (written in ATen ops): its children's depth, to restore when it returns.
  bool opens = false;
  int outer_inner = -1;
};

}  // namespace

struct KernelWatchAccess {
  static void count(KernelWatch* w, const std::string& op, int64_t f) {
    if (f <= 0) return;
    w->matmul_flops_ += f;
    w->by_op_[op] += f;
  }
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
    bool top = w->depth_ == 0;
    // Directly inside a jvpc:: operator, whose FLOPs are those of the kernels it calls.
    bool inside_ours = w->depth_ == w->inner_;
    w->depth_++;
    if (top && !meta) w->kernels_.push_back(info->name);
    if (info->name.rfind("jvpc::", 0) == 0) {
      auto entered = std::make_unique<Entered>();
      entered->opens = true;
      entered->outer_inner = w->inner_;
      if (!meta) w->inner_ = w->depth_;
      return entered;
    }
    if ((top || inside_ours || w->nested_matmuls_) && !meta) {
      // In-place forms (baddbmm_, which the runtime uses to reuse buffers) cost what their
      // functional forms cost.
      const std::string& name = info->name;
      const size_t dot = std::min(name.find('.'), name.size());
      std::string functional = dot > 0 && name[dot - 1] == '_' ? name.substr(0, dot - 1) + name.substr(dot) : name;
      auto entered = std::make_unique<Entered>();
      if (!is_matmul(functional)) return entered;  // no FLOPs to count: no shapes to take
      std::vector<std::vector<int64_t>> shapes;
      for (const c10::IValue& v : fn.inputs()) {
        if (v.isTensor() && v.toTensor().defined())
          shapes.push_back(v.toTensor().sizes().vec());
        else if (v.isNone() || v.isTensor())
          shapes.emplace_back();
      }
      if (functional == "aten::convolution") {
        entered->conv = functional;
        entered->shapes = std::move(shapes);
        entered->transposed = fn.inputs().size() > 6 && fn.inputs()[6].isBool() && fn.inputs()[6].toBool();
        return entered;
      }
      int64_t f = -1;
      try {
        f = matmul_flops_for(functional, shapes);
      } catch (const std::exception&) {}
      count(w, functional, f);
      return entered;
    }
    return std::make_unique<Entered>();
  }
  static void end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
    KernelWatch* w = t_watch;
    if (!ctx || !w) return;
    w->depth_--;
    auto* e = static_cast<Entered*>(ctx);
    if (e->opens) w->inner_ = e->outer_inner;
    if (e->conv.empty() || fn.outputs().empty() || !fn.outputs()[0].isTensor()) return;
    int64_t f = -1;
    try {
      f = matmul_flops_for(e->conv, e->shapes, fn.outputs()[0].toTensor().sizes().vec(), e->transposed);
    } catch (const std::exception&) {}
    count(w, e->conv, f);
  }
};

KernelWatch::KernelWatch(bool nested_matmuls) : outer_(t_watch), nested_matmuls_(nested_matmuls) {
  t_watch = this;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&KernelWatchAccess::start, &KernelWatchAccess::end)
                                           .needsInputs(true)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION}));
}

KernelWatch::~KernelWatch() {
  at::removeCallback(handle_);
  t_watch = outer_;
}

}  // namespace jvpc
