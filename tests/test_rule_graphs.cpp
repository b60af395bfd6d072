// Every rule case's graphs (tests/rule_cases.h): they load back from JSON, round-trip through
// the text form, save and load under the list of loadable ops and run to the same results
// without writing their operands, and batch by rules to K single calls.
#include "compiler/api/linearize.h"
#include "compiler/api/program.h"
#include "ir/loadable_ops.h"
#include "ir/printer.h"
#include "ir/io/graph_files.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "passes/jvp_rules/rules.h"
#include "passes/loadable_ops.h"
#include "runtime/executable.h"
#include "examples/examples.h"
#include "tests/batch_check.h"
#include "tests/helpers.h"
#include "tests/rule_cases.h"
#include "tests/same_structure.h"

#include <ATen/ATen.h>

#include <optional>
#include <set>
#include <tuple>

namespace jvpc {
namespace {

using namespace test;  // the rule cases (tests/rule_cases.h)

// Every case's traced graph loads back from JSON: the loader re-derives each node's outputs, so
// every op a case traces has a Meta kernel or a shape rule (cholesky_solve had neither).
TEST(JvpRules, EveryCasesTraceLoadsBackFromJson) {
  for (const RuleCase& rc : cases()) {
    if (!is_loadable_op(rc.op)) continue;  // met in traces only (backward kernels)
    std::vector<TraceInput> primals;
    for (size_t i = 0; i < rc.shapes.size(); ++i)
      primals.push_back({"x" + std::to_string(i), at::rand(rc.shapes[i], at::kDouble) + 0.5});
    Trace t = trace(rc.fn, primals, TraceOptions::graph_only());
    std::unique_ptr<Graph> back;
    try {
      back = from_json(nlohmann::json::parse(to_json(*t.graph).dump()));
    } catch (const std::exception& e) {
      ADD_FAILURE() << rc.op << ": " << e.what();
      continue;
    }
    auto ops = [](const Graph& g) {
      std::vector<std::string> out;
      for (const Node* n : g.nodes())
        for (const Value* o : n->outputs()) out.push_back(n->op() + " -> " + o->meta().str());
      return out;
    };
    EXPECT_EQ(ops(*back), ops(*t.graph)) << rc.op;
  }
}

// The text form holds every case's traced graph and tangent graph, complex ones included:
// parse_text(to_text(g)) is g, structurally (the constants' values are not in the text).
TEST(IrText, EveryCasesTraceAndTangentGraphRoundTrip) {
  auto check = [](const Graph& g, const std::string& where) {
    std::unique_ptr<Graph> back;
    try {
      back = parse_text(to_text(g));
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << ": " << e.what() << "\n" << to_text(g);
      return;
    }
    EXPECT_TRUE(test::same_structure(g, *back)) << where;
  };
  auto both = [&](const Fn& fn, const std::vector<TraceInput>& primals, const std::string& where) {
    check(*trace(fn, primals, TraceOptions::graph_only()).graph, where + ", trace");
    check(*linearize(fn, primals).tangent_graph, where + ", tangent graph");
  };
  for_each_case(both);
}

// The loader's copy of the list is the one derived from the rule tables
// (scripts/update-loadable-ops.sh writes it).
TEST(LoadableOps, TheLoadersListIsTheDerivedOne) {
  EXPECT_EQ(loadable_ops(), derive_loadable_ops()) << "run scripts/update-loadable-ops.sh";
}

// A graph's inputs and constants, copied, to show that running it wrote none of them.
std::vector<at::Tensor> snapshot(const Graph& g, const std::vector<at::Tensor>& args) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& a : args) out.push_back(a.clone());
  for (const Input& in : g.inputs())
    if (in.data.defined()) out.push_back(in.data.clone());
  return out;
}
void expect_unwritten(const Graph& g, const std::vector<at::Tensor>& args, const std::vector<at::Tensor>& before,
                      const std::string& what) {
  std::vector<at::Tensor> now = args;
  for (const Input& in : g.inputs())
    if (in.data.defined()) now.push_back(in.data);
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i)
    EXPECT_TRUE(at::equal(now[i], before[i])) << what << ": operand " << i << " was written";
}

