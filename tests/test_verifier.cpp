// The verifier rejects each kind of broken graph, naming the problem.
#include "ir/builder.h"
#include "ir/verifier.h"
#include "tests/helpers.h"

namespace jvpc {
namespace {

using test::f32;

void expect_rejected(const Graph& g, const std::string& fragment) {
  try {
    verify(g);
    FAIL() << "verify accepted a broken graph (expected: " << fragment << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Verifier, AcceptsAWellFormedGraph) {
  Graph g;
  Value* x = g.add_input("x", f32({2, 3}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::exp", {x}));
  EXPECT_NO_THROW(verify(g));
}

TEST(Verifier, RejectsUseBeforeDefinition) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::neg", {x});
  Value* e = b.call("aten::exp", {a});
  g.add_output(e);
  g.move_before(e->producer(), a->producer());
  expect_rejected(g, "not defined before use");
}

TEST(Verifier, RejectsUndefinedOutput) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::neg", {x});
  g.erase(a->producer());
  // Outputs are uses: an erased value cannot become one, so the graph never holds it.
  EXPECT_THROW(g.add_output(a), Error);
  verify(g);
}

TEST(Verifier, RejectsDuplicateInputNames) {
  Graph g;
  g.add_input("x", f32({4}), Role::Primal);
  g.add_input("x", f32({4}), Role::Primal);
  expect_rejected(g, "declared twice");
}

TEST(Verifier, RejectsWrongArgumentCount) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  g.create("aten::exp", {Arg::tensor(0), Arg::of_int(1)}, {x}, {f32({4})});
  expect_rejected(g, "takes 1 arguments");
}

TEST(Verifier, RejectsWrongArgumentKind) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  g.create("aten::mul.Scalar", {Arg::tensor(0), Arg::of_str("two")}, {x}, {f32({4})});
  expect_rejected(g, "cannot take a str");
}

TEST(Verifier, RejectsUnknownOp) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  g.create("aten::frobnicate", {Arg::tensor(0)}, {x}, {f32({4})});
  expect_rejected(g, "unknown op 'aten::frobnicate'");
}

TEST(Verifier, RejectsShapesInconsistentWithTheOp) {
  Graph g;
  Value* x = g.add_input("x", f32({5, 128, 64}), Role::Primal);
  Value* w = g.add_input("w", f32({5, 64, 128}), Role::Primal);
  g.create("aten::bmm", {Arg::tensor(0), Arg::tensor(1)}, {x, w}, {f32({5, 128, 64})});
  expect_rejected(g, "produces f32[5,128,128]");
}

TEST(Verifier, RejectsOperandsTheOpCannotTake) {
  Graph g;
  Value* x = g.add_input("x", f32({5, 128, 64}), Role::Primal);
  g.create("aten::bmm", {Arg::tensor(0), Arg::tensor(1)}, {x, x}, {f32({5, 128, 128})});
  expect_rejected(g, "aten::bmm");
}

TEST(Verifier, RejectsConstantDataThatDisagreesWithItsMetadata) {
  Graph g;
  g.add_constant("c", at::ones({2, 2}));
  g.inputs()[0].data = at::ones({3});
  expect_rejected(g, "bound tensor is f32[3]");
}

TEST(Verifier, RejectsMismatchedStrides) {
  Graph g;
  TensorMeta m = f32({2, 3});
  m.strides = {1};
  g.add_input("x", m, Role::Primal);
  expect_rejected(g, "2 sizes but 1 strides");
}

TEST(Verifier, RejectsReturnCountsThatDisagreeWithOutputs) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  g.create("aten::exp", {Arg::tensor(0)}, {x}, {f32({4})}, {0});
  expect_rejected(g, "return counts");
}

TEST(Verifier, RejectsOperandsNoArgumentPasses) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  g.create("aten::exp", {Arg::tensor(0)}, {x, x}, {f32({4})});
  expect_rejected(g, "not passed to any argument");
}

// A use list no public edit can break; the test edits one in place, as a faulty pass might.
Uses& uses_of(Value* v) { return const_cast<Uses&>(v->uses()); }

// x read by `readers` nodes (neg), each returned, so x's use list has `readers` entries:
// {x, the first reader's output, the last reader's output}.
std::vector<Value*> graph_reading_x(Graph& g, int readers) {
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  std::vector<Value*> outs;
  for (int i = 0; i < readers; ++i) g.add_output(outs.emplace_back(b.call("aten::neg", {x})));
  return {x, outs.front(), outs.back()};
}

TEST(Verifier, RejectsUseListsThatMissRepeatOrInventARead) {
  for (int readers : {2, 40}) {  // a short use list, searched; a long one, compared sorted
    SCOPED_TRACE(readers);
    {
      Graph g;
      Value* x = graph_reading_x(g, readers)[0];
      EXPECT_NO_THROW(verify(g));
      uses_of(x).pop_back();
      expect_rejected(g, "use lists are out of date");
    }
    {
      Graph g;
      Value* x = graph_reading_x(g, readers)[0];
      uses_of(x).push_back(x->uses().front());  // one read listed twice
      expect_rejected(g, "use lists are out of date");
    }
    {
      Graph g;
      auto v = graph_reading_x(g, readers);
      // As many entries as reads, the last one a read that does not happen (the last
      // reader's operand 1).
      uses_of(v[0]).back() = Use{v[2]->producer(), 1};
      expect_rejected(g, "use lists are out of date");
    }
  }
}

