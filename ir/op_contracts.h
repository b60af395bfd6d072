// The safety contract of each op a graph file may use: what the op does with its arguments beyond
// their shapes, which a graph from a stranger must not abuse. The list of loadable ops
// (loadable_ops.h) says which ops may appear; the contracts say what each may do:
//
//  - Index arguments: tensors whose values address elements of another argument (gather's
//    index, embedding's indices, embedding_bag's offsets, max_pool's indices, LU pivots), with
//    their valid range, computed from the shapes of the tensors actually passed. Several
//    kernels trust these values (max_pool2d_with_indices_backward writes wherever its indices
//    say), and on CUDA the others stop the device with an assert. The runtime checks them before
//    the kernel runs, on every device, for values the graph computes as well as for constants;
//    the loader checks stored constants once more on the CPU. A value out of range is a
//    one-line error naming the node, the argument and the range, never the values.
//  - Storage-relative ops: ops that address their operand's storage by absolute offsets
//    (as_strided) or copy all of it (copy and the *_scatter ops clone self's whole storage, gaps
//    included). LibTorch keeps them inside the storage; the runtime gives a graph with such an
//    op only inputs that own their storage (a view of a larger buffer is copied first), so they
//    stay inside the tensors actually passed, and their offsets mean what they meant when traced.
//  - Arguments: values of int and scalar arguments, and ranks of operands, that LibTorch's
//    kernels, Meta kernels included, do not survive (arange's size computed with int64
//    overflow: SIGFPE; a padding list shorter than reflection_pad3d reads; embedding_bag's
//    indices of two dims). Shape inference refuses them before any kernel sees them
//    (infer_outputs in ops.h).
//  - Workspace: memory the kernel allocates beyond its outputs (mvlgamma's [numel, p]
//    temporary, a loss's elementwise terms before the reduction, operands a kernel makes
//    contiguous), counted by the memory limits with the node's peak (limits.h).
//
// Every op on the list has a contract (a test checks it; passes/loadable_ops.cpp refuses the
// ops whose contract would be complicated, with the reason). An op without one is refused in an
// untrusted graph. FLOPs, the time limit's measure, are the cost model's (ir/cost).
#pragma once

#include "ir/graph.h"

#include <ATen/core/stack.h>
#include <c10/util/FunctionRef.h>

#include <string>
#include <vector>

namespace jvpc {

/// How the valid range of an index argument follows from the tensors passed.
enum class IndexRange {
  Dim,        ///< [0, size of `of` along `dim`) ([-size, size) where negative indices wrap)
  Plane,      ///< [0, numel of the last `trailing` dims of `of`) (max_pool's flat indices)
  Offsets,    ///< [0, numel of `of`], non-decreasing (embedding_bag's offsets into indices)
  Pivots,     ///< [1, size of `of` along dim -2] (LU pivots, 1-based rows)
  Classes,    ///< [0, classes of `of`) or the ignore_index (nll_loss targets)
  IndexList,  ///< index.Tensor, index_put: the k-th integer index tensor indexes the k-th dim of `of`
};

/// One argument holding indices.
struct IndexArg {
  const char* index;  ///< the schema argument holding them
  const char* of;     ///< the argument they index
  IndexRange range;
  const char* dim = nullptr;  ///< IndexRange::Dim: the int argument naming the dim (null: dim 0)
  bool wraps = false;         ///< IndexRange::Dim: negative indices count from the end
  int trailing = 0;           ///< IndexRange::Plane: how many trailing dims of `of`
};

/// Memory a kernel allocates beyond its outputs, as a multiple of its inputs.
enum class Workspace {
  None,
  /// Operands that are not dense (stride 0, gaps, overlap) are made contiguous by the kernel.
  DenseOperands,
  /// Elementwise terms as large as the broadcast operands, then reduced (losses, dist, logsumexp),
  /// and dense copies of operands that are not.
  BroadcastTerms,
  /// mvlgamma(x, p): two [numel, p] temporaries.
  Mvlgamma,
  /// _trilinear: products as large as the broadcast of its three operands, each unsqueezed at
  /// its expand dims.
  Trilinear,
};

struct OpContract {
  std::vector<IndexArg> indices;
  bool storage_relative = false;
  Workspace workspace = Workspace::None;
  /// Why the op's arguments (in schema order; their tensor operands' metadata in `operands`)
  /// are outside what its kernels survive, or "".
  std::string (*arguments)(const std::vector<Arg>& args, const std::vector<TensorMeta>& operands) = nullptr;
};

/// The contract of `op`; null where none is written (the op is then refused in untrusted graphs).
const OpContract* op_contract(const std::string& op);
/// The ops whose contract is written out in the table (views have theirs from their schema).
std::vector<std::string> ops_with_written_contracts();

/// Throws jvpc::Error naming `op` where its contract refuses `args` (OpContract::arguments).
void check_arguments(const std::string& op, const std::vector<Arg>& args, const std::vector<TensorMeta>& operands);

/// Throws jvpc::Error ("`where`: its indices hold an index out of range [0, 16)") where an
/// index argument of node `n`, given as the boxed arguments `stack` of its call, is out of the
/// range its contract states. Tensors the contract does not name may be absent or Meta tensors.
void check_index_arguments(c10::function_ref<std::string()> where, const Node& n, const torch::jit::Stack& stack);

/// The bytes `n`'s kernel allocates beyond its outputs, by its contract, from its operands'
/// declared metadata.
int64_t workspace_bytes(const Node& n);

namespace detail {
/// For tests: while it lives, `op` has no contract, as an op on the list whose contract was never
/// written.
class WithoutContract {
 public:
  explicit WithoutContract(std::string op);
  ~WithoutContract();
  WithoutContract(const WithoutContract&) = delete;
  WithoutContract& operator=(const WithoutContract&) = delete;

 private:
  std::string op_;
};
}  // namespace detail

}  // namespace jvpc
