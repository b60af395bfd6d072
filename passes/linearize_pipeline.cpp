// linearize's pipeline: the table of its steps, in order, each with why it stands there
// (passes/linearize_pipeline.h shows the table as `jvpc linearize --list-passes` prints it).
#include "passes/linearize_pipeline.h"

#include "ir/io/limits.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace jvpc {

LinearizeConfig LinearizeConfig::of(std::vector<std::string> wrt, size_t primal_outputs,
                                    std::optional<int64_t> residual_budget, bool split) {
  LinearizeConfig c;
  c.wrt = std::move(wrt);
  c.primal_outputs = primal_outputs;
  c.residual_budget = residual_budget;
  c.match_attention = residual_budget != kNoMemoryLimit;
  c.split = split;
  c.dropped_outputs = split ? 0 : primal_outputs;
  c.fold = split ? SplitOptions{primal_outputs, /*constants_as_residuals=*/true} : SplitOptions{};
  return c;
}

const std::vector<LinearizePass>& linearize_passes() {
  using Config = LinearizeConfig;
  using State = LinearizeState;
  static const std::vector<LinearizePass> table = {
      {"jvp", false, "differentiates: a tangent input per primal input, each node's tangent after it",
       [](Graph& g, const Config& c, State&) { return jvp(g, c.wrt); }},
      {"attention-match", true, "while the traced attention outputs the O(L) form reads are in the graph",
       [](Graph& g, const Config& c, State& s) {
         if (c.match_attention) s.matched = attention_match(g);
         return !s.matched.empty();
       }},
      {"drop-primal-outputs", false, "linearize returns f(x) from the tracing run; a program keeps it until fold",
       [](Graph& g, const Config& c, State&) { return drop_primal_outputs(g, c.dropped_outputs); }},
      {"dce", false, "drops the P form of the attentions matched, now unread",
       [](Graph& g, const Config&, State&) { return dce(g); }},
      {"attention-form", false, "P or O(L) per attention under the budget, before the simplifications",
       [](Graph& g, const Config& c, State& s) {
         s.attention = attention_form(g, c.residual_budget, s.matched);
         return std::any_of(s.attention.begin(), s.attention.end(),
                            [](const AttentionChoice& a) { return !a.o_l_form; });
       }},
      {"simplify-views", true, "from here to zero-blocks: work moves onto primal values, before fold",
       [](Graph& g, const Config&, State&) { return simplify_views(g); }},
      {"simplify-arith", true, "multiplications by one, additions of zero, scalar chains merged",
       [](Graph& g, const Config&, State&) { return simplify_arith(g); }},
      {"cse", true, "one value for each repeat, so that the rewrites below see it once",
       [](Graph& g, const Config&, State&) { return cse(g); }},
      {"scale-to-residual", true, "scalar scales off the tangent path, onto a product's primal operand",
       [](Graph& g, const Config&, State&) { return scale_to_residual(g); }},
      {"merge-factors", true, "t·a·b -> t·(a·b): one residual where there were two",
       [](Graph& g, const Config&, State&) { return merge_factors(g); }},
      {"select-masks", true, "t·float(m) -> t·m: the residual is the boolean mask itself",
       [](Graph& g, const Config&, State&) { return select_masks(g); }},
      {"group-bmm", true, "grouped-query heads read unrepeated, before fold holds them",
       [](Graph& g, const Config&, State&) { return group_bmm(g); }},
      {"zero-blocks", true, "products skip the zeros of a KV cache's tangent",
       [](Graph& g, const Config&, State&) { return zero_blocks(g); }},
      {"fold", false, "evaluates every primal-only value once; those the tangent reads become residuals",
       [](Graph& g, const Config& c, State& s) {
         return fold(g, s.known, c.fold, c.split ? &s.split : nullptr, &s.fold_matmul_flops);
       }},
      {"dce", false, "drops the forward and the primal inputs the tangent no longer reads",
       [](Graph& g, const Config&, State&) { return dce(g, /*prune_primal_inputs=*/true); }},
      {"simplify-views", true, "views of residuals fold took in",
       [](Graph& g, const Config&, State&) { return simplify_views(g); }},
      {"fuse-matmul-add", true, "add(x, bmm(a, b)) -> baddbmm: after fold, so only tangent adds fuse",
       [](Graph& g, const Config&, State&) { return fuse_matmul_add(g); }},
      {"cse", true, "repeats the rewrites after fold left", [](Graph& g, const Config&, State&) { return cse(g); }},
  };
  return table;
}