// Kernels without a Meta implementation are checked by jvpc's own shape rules (flip, roll).
TEST(Verifier, ChecksKernelsWithoutMetaImplementationsByTheirShapeRules) {
  Graph g;
  Value* x = g.add_input("x", f32({3, 4}), Role::Primal);
  g.create("aten::flip", {Arg::tensor(0), Arg::of_ints({2})}, {x}, {f32({3, 4})});
  expect_rejected(g, "aten::flip");
  Graph h;
  Value* y = h.add_input("y", f32({3, 4}), Role::Primal);
  h.create("aten::roll", {Arg::tensor(0), Arg::of_ints({1, 2}), Arg::of_ints({0})}, {y}, {f32({3, 4})});
  expect_rejected(h, "shifts and dims");
  Graph k;
  Value* z = k.add_input("z", f32({3, 4}), Role::Primal);
  k.create("aten::roll", {Arg::tensor(0), Arg::of_ints({1}), Arg::of_ints({0})}, {z}, {f32({4, 3})});
  expect_rejected(k, "aten::roll");
}

// With a ShapeChecks record, a node is inferred again only when what inference reads, or its
// declared outputs, changed: a wrong shape it recorded as trusted passes, a changed one does not.
TEST(Verifier, ShapeChecksInferOnlyNodesThatChanged) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Value* y = g.add_input("y", f32({5}), Role::Primal);
  Builder b(g);
  Value* e = b.call("aten::exp", {x});
  g.add_output(e);
  ShapeChecks checks;
  VerifyOptions cached;
  cached.shape_checks = &checks;
  EXPECT_NO_THROW(verify(g, cached));
  EXPECT_TRUE(checks.unchanged(*e->producer()));

  // Its operand replaced by one of another shape: inferred again, and rejected.
  e->producer()->replace_input(0, y);
  EXPECT_FALSE(checks.unchanged(*e->producer()));
  try {
    verify(g, cached);
    FAIL() << "a changed operand was not checked";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("produces f32[5]"), std::string::npos) << err.what();
  }
  e->producer()->replace_input(0, x);

  // Its declared output changed: rejected.
  TensorMeta wrong = f32({5});
  e->set_meta(wrong);
  EXPECT_THROW(verify(g, cached), Error);

  // Taken as checked (trust): not inferred, so the wrong shape passes; without the record it does not.
  checks.trust(g);
  EXPECT_NO_THROW(verify(g, cached));
  expect_rejected(g, "produces f32[4]");
}

// A node the Builder made has the shapes inference gives: a check takes it as checked until it
// changes (its declared output is then what a check reads, and rejects).
TEST(Verifier, ShapeChecksTakeTheBuildersInferenceUntilTheNodeChanges) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* e = b.call("aten::exp", {x});
  g.add_output(e);
  ShapeChecks checks;
  EXPECT_TRUE(e->producer()->shapes_inferred());
  EXPECT_TRUE(checks.unchanged(*e->producer()));
  Node* made = g.create("aten::exp", {Arg::tensor(0)}, {x}, {f32({4})});
  EXPECT_FALSE(made->shapes_inferred());
  EXPECT_FALSE(checks.unchanged(*made));
  e->set_meta(f32({5}));
  EXPECT_FALSE(e->producer()->shapes_inferred());
  EXPECT_FALSE(checks.unchanged(*e->producer()));
  VerifyOptions cached;
  cached.shape_checks = &checks;
  EXPECT_THROW(verify(g, cached), Error);
}

// After stop_recording (the pipeline's last verification), a node that passes is not recorded:
// nothing is kept that no later verification reads.
TEST(Verifier, ShapeChecksStopRecording) {
  Graph g;
  Value* x = g.add_input("x", f32({4}), Role::Primal);
  Builder b(g);
  Value* e = b.call("aten::exp", {x});
  Value* n = b.call("aten::neg", {e});
  g.add_output(n);
  ShapeChecks checks;
  VerifyOptions cached;
  cached.shape_checks = &checks;
  EXPECT_NO_THROW(verify(g, cached));
  EXPECT_TRUE(checks.unchanged(*e->producer()));
  Value* s = g.create("aten::sin", {Arg::tensor(0)}, {x}, {f32({4})})->output();  // not the Builder's
  g.add_output(s);
  checks.stop_recording();
  EXPECT_NO_THROW(verify(g, cached));
  EXPECT_FALSE(checks.unchanged(*s->producer()));  // checked, not recorded
  EXPECT_TRUE(checks.unchanged(*e->producer()));   // the earlier record is still read
}

}  // namespace
}  // namespace jvpc