// Every real-valued case's traced graph and tangent graph save, load back under the list of
// loadable ops (with every shape re-derived, none trusted), run to the same results, and leave
// their inputs and constants as they were. Together the cases run every op on the list.
TEST(LoadableOps, EveryCasesGraphsSaveLoadAndRunWithoutWritingTheirOperands) {
  std::set<std::string> ran;
  std::vector<RuleCase> all = cases();
  // The extras of the list that no rule case traces: comparisons, masks and factories.
  all.push_back({"aten::le.Tensor", {{3, 4}, {3, 4}}, one([](auto& x) {
                   at::Tensor m = at::where(x[0] <= x[1], x[0] >= x[1], x[0] < x[1]);
                   m = at::where(x[0] == x[1], m, x[0] != x[1]);
                   m = at::where(x[0] > 0.5, m, x[0] >= 0.5);
                   m = at::where(x[0] <= 0.5, m, x[0] < 0.5);
                   at::Tensor r = at::arange(1, 5, x[0].options()) + at::arange(0, 8, 2, x[0].options()) +
                                  at::eye(3, 4, x[0].options());
                   at::Tensor filled = at::empty({3, 4}, x[0].options()).fill_(1.5) +
                                       at::empty_strided({3, 4}, {1, 3}, x[0].options()).copy_(x[1]);
                   return at::where(m, x[0], 1.0) * r + at::where(m, 2.0, 3.0) + filled;
                 })});
  for (size_t c = 0; c < all.size(); ++c) {
    const RuleCase& rc = all[c];
    if (!is_loadable_op(rc.op)) continue;  // met in traces only (backward kernels)
    at::manual_seed(c);
    std::vector<TraceInput> primals;
    std::vector<at::Tensor> values, tangents;
    for (size_t i = 0; i < rc.shapes.size(); ++i) {
      values.push_back(rc.positive ? at::rand(rc.shapes[i], at::kDouble) + 0.5 : at::randn(rc.shapes[i], at::kDouble));
      tangents.push_back(at::randn(rc.shapes[i], at::kDouble));
      primals.push_back({"x" + std::to_string(i), values.back()});
    }
    Trace t = trace(rc.fn, primals, TraceOptions::graph_only());
    Linearized lin = linearize(rc.fn, primals);
    std::vector<at::Tensor> want = lin.jvp(tangents);
    for (auto [graph, args, what] :
         {std::tuple<const Graph*, std::vector<at::Tensor>, std::string>{t.graph.get(), values, "trace"},
          {lin.tangent_graph.get(), tangents, "tangent graph"}}) {
      std::string where = rc.op + " (case " + std::to_string(c) + "), " + what;
      std::string path = test::temp_path(std::to_string(c) + ".json");
      std::unique_ptr<Graph> back;
      try {
        save(*graph, path);
        back = load(path);
        verify(*back, VerifyOptions::untrusted());
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << ": " << e.what();
        continue;
      }
      for (const Node* n : back->nodes()) ran.insert(n->op());
      std::vector<at::Tensor> before = snapshot(*back, args);
      std::vector<at::Tensor> got;
      try {
        got = Executable(std::shared_ptr<const Graph>(back.get(), [](const Graph*) {}), ExecutableOptions::eager())
                  .run(args);
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << ": " << e.what();
        continue;
      }
      expect_unwritten(*back, args, before, where);
      if (graph == lin.tangent_graph.get()) {
        ASSERT_EQ(got.size(), want.size()) << where;
        for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << where << ": output " << i;
      }
    }
    // The compiled program (compiler/api/program.h): its primal graph computes what fold
    // evaluated away (the forward and the rules' derivative factors, gelu_backward, ...); saved
    // untrusted, it loads and linearizes at the case's point as linearize did.
    std::optional<Program> prog;
    try {
      prog.emplace(compile(rc.fn, primals));
    } catch (const Error&) {
      continue;  // reads a value into a number, or has data-dependent shapes: linearize only
    }
    std::string where = rc.op + " (case " + std::to_string(c) + "), program";
    try {
      std::string path = test::temp_path(std::to_string(c) + "-program.json");
      prog->save(path);
      Program back = Program::load(path, {}, ExecutableOptions::eager());
      for (const Node* n : back.primal_graph().nodes()) ran.insert(n->op());
      at::manual_seed(test::kRandomCaseSeed);  // a random case's draw, which its function seeds
      std::vector<at::Tensor> got = back.linearize(values).jvp(tangents);
      ASSERT_EQ(got.size(), want.size()) << where;
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::allclose(got[i], want[i], 1e-12, 1e-14)) << where;
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << ": " << e.what();
    }
  }
  // Attention's O(L) tangent (residual budget 0): the tangent graph of the CPU flash kernel.
  {
    examples::Instance ex = test::make_example({"sdpa", "--mask", "float"},
                                               {"--backend", "flash", "--dtype", "float64", "--seq-len", "24"});
    LinearizeOptions ol;
    ol.residual_budget = 0;
    Linearized lin = linearize(ex.fn(), ex.inputs, ol);
    std::vector<at::Tensor> tangents;
    for (const Input* in : lin.jvp_fn->arguments()) tangents.push_back(at::randn(in->value->meta().sizes, at::kDouble));
    std::string path = test::temp_path("attention_tangent.json");
    save(*lin.tangent_graph, path);
    std::unique_ptr<Graph> back = load(path);
    verify(*back, VerifyOptions::untrusted());
    for (const Node* n : back->nodes()) ran.insert(n->op());
    std::vector<at::Tensor> before = snapshot(*back, tangents);
    std::vector<at::Tensor> got =
        Executable(std::shared_ptr<const Graph>(back.get(), [](const Graph*) {}), ExecutableOptions::eager())
            .run(tangents);
    expect_unwritten(*back, tangents, before, "attention's O(L) tangent graph");
    EXPECT_TRUE(at::equal(got[0], lin.jvp(tangents)[0]));
    // Its batched form (passes/batch.cpp): jvpc::attention_tangent.batched, two tangents per call.
    std::vector<at::Tensor> two = test::random_batched_tangents(lin, 2);
    save(lin.batched(2).fn->graph(), path);
    std::unique_ptr<Graph> batched = load(path);
    verify(*batched, VerifyOptions::untrusted());
    for (const Node* n : batched->nodes()) ran.insert(n->op());
    before = snapshot(*batched, two);
    got = Executable(std::shared_ptr<const Graph>(batched.get(), [](const Graph*) {}), ExecutableOptions::eager())
              .run(two);
    expect_unwritten(*batched, two, before, "attention's batched O(L) tangent graph");
    EXPECT_TRUE(at::equal(got[0], lin.jvp_batched(2, two)[0]));
  }
  // Not run here: the ops only CUDA runs (their rules are checked on a GPU, and on kernels that
  // emulate them), oneDNN's LSTM layer (float32 only: Linearize.OneDnnLstmLayersMatchForwardAdOfTheUnfusedPath),
  // and ops of complex tensors, which graph files cannot hold.
  std::set<std::string> exempt = {"aten::_scaled_dot_product_flash_attention",
                                  "aten::_scaled_dot_product_efficient_attention",
                                  "aten::_scaled_dot_product_cudnn_attention",
                                  "aten::cudnn_batch_norm",
                                  "aten::cudnn_grid_sampler",
                                  "aten::mkldnn_rnn_layer"};
  for (const ComplexCase& cc : complex_cases()) exempt.insert(cc.op);
  std::vector<std::string> unrun;
  for (const std::string& op : loadable_ops())
    if (!ran.count(op) && !exempt.count(op) && test::has_op(op)) unrun.push_back(op);
  EXPECT_TRUE(unrun.empty()) << "ops on the list no case runs: " << ::testing::PrintToString(unrun);
  std::vector<std::string> missing;
  for (const std::string& op : ran)
    if (!is_loadable_op(op)) missing.push_back(op);
  EXPECT_TRUE(missing.empty()) << "ops the cases' graphs use that are off the list: "
                               << ::testing::PrintToString(missing);
}

