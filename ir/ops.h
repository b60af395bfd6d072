// What jvpc knows about ATen operators, asked of the dispatcher once per operator.
//
// jvpc does not keep its own list of ops: any operator registered with the dispatcher can
// appear in a graph. This file resolves names to schemas, converts between the boxed calling
// convention (c10::IValue) and the IR's typed Args, classifies ops (view, mutating, random,
// composite) and infers output metadata by running the op on Meta tensors, with a table of
// shape rules (ir/shape_rules.cpp) for the kernels that have no Meta implementation in C++.
#pragma once

#include "ir/graph.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/FunctionRef.h>

#include <functional>

namespace jvpc {

struct OpInfo {
  std::string name;  ///< "aten::mul.Tensor"
  c10::OperatorHandle handle;
  const c10::FunctionSchema& schema() const { return handle.schema(); }
  bool is_view = false;             ///< a return may alias an input, unwritten (Tensor(a), or known: _unsafe_view, ...)
  bool mutates = false;             ///< some argument is written (Tensor(a!))
  bool seeded_random = false;       ///< tagged nondeterministic_seeded (may still be pure, see is_impure)
  bool composite_implicit = false;  ///< only a CompositeImplicitAutograd kernel: it decomposes
  // The name-keyed predicates below, for this op, so that a caller holding an OpInfo (the tracer,
  // once per recorded kernel) asks without hashing the name.
  bool allocates_uninitialized = false;      ///< allocates_uninitialized(name)
  bool reads_only_metadata_of_self = false;  ///< reads_only_metadata_of_self(name)
  bool view_scatter = false;                 ///< is_view_scatter(name)
  bool fills_self_at_random = false;         ///< fills_self_at_random(name)
  bool matmul = false;                       ///< is_matmul(counted_op_name(name))
  bool commutative = false;                  ///< its first two tensors commute (kCommutative)
};

/// The fused SDPA kernels (flash, efficient, cuDNN, CPU flash).
bool is_fused_attention(const std::string& op);
/// The ops whose FLOPs count as matmul FLOPs, as FlopCounterMode counts them (mm, addmm, bmm,
/// baddbmm, convolution, the fused attention kernels) and jvpc's attention tangent operator:
/// the one list the cost model, the printers, the CLI and the Python scripts (through
/// jvpc._C.matmul_ops) read.
const std::vector<std::string>& matmul_ops();
bool is_matmul(const std::string& op);
/// The op a kernel's FLOPs are counted under: an in-place form's functional one (baddbmm_,
/// which the runtime uses to reuse buffers, counts as baddbmm).
std::string counted_op_name(const std::string& op);
/// Whether an output's shape may depend on the operands' values, not only their shapes (lstsq's
/// residuals exist only for A of full rank; masked_select and index.Tensor with a boolean mask
/// have as many elements as the mask has true ones; cudnn_batch_norm's reserve is sized by cuDNN):
/// the graph's declared shape is trusted there. infer_outputs() gives an upper bound for
/// masked_select, index.Tensor and cudnn_batch_norm (the declared numel may not exceed it).
bool value_dependent_shape(const std::string& op, size_t output);
/// The same for a node: index.Tensor only where an index is boolean or uint8 (a mask).
bool value_dependent_shape(const Node& n, size_t output);

/// The op named "aten::name.overload". Throws jvpc::Error("unknown op ...") if there is none.
const OpInfo& op_info(const std::string& qualified_name);
const OpInfo& op_info(const c10::OperatorHandle& op);
std::string op_name(const c10::OperatorName& n);

/// Converts the boxed value `v` of schema argument `arg` to an Arg. Tensors become operands
/// through `operand` (which returns the operand index). Throws for unsupported argument types.
Arg arg_from_ivalue(const c10::Argument& arg, const c10::IValue& v, c10::function_ref<int(const at::Tensor&)> operand);

/// Whether an Arg of kind `k` may be passed for schema argument `arg`.
bool kind_matches(ArgKind k, const c10::Argument& arg);

/// The boxed value of `a`; tensor operands are looked up with `operand(i)`.
c10::IValue arg_to_ivalue(const Arg& a, c10::function_ref<at::Tensor(int)> operand);

/// The tensors among an op's boxed returns, stack[first...], and how many each return holds (a
/// tensor 1, a list its length, anything else or an undefined tensor 0): a node's outputs and
/// return counts.
std::vector<at::Tensor> unpack_returns(const std::vector<c10::IValue>& stack, size_t first, std::vector<int>& counts);

/// A tensor on the Meta device (no data) with `m`'s sizes, strides and dtype: to ask ATen about a
/// layout (is_contiguous, memory formats) or run a Meta kernel.
at::Tensor on_meta(const TensorMeta& m);

/// Ops whose result is an allocation with no contents yet (empty and its kin).
bool allocates_uninitialized(const std::string& op);
/// Ops that take their first operand's metadata but never its contents: factories *_like and
/// new_*, and ops that overwrite all of it (fill, zero, copy's self; rand_like, randn_like).
bool reads_only_metadata_of_self(const std::string& op);
/// Scatters into a view of their first operand (slice, select, diagonal): what they write of
/// it, they do not read.
bool is_view_scatter(const std::string& op);
/// Random ops that overwrite their first operand (bernoulli.p, uniform, normal_functional, ...:
/// dropout's mask, in their functional forms).
bool fills_self_at_random(const std::string& op);

/// Random ops are impure unless their dropout probability is zero.
bool is_impure(const OpInfo& info, const std::vector<Arg>& args);

/// Output metadata of the op applied to arguments `args` whose tensor operands have metadata
/// `inputs`. `return_counts` receives the count per schema return (see Node::return_counts).
/// Throws jvpc::Error naming the op when the arguments are inconsistent with it, and
/// NoShapeRule when neither a Meta kernel nor a shape rule exists.
std::vector<TensorMeta> infer_outputs(const OpInfo& info, const std::vector<Arg>& args,
                                      const std::vector<TensorMeta>& inputs, std::vector<int>* return_counts = nullptr);
/// The same with the operands given as values (their metadata is read, not copied).
std::vector<TensorMeta> infer_outputs(const OpInfo& info, const std::vector<Arg>& args,
                                      const std::vector<Value*>& inputs, std::vector<int>* return_counts = nullptr);
/// The same for an existing node: its op, arguments and operands' current metadata.
std::vector<TensorMeta> infer_outputs(const Node& n, std::vector<int>* return_counts = nullptr);

struct NoShapeRule : Error {
  using Error::Error;
};

/// The first line of an exception's message, without LibTorch's backtrace.
std::string one_line(const std::exception& e);

}  // namespace jvpc
