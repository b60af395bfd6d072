// The list of ops graph files may use, derived from the rule tables (see ir/loadable_ops.h).
#include "passes/loadable_ops.h"
#include "ir/op.h"

#include "ir/cost/cost_model.h"
#include "passes/jvp_rules/rules.h"

#include <algorithm>
#include <map>
#include <set>

namespace jvpc {

namespace {

// Ops that JVP rules or passes put into graphs and that have no JVP rule of their own: a
// tangent graph that uses them must load back.
const std::vector<std::string>& emitted_ops() {
  static const std::vector<std::string> ops = {
      ops::_softmax_backward_data,  // softmax's tangent
      ops::narrow,                  // rules' slices (solvers, scatter_reduce)
      ops::where_ScalarOther,
      ops::where_ScalarSelf,                // masks' selects: where(mask, t, 0)
      ops::zeros,                           // materialized zero tangents
      ops::jvpc_attention_tangent,          // attention's tangent in O(L) memory (runtime/attention_tangent.h)
      ops::jvpc_attention_tangent_batched,  // the same for K tangents (passes/batch.cpp)
      // Derivative factors the rules compute from primal values alone: fold evaluates them, and a
      // compiled program's primal graph holds them (compiler/api/program.h).
      ops::binary_cross_entropy_backward,
      ops::bitwise_and_Tensor,
      ops::bitwise_not,  // relu's mask: not x <= 0, so that NaN passes
      ops::bitwise_or_Tensor,
      ops::elu_backward,
      ops::gelu_backward,
      ops::grid_sampler_2d_backward,
      ops::grid_sampler_3d_backward,
      ops::hardshrink_backward,
      ops::hardsigmoid_backward,
      ops::hardswish_backward,
      ops::hardtanh_backward,
      ops::huber_loss_backward,
      ops::leaky_relu_backward,
      ops::log_sigmoid_backward,
      ops::logit_backward,
      ops::mish_backward,
      ops::silu_backward,
      ops::smooth_l1_loss_backward,
      ops::softplus_backward,
      ops::softshrink_backward,
      ops::special_i1,
  };
  return ops;
}

// Ops a graph file may use that neither have a rule nor are emitted: what traced functions
// compute off the tangents' path (masks, index arithmetic) and the factories they call, besides
// the comparisons (comparison_ops()). All are pure, and sized by their arguments' shapes alone.
const std::vector<std::string>& extra_ops() {
  static const std::vector<std::string> ops = {
      // factories sized by their arguments
      ops::ones,
      ops::full,
      ops::arange,
      ops::arange_start,
      ops::arange_start_step,
      ops::eye,
      ops::eye_m,
      ops::scalar_tensor,
      // uninitialized allocations, admitted because a read of their contents is refused
      // (check_initialized): what traced code fills or scatters into
      ops::empty_memory_format,
      ops::empty_strided,
  };
  return ops;
}

// Ops with a JVP rule that a graph file may not use, and why: their safety contract
// (ir/op_contracts.h) would be complicated.
const std::map<std::string, std::string>& refused_ops() {
  static const std::map<std::string, std::string> ops = {
      {ops::mkldnn_rnn_layer,
       "oneDNN's LSTM layer sizes its work and workspace from int arguments (hidden size, layers, "
       "batch_first) and its weights' shapes together; no contract for them is written"},
  };
  return ops;
}

}  // namespace

std::vector<std::string> derive_loadable_ops() {
  std::set<std::string> ops;
  for (const std::string& op : jvp_rules::registry().ops())
    if (!refused_ops().count(op) && !jvp_rules::registry().is_traced_only(op)) ops.insert(op);
  ops.insert(emitted_ops().begin(), emitted_ops().end());
  ops.insert(extra_ops().begin(), extra_ops().end());
  ops.insert(comparison_ops().begin(), comparison_ops().end());  // boolean results: no tangent
  return {ops.begin(), ops.end()};
}

}  // namespace jvpc