std::vector<std::string> optional_linearize_passes() {
  std::vector<std::string> out;
  for (const LinearizePass& p : linearize_passes())
    if (p.optional && std::find(out.begin(), out.end(), p.name) == out.end()) out.push_back(p.name);
  return out;
}

void add_linearize_passes(Pipeline& p, LinearizeConfig config, std::shared_ptr<LinearizeState> state,
                          const std::set<std::string>& disabled) {
  std::vector<std::string> optional = optional_linearize_passes();
  for (const std::string& name : disabled)
    if (std::find(optional.begin(), optional.end(), name) == optional.end()) {
      std::string list;
      for (const std::string& o : optional) list += (list.empty() ? "" : ", ") + o;
      bool required = std::any_of(linearize_passes().begin(), linearize_passes().end(),
                                  [&](const LinearizePass& lp) { return lp.name == name; });
      throw Error(required ? "pass '" + name + "' cannot be disabled (these can: " + list + ")"
                           : "no optional pass is named '" + name + "' (these can be disabled: " + list + ")");
    }
  auto shared = std::make_shared<const LinearizeConfig>(std::move(config));
  for (const LinearizePass& lp : linearize_passes())
    if (!disabled.count(lp.name)) {
      const auto& run = lp.run;
      p.add(make_pass(lp.name, [shared, state, &run](Graph& g) { return run(g, *shared, *state); }));
    }
}

const LinearizePass& linearize_pass(const std::string& name_or_row) {
  const auto& table = linearize_passes();
  for (const LinearizePass& p : table)
    if (p.name == name_or_row) return p;
  if (!name_or_row.empty() && name_or_row.size() <= 3 &&
      std::all_of(name_or_row.begin(), name_or_row.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    size_t row = std::stoul(name_or_row);
    if (row >= 1 && row <= table.size()) return table[row - 1];
  }
  std::string names;
  for (const LinearizePass& p : table)
    if (names.find(" " + p.name + ",") == std::string::npos) names += " " + p.name + ",";
  throw Error("no pass is named '" + name_or_row + "' (passes:" + names + " or a row number 1 to " +
              std::to_string(table.size()) + " of `jvpc linearize --list-passes`)");
}

const std::vector<BatchedPass>& batched_passes() {
  static const std::vector<BatchedPass> table = {
      {"dce", "drops what the batch rules left unread", [](Graph& g) { return dce(g); }},
      {"simplify-views", "views of views the batch rules wrote, merged", [](Graph& g) { return simplify_views(g); }},
      {"cse", "one value for each repeat of the K-fold rewrites", [](Graph& g) { return cse(g); }},
      {"dce", "drops what cse left unread", [](Graph& g) { return dce(g); }},
  };
  return table;
}

void print_linearize_passes(std::ostream& os) {
  char line[256];
  std::snprintf(line, sizeof line, "%2s  %-20s %-9s %s\n", "#", "pass", "optional", "why it stands here");
  os << line;
  int i = 0;
  for (const LinearizePass& p : linearize_passes()) {
    std::snprintf(line, sizeof line, "%2d  %-20s %-9s %s\n", ++i, p.name.c_str(), p.optional ? "yes" : "",
                  p.why.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "%2s  %-30s %s\n", "#", "batched pipeline",
                "after the batch rules, for K tangents in one call (--tangents K)");
  os << line;
  i = 0;
  for (const BatchedPass& p : batched_passes()) {
    std::snprintf(line, sizeof line, "%2d  %-30s %s\n", ++i, p.name.c_str(), p.why.c_str());
    os << line;
  }
}

}  // namespace jvpc
