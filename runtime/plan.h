// The plan an Executable runs: computed once from a Graph, before any call. Every value gets a
// slot (an index into the tensors a call holds), every node a Step (its dispatcher handle, a
// boxed-argument template with the slots to fill in, where its results go and which slots die
// there), and a node whose first operand is an intermediate that dies there runs in its in-place
// form where it has a safe one (baddbmm_, add_, ...). The plan holds no tensors: binding
// constants and running are the Executable's.
#pragma once

#include "ir/graph.h"
#include "ir/liveness.h"

#include <vector>

namespace jvpc {

struct OpInfo;

/// One node as a call runs it.
struct PlanStep {
  const OpInfo* info = nullptr;    ///< may be the in-place form of the node's op (see inplace_form)
  const Node* node = nullptr;      ///< the node, named in error messages (where())
  std::vector<c10::IValue> stack;  ///< boxed arguments; tensor positions are filled per call
  struct TensorArg {
    size_t pos;
    int slot;
  };
  c10::SmallVector<TensorArg, 3> tensors;
  struct ListArg {
    size_t pos;
    std::vector<int> slots;  ///< -1: absent (optional lists)
    bool optional;
  };
  std::vector<ListArg> lists;
  // Most nodes have one or two of each, kept inline (no allocation for them per step).
  c10::SmallVector<int, 2> return_counts;  ///< per schema return, as Node::return_counts
  c10::SmallVector<int, 2> out_slots;
  c10::SmallVector<const Value*, 2> outs;  ///< the node's outputs, for checking the first call's results
  c10::SmallVector<int, 3> release;        ///< slots whose last use is this step
  /// Where `info` is an in-place form: the op itself, run instead when the first operand's buffer
  /// turns out to be shared at run time (an op that returned an alias without saying so).
  const OpInfo* functional = nullptr;
  /// The node, where its index arguments are checked before each call (its op's contract names
  /// some: ir/op_contracts.h); null otherwise.
  const Node* checked_indices = nullptr;
  /// "node ...": how errors name the step's node.
  std::string where() const;
  /// The results are an uninitialized allocation (empty and its kin): the call zeroes them.
  bool zero_results = false;
  /// Every tensor it reads or writes is smaller than ATen's grain: it runs on the calling thread
  /// alone (runtime/one_thread.h).
  bool one_thread = false;
};

struct Plan {
  int num_slots = 0;
  std::vector<const Input*> arguments;  ///< the non-constant inputs, in graph order
  std::vector<int> argument_slots;      ///< per argument
  std::vector<const Input*> constants;  ///< the constant inputs, in graph order
  std::vector<int> constant_slots;      ///< per constant
  std::vector<PlanStep> steps;          ///< per node, in order
  std::vector<int> output_slots;        ///< per graph output
  /// Per graph output: whether it repeats an earlier one (cse merges equal results), so that it
  /// is returned as a tensor of its own, as eager code would.
  std::vector<bool> copied_outputs;
  bool impure = false;  ///< some node is impure (random): no CUDA graph
  /// Some node's index arguments are checked on the host before it runs: no CUDA graph.
  bool checks_indices = false;
  /// Some node addresses its operand's storage by absolute offsets (as_strided, copy, the
  /// scatters into views): inputs that do not own their storage are copied into their own.
  bool storage_relative = false;
};

/// Whether every tensor `n` reads or writes is smaller than ATen's grain, so that no loop of its
/// kernel is worth a parallel region: it runs on the calling thread alone (runtime/one_thread.h).
bool runs_on_one_thread(const Node& n);

/// The plan of `g` (verified), given its liveness. `reuse_buffers`: run nodes in place where
/// their first operand dies there (ExecutableOptions::reuse_buffers). Throws jvpc::Error naming
/// a node that would write a constant or an input without its schema saying so (hidden_write).
Plan make_plan(const Graph& g, const Liveness& live, bool reuse_buffers);

}  // namespace jvpc
