#include "ir/cost/kernel_watch.h"
#include "ir/op.h"

#include "ir/cost/cost_model.h"
#include "ir/ops.h"

#include <ATen/record_function.h>

#include <algorithm>

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

// The operand shapes matmul_flops_for takes: a defined tensor's sizes, an absent one's empty.
std::vector<std::vector<int64_t>> operand_shapes(c10::ArrayRef<c10::IValue> args) {
  std::vector<std::vector<int64_t>> shapes;
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined())
      shapes.push_back(v.toTensor().sizes().vec());
    else if (v.isNone() || v.isTensor())
      shapes.emplace_back();
  }
  return shapes;
}

bool transposed_convolution(c10::ArrayRef<c10::IValue> args) {
  return args.size() > 6 && args[6].isBool() && args[6].toBool();
}

int64_t flops_or_zero(const std::string& op, const std::vector<std::vector<int64_t>>& shapes,
                      const std::vector<int64_t>& out = {}, bool transposed = false) {
  try {
    return std::max<int64_t>(0, matmul_flops_for(op, shapes, out, transposed));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

int64_t kernel_matmul_flops(const std::string& op, c10::ArrayRef<c10::IValue> args, const c10::IValue* first_result) {
  std::string functional = counted_op_name(op);
  if (!is_matmul(functional)) return 0;
  if (functional != ops::convolution) return flops_or_zero(functional, operand_shapes(args));
  if (!first_result || !first_result->isTensor()) return 0;
  return flops_or_zero(functional, operand_shapes(args), first_result->toTensor().sizes().vec(),
                       transposed_convolution(args));
}

void count_kernel_call(const OpInfo& info, c10::function_ref<const c10::IValue*()> run,
                       c10::function_ref<std::vector<c10::IValue>()> args, std::map<std::string, int64_t>& by_op) {
  if (info.name.rfind("jvpc::", 0) == 0) {
    KernelWatch inside;
    run();
    for (const auto& [name, f] : inside.matmul_flops_by_op()) by_op[name] += f;
    return;
  }
  const c10::IValue* first_result = run();
  if (!info.matmul) return;
  if (int64_t f = kernel_matmul_flops(info.name, args(), first_result); f > 0) by_op[counted_op_name(info.name)] += f;
}

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
      auto entered = std::make_unique<Entered>();
      if (!info->matmul) return entered;  // no FLOPs to count: no shapes to take
      std::string functional = counted_op_name(info->name);
      if (functional == ops::convolution) {
        entered->conv = functional;
        entered->shapes = operand_shapes(fn.inputs());
        entered->transposed = transposed_convolution(fn.inputs());
        return entered;
      }
      count(w, functional, flops_or_zero(functional, operand_shapes(fn.inputs())));
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
    count(w, e->conv, flops_or_zero(e->conv, e->shapes, fn.outputs()[0].toTensor().sizes().vec(), e->transposed));
  }
  static uint64_t watch() {
    return at::addThreadLocalCallback(at::RecordFunctionCallback(&KernelWatchAccess::start, &KernelWatchAccess::end)
                                          .needsInputs(true)
                                          .needsOutputs(true)
                                          .scopes({at::RecordScope::FUNCTION}));
  }
};

KernelWatch::KernelWatch(bool nested_matmuls) : outer_(t_watch), nested_matmuls_(nested_matmuls) {
  t_watch = this;
  handle_ = KernelWatchAccess::watch();
}

KernelWatch::~KernelWatch() {
  if (handle_) at::removeCallback(handle_);
  t_watch = outer_;
}

KernelWatch::Paused::Paused(KernelWatch& w) : w_(w) {
  if (w_.handle_) at::removeCallback(w_.handle_);
  w_.handle_ = 0;
  t_watch = nullptr;  // a watch outside it, whose callback still runs, counts nothing
}

KernelWatch::Paused::~Paused() {
  t_watch = &w_;
  w_.handle_ = KernelWatchAccess::watch();
}

void KernelWatch::add(const std::map<std::string, int64_t>& matmul_flops_by_op) {
  for (const auto& [op, f] : matmul_flops_by_op) KernelWatchAccess::count(this, op, f);
}

}  // namespace jvpc