// Batching rules cover the JVP rules (passes/batch_rules/): every op that reads a tangent in a
// case's tangent graph has one (no node is unrolled), so a new JVP rule without a batching rule
// fails here (the backward kernels of forward-over-reverse excepted: they run K single calls);
// and K tangents in one batched call equal K single calls in float64.
TEST(BatchRules, EveryCasesTangentGraphBatchesByRulesToKSingleCalls) {
  std::set<std::string> unrolled;
  auto check = [&](const Fn& fn, const std::vector<TraceInput>& primals, const std::string& where) {
    Linearized lin = linearize(fn, primals);
    test::BatchCheck r;
    try {
      r = test::batched_vs_single(lin, 3);
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << ": " << e.what();
      return;
    }
    EXPECT_LT(r.rel_error, 1e-12) << where;
    // Backward kernels (forward-over-reverse) may batch by K single calls.
    for (const std::string& op : r.unrolled)
      if (!jvp_rules::registry().is_traced_only(op)) unrolled.insert(op + " (" + where + ")");
  };
  for_each_case(check);
  std::string names;
  for (const std::string& u : unrolled) names += "\n  " + u;
  EXPECT_TRUE(unrolled.empty()) << "no batching rule:" << names;
}
}  // namespace
}  // namespace jvpc
