// The pipeline's verification and observers, with passes made for the test (the jvp pass on
// graphs: tests/ir/jvp.ir).
#include "passes/cost_table.h"
#include "tests/pass_helpers.h"

#include <nlohmann/json.hpp>

#include <sstream>

namespace jvpc {
namespace {
using test::f32;

// f32[4] x -> exp(x).
void exp_graph(Graph& g) {
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::exp", {x}));
}

// A graph that breaks f32[4] -> exp: its output declared f32[5].
void break_output(Graph& g) {
  TensorMeta m = g.outputs()[0]->meta();
  m.sizes = {5};
  m.strides = {1};
  g.outputs()[0]->set_meta(m);
}

// With verify_each, the pass that broke the graph is named.
TEST(Pipeline, NamesThePassThatBreaksTheGraph) {
  Graph g;
  exp_graph(g);
  Pipeline p;
  p.verify_each(true).add(make_pass("breaker", [](Graph& gr) {
    break_output(gr);
    return true;
  }));
  try {
    p.run(g);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("after pass 'breaker', the graph does not verify: ", 0), 0u) << e.what();
  }
}

class Recorder : public PassObserver {
 public:
  void before_pass(const std::string& pass, const Graph&) override { events.push_back("before " + pass); }
  void after_pass(const std::string& pass, const Graph&, bool changed) override {
    events.push_back("after " + pass + (changed ? " changed" : ""));
  }
  void on_failure(const std::string& pass, const Graph&, const std::string& error) override {
    events.push_back("failed " + pass + ": " + error.substr(0, error.find(':')));
  }
  std::vector<std::string> events;
};

TEST(Pipeline, VerifiesItsInputAndTellsAThrowingPassFromABreakingOne) {
  Graph g;
  exp_graph(g);
  break_output(g);
  Pipeline p;
  p.add(make_pass("nop", [](Graph&) { return false; }));
  test::expect_error([&] { p.run(g); }, "the pipeline's input does not verify: ");

  Graph h;
  exp_graph(h);
  Recorder r;
  std::ostringstream dumps;
  IrDump dump({"thrower"}, "text", dumps);
  Pipeline q;
  q.add(make_pass("nop", [](Graph&) { return false; })).add(make_pass("thrower", [](Graph&) -> bool {
    throw std::runtime_error("no rule\nsecond line");
  }));
  q.observe(&r).observe(&dump);
  test::expect_error([&] { q.run(h); }, "pass 'thrower': no rule");
  EXPECT_EQ(r.events,
            (std::vector<std::string>{"before nop", "after nop", "before thrower", "failed thrower: pass 'thrower'"}));
  EXPECT_NE(dumps.str().find("// IR after failed pass 'thrower'"), std::string::npos) << dumps.str();
}

// Verification runs on the pipeline's output if a pass changed the graph; with verify_each, after
// every pass, so that the pass that broke the graph is named, even one that said it changed nothing.
TEST(Pipeline, VerifiesItsOutputOrAfterEveryPassWithVerifyEach) {
  for (bool each : {false, true}) {
    Graph g;
    exp_graph(g);
    Pipeline p;
    p.verify_each(each).add(make_pass("liar", [](Graph& gr) {
      break_output(gr);
      return false;
    }));
    if (each) {
      test::expect_error([&] { p.run(g); }, "after pass 'liar', the graph does not verify");
    } else {
      EXPECT_FALSE(p.run(g));
      ASSERT_EQ(p.timings().size(), 1u);
      EXPECT_EQ(p.timings()[0].pass, "liar");
    }
  }
  for (bool each : {false, true}) {
    Graph g;
    exp_graph(g);
    Pipeline p;
    Recorder r;
    p.verify_each(each).observe(&r);
    p.add(make_pass("breaker", [](Graph& gr) {
       break_output(gr);
       return true;
     })).add(make_pass("nop", [](Graph&) { return false; }));
    if (each) {
      test::expect_error([&] { p.run(g); }, "after pass 'breaker', the graph does not verify");
    } else {
      test::expect_error([&] { p.run(g); }, "after the passes (the last: 'nop'), the graph does not verify: ");
      EXPECT_EQ(r.events.back().rfind("failed nop: after the passes", 0), 0u) << r.events.back();
    }
  }
}

// input_verified: the input is not verified again before the first pass, unless verify_each; a
// node a pass changes is inferred again either way.
TEST(Pipeline, TrustsItsInputsShapesUnlessVerifyEach) {
  for (bool each : {false, true}) {
    Graph g;
    exp_graph(g);
    break_output(g);
    Pipeline p;
    p.verify_each(each).input_verified(true).add(make_pass("nop", [](Graph&) { return false; }));
    if (each)
      test::expect_error([&] { p.run(g); }, "the pipeline's input does not verify: ");
    else
      EXPECT_NO_THROW(p.run(g));
  }
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Value* y = g.add_input("y", f32({5}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::exp", {x}));
  Pipeline p;
  p.verify_each(false).input_verified(true).add(make_pass("rewire", [y](Graph& gr) {
    gr.outputs()[0]->producer()->replace_input(0, y);
    return true;
  }));
  test::expect_error([&] { p.run(g); }, "after the passes (the last: 'rewire'), the graph does not verify");
}

TEST(Pipeline, ObserversSeeEveryPass) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  b.call("aten::neg", {x});
  g.add_output(b.call("aten::exp", {x}));
  Pipeline p;
  p.add(make_pass("dce", [](Graph& gr) { return dce(gr); })).add(make_pass("cse", cse));
  CostTable table("input");
  std::ostringstream dumps;
  IrDump dump({"dce"}, "text", dumps);
  p.observe(&table).observe(&dump);
  p.run(g);
  ASSERT_EQ(table.rows().size(), 3u);
  EXPECT_EQ(table.rows()[0].cost.nodes, 2);
  EXPECT_EQ(table.rows()[1].pass, "dce");
  EXPECT_EQ(table.rows()[1].cost.nodes, 1);
  EXPECT_NE(dumps.str().find("// IR after pass 'dce'"), std::string::npos);
  EXPECT_EQ(dumps.str().find("'cse'"), std::string::npos);
  // JSON: one object per line, naming the pass and its position in the pipeline.
  std::ostringstream json_dumps;
  IrDump json_dump({"input", "cse"}, "json", json_dumps);
  Pipeline q;
  q.add(make_pass("cse", cse)).observe(&json_dump);
  q.run(g);
  std::istringstream lines(json_dumps.str());
  std::string line;
  std::vector<std::pair<std::string, int>> seen;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    seen.emplace_back(j.at("after"), j.at("position"));
    EXPECT_TRUE(j.at("graph").contains("nodes"));
  }
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, int>>{{"input", 0}, {"cse", 1}}));
}

}  // namespace
}  // namespace jvpc
