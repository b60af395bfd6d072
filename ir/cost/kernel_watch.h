// KernelWatch: observes, on the calling thread, the kernels the dispatcher runs, at the level
// the tracer records and FlopCounterMode counts: ops that are not CompositeImplicitAutograd
// decompositions, called from outside any other kernel. Built on ATen's RecordFunction
// callbacks (the profiler's mechanism), so it measures what actually ran, not what a graph
// says. jvpc's own operators (jvpc::attention_tangent) are written in ATen ops: the matmul
// kernels they call directly are counted, as the kernels that did their work. Kernels run on Meta tensors (shape inference) compute nothing and are not counted. Used for linearize's measured FLOPs and to cross-check the cost model.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace jvpc {

struct OpInfo;

/// The matmul FLOPs of one kernel call by FlopCounterMode's formulas (cost_model.h): `op` as the
/// dispatcher names it (an in-place form counts as its functional form), the call's arguments
/// and its first result (a convolution's count depends on its shape). 0 for an op without matmul
/// FLOPs. What KernelWatch counts per kernel, and the tracer per kernel it records.
int64_t kernel_matmul_flops(const std::string& op, c10::ArrayRef<c10::IValue> args, const c10::IValue* first_result);
/// Makes one call of the kernel `op` (`run()`, which returns its first result, or null) and adds
/// its matmul FLOPs to `by_op`, as a KernelWatch would count them: a jvpc:: operator's are those
/// of the kernels it calls, watched while it runs; another's are kernel_matmul_flops of its
/// arguments (`args()`, asked for only where the op has matmul FLOPs) and first result.
void count_kernel_call(const OpInfo& op, c10::function_ref<const c10::IValue*()> run,
                       c10::function_ref<std::vector<c10::IValue>()> args, std::map<std::string, int64_t>& by_op);

class KernelWatch {
 public:
  /// `nested_matmuls`: also count matmul kernels called from inside another kernel. LibTorch's
  /// forward AD computes tangents inside the primal op's autograd kernel, where the default
  /// (kernel level only) would not see them; FlopCounterMode, below Autograd, does.
  explicit KernelWatch(bool nested_matmuls = false);
  ~KernelWatch();
  KernelWatch(const KernelWatch&) = delete;
  KernelWatch& operator=(const KernelWatch&) = delete;

  /// While one lives, the watch sees nothing, and nor does a watch outside it: its caller counts
  /// what runs meanwhile and adds it (linearize: the tracer counts the kernels it records, which
  /// costs a fraction of watching every dispatcher call).
  class Paused {
   public:
    explicit Paused(KernelWatch& w);
    ~Paused();
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    KernelWatch& w_;
  };
  /// Adds matmul FLOPs counted elsewhere, by op.
  void add(const std::map<std::string, int64_t>& matmul_flops_by_op);

  /// Kernel-level ops in the order they ran ("aten::bmm", "aten::mul.Scalar", ...).
  const std::vector<std::string>& kernels() const { return kernels_; }
  /// Matmul FLOPs of those kernels, by FlopCounterMode's formulas (cost_model.h).
  int64_t matmul_flops() const { return matmul_flops_; }
  const std::map<std::string, int64_t>& matmul_flops_by_op() const { return by_op_; }

 private:
  friend struct KernelWatchAccess;
  uint64_t handle_ = 0;
  KernelWatch* outer_ = nullptr;
  int depth_ = 0;
  int inner_ = -1;  // the depth of the kernels a jvpc:: operator calls, while one runs
  bool nested_matmuls_ = false;
  std::vector<std::string> kernels_;
  int64_t matmul_flops_ = 0;
  std::map<std::string, int64_t> by_op_;
};

}  // namespace jvpc
