// The list of ops graph files may use, derived from the rule tables (see ir/loadable_ops.h).
#include "passes/loadable_ops.h"

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
      "aten::_softmax_backward_data",  // softmax's tangent
      "aten::narrow",                  // rules' slices (solvers, scatter_reduce)
      "aten::where.ScalarOther",
      "aten::where.ScalarSelf",           // masks' selects: where(mask, t, 0)
      "aten::zeros",                      // materialized zero tangents
      "jvpc::attention_tangent",          // attention's tangent in O(L) memory (runtime/attention_tangent.h)
      "jvpc::attention_tangent.batched",  // the same for K tangents (passes/batch.cpp)
      // Derivative factors the rules compute from primal values alone: fold evaluates them, and a
      // compiled program's primal graph holds them (compiler/api/program.h).
      "aten::binary_cross_entropy_backward",
      "aten::bitwise_and.Tensor",
      "aten::bitwise_not",  // relu's mask: not x <= 0, so that NaN passes
      "aten::bitwise_or.Tensor",
      "aten::elu_backward",
      "aten::gelu_backward",
      "aten::grid_sampler_2d_backward",
      "aten::grid_sampler_3d_backward",
      "aten::hardshrink_backward",
      "aten::hardsigmoid_backward",
      "aten::hardswish_backward",
      "aten::hardtanh_backward",
      "aten::huber_loss_backward",
      "aten::leaky_relu_backward",
      "aten::log_sigmoid_backward",
      "aten::logit_backward",
      "aten::mish_backward",
      "aten::silu_backward",
      "aten::smooth_l1_loss_backward",
      "aten::softplus_backward",
      "aten::softshrink_backward",
      "aten::special_i1",
  };
  return ops;
}

// Ops a graph file may use that neither have a rule nor are emitted: what traced functions
// compute off the tangents' path (masks, index arithmetic) and the factories they call, besides
// the comparisons (comparison_ops()). All are pure, and sized by their arguments' shapes alone.
const std::vector<std::string>& extra_ops() {
  static const std::vector<std::string> ops = {
      // factories sized by their arguments
      "aten::ones",
      "aten::full",
      "aten::arange",
      "aten::arange.start",
      "aten::arange.start_step",
      "aten::eye",
      "aten::eye.m",
      "aten::scalar_tensor",
      // uninitialized allocations, admitted because a read of their contents is refused
      // (check_initialized): what traced code fills or scatters into
      "aten::empty.memory_format",
      "aten::empty_strided",
  };
  return ops;
}

// Ops with a JVP rule that a graph file may not use, and why: their safety contract
// (ir/op_contracts.h) would be complicated.
const std::map<std::string, std::string>& refused_ops() {
  static const std::map<std::string, std::string> ops = {
      {"aten::mkldnn_rnn_layer",
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
