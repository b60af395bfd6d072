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
// 11  select-masks         yes       t·float(m) -> t·m: the residual is the boolean mask itself
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

/// How linearize's passes are to run: named fields, resolved once (LinearizeConfig::of) before
/// the first pass. The table's steps read it and decide nothing themselves.
struct LinearizeConfig {
  /// Primal inputs to differentiate (LinearizeOptions::wrt).
  std::vector<std::string> wrt;
  /// The traced graph's outputs (f(x)), before the tangent outputs jvp appends.
  size_t primal_outputs = 0;
  /// LinearizeOptions::residual_budget, for attention-form.
  std::optional<int64_t> residual_budget;
  /// attention-match looks for attentions to give the O(L) form: not where the budget keeps
  /// the P form everywhere (kNoMemoryLimit), where the rules' P form stays as it is.
  bool match_attention = true;
  /// Whether fold splits the primal graph off into LinearizeState::split: for a compiled
  /// program (compiler/api/program.h), and for a linearize a LinearizeCache keeps.
  bool split = false;
  /// The outputs drop-primal-outputs removes: without a split, linearize's f(x) comes from the
  /// tracing run, so all of them; with one, the primal graph computes f(x): none.
  size_t dropped_outputs = 0;
  /// How fold divides the graph: with a split, the primal outputs and the captured constants
  /// the tangent reads go to the primal graph with the residuals.
  SplitOptions fold;

  /// The configuration for differentiating `wrt` of a traced graph with `primal_outputs`
  /// outputs under `residual_budget`, with or without a `split`.
  static LinearizeConfig of(std::vector<std::string> wrt, size_t primal_outputs, std::optional<int64_t> residual_budget,
                            bool split);
};

/// What flows through linearize's passes besides the graph: fold's input, what one pass hands
/// the next, and the results the caller reads after the pipeline ran.
struct LinearizeState {
  /// In: values by id, from the tracing run, for fold.
  TensorsById known;
  /// attention-match -> attention-form: the attentions given the O(L) form.
  std::vector<MatchedAttention> matched;
  /// Out: attention-form's choice per attention (the CompileReport's).
  std::vector<AttentionChoice> attention;
  /// Out, with LinearizeConfig::split: the primal graph fold split off.
  PrimalSplit split;
  /// Out: the matmul FLOPs of the kernels fold ran (linearize's measured count: its
  /// KernelWatch is paused while the passes run).
  std::map<std::string, int64_t> fold_matmul_flops;
};

/// One step of linearize's pipeline: its name, whether --disable-pass may leave it out, why it
/// stands where it does (one line), and how it runs.
struct LinearizePass {
  std::string name;
  bool optional;
  std::string why;
  std::function<bool(Graph&, const LinearizeConfig&, LinearizeState&)> run;
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
/// The passes read `config` and `state`, which the caller keeps to read the results from.
void add_linearize_passes(Pipeline& p, LinearizeConfig config, std::shared_ptr<LinearizeState> state,
                          const std::set<std::string>& disabled = {});
/// One step of the table: by name (its first row of that name: `dce` is row 4, not 15), or by
/// its row number as print_linearize_passes() numbers them ("15"). Throws a one-line
/// jvpc::Error listing the names for anything else.
const LinearizePass& linearize_pass(const std::string& name_or_row);
/// Prints the table above: one numbered line per step, with its name, whether it is optional
/// and why it stands where it does (`jvpc linearize --list-passes`).
void print_linearize_passes(std::ostream& os);

}  // namespace jvpc
