// linearize's pipeline: the passes linearize (and compile) run on a traced graph, in order.
// The table in linearize_pipeline.cpp is the one place the order is written; the pipeline,
// --disable-pass, --dump-after and `jvpc linearize --list-passes` are derived from it.
//
//  #  pass                 optional  why it stands here
//  1  jvp                            differentiates: a tangent input per primal input, each node's tangent after it
//  2  attention-match      yes       while the traced attention outputs the O(L) form reads are in the graph
//  3  drop-primal-outputs            linearize returns f(x) from the tracing run; a program keeps it until fold
//  4  dce                            drops the P form of the attentions matched, now unread
//  5  attention-form                 P or O(L) per attention under the budget, before the simplifications
//  6  simplify-views       yes       from here to zero-blocks: work moves onto primal values, before fold
//  7  simplify-arith       yes       multiplications by one, additions of zero, scalar chains merged
//  8  cse                  yes       one value for each repeat, so that the rewrites below see it once
//  9  scale-to-residual    yes       scalar scales off the tangent path, onto a product's primal operand
// 10  merge-factors        yes       t·a·b -> t·(a·b): one residual where there were two
// 11  select-masks         yes       t·float(m) -> where(m, t, 0): the residual is a boolean mask
// 12  group-bmm            yes       grouped-query heads read unrepeated, before fold holds them
// 13  zero-blocks          yes       products skip the zeros of a KV cache's tangent
// 14  fold                           evaluates every primal-only value once; those the tangent reads become residuals
// 15  dce                            drops the forward and the primal inputs the tangent no longer reads
// 16  simplify-views       yes       views of residuals fold took in
// 17  fuse-matmul-add      yes       add(x, bmm(a, b)) -> baddbmm: after fold, so only tangent adds fuse
// 18  cse                  yes       repeats the rewrites after fold left
//  #  batched pipeline               after the batch rules, for K tangents in one call (--tangents K)
//  1  dce                            drops what the batch rules left unread
//  2  simplify-views                 views of views the batch rules wrote, merged
//  3  cse                            one value for each repeat of the K-fold rewrites
//  4  dce                            drops what cse left unread
//
// (`jvpc linearize --list-passes` prints this table; the README's diagram is its output, and a
// test keeps the two the same.)
#pragma once

#include "passes/pass.h"
#include "passes/passes.h"

#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace jvpc {

/// What linearize's passes need besides the graph.
struct LinearizePassContext {
  /// Primal inputs to differentiate (LinearizeOptions::wrt).
  std::vector<std::string> wrt;
  size_t primal_outputs = 0;  ///< the traced graph's outputs, dropped from the tangent graph
  /// Values by id, from the tracing run, for fold.
  std::shared_ptr<TensorsById> known;
  std::optional<int64_t> residual_budget;  ///< LinearizeOptions::residual_budget
  /// Where attention-form writes its choices (the CompileReport's), if anywhere.
  std::shared_ptr<std::vector<AttentionChoice>> attention;
  /// Set when compiling a program (compiler/api/program.h): the primal outputs stay outputs
  /// until fold, fold takes them into the primal graph with the residuals (captured constants
  /// that tangent nodes read among them) and writes the primal graph here.
  std::shared_ptr<PrimalSplit> split;
  /// Where fold adds the matmul FLOPs of the kernels it runs, if anywhere (linearize's measured
  /// count: its KernelWatch is paused while the passes run).
  std::shared_ptr<std::map<std::string, int64_t>> fold_matmul_flops;
  /// What attention-match recognized, for attention-form.
  std::shared_ptr<std::vector<MatchedAttention>> matched = std::make_shared<std::vector<MatchedAttention>>();
};

/// One step of linearize's pipeline: its name, whether --disable-pass may leave it out, why it
/// stands where it does (one line), and how it runs.
struct LinearizePass {
  std::string name;
  bool optional;
  std::string why;
  std::function<bool(Graph&, const LinearizePassContext&)> run;
};

/// The pipeline linearize runs on a traced graph, `jvp` first, in order.
const std::vector<LinearizePass>& linearize_passes();

/// A pass of the batched pipeline, which tidies a batched tangent graph (batch_tangents(), for
/// K tangents in one call) after the batch rules have rewritten it.
struct BatchedPass {
  std::string name;
  std::string why;
  std::function<bool(Graph&)> run;
};
const std::vector<BatchedPass>& batched_passes();
/// The names of the optional passes, in pipeline order, each once.
std::vector<std::string> optional_linearize_passes();
/// Adds linearize_passes() to `p`, less the `disabled` ones (each must be optional; otherwise
/// a jvpc::Error naming those that can be).
void add_linearize_passes(Pipeline& p, LinearizePassContext context, const std::set<std::string>& disabled = {});
/// One step of the table: by name (its first row of that name: `dce` is row 4, not 15), or by
/// its row number as print_linearize_passes() numbers them ("15"). Throws a one-line
/// jvpc::Error listing the names for anything else.
const LinearizePass& linearize_pass(const std::string& name_or_row);
/// Prints the table above: one numbered line per step, with its name, whether it is optional
/// and why it stands where it does (`jvpc linearize --list-passes`).
void print_linearize_passes(std::ostream& os);

}  // namespace jvpc
