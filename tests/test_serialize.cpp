// JSON and safetensors: every example round-trips; every kind of bad file is rejected with a
// message that says what and where.
#include "ir/cost/cost_model.h"
#include "ir/printer.h"
#include "ir/io/graph_files.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "ir/io/safetensors.h"
#include "ir/retarget.h"
#include "ir/verifier.h"
#include "compiler/trace/tracer.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

#include <c10/util/hash.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

namespace jvpc {
namespace {

using nlohmann::json;

using test::temp_path;

class RoundTrip : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(RoundTrip, JsonAndFilesGiveTheSameGraph) {
  auto ex = test::make_example(GetParam());
  Trace t = trace(ex.fn(), ex.inputs, TraceOptions::graph_only());
  json j = to_json(*t.graph);
  auto back = from_json(j);
  EXPECT_EQ(to_json(*back), j);
  EXPECT_EQ(to_text(*back), to_text(*t.graph));
  std::string path = temp_path(ex.name + ".json");
  save(*t.graph, path);
  auto loaded = load(path);
  EXPECT_EQ(to_text(*loaded), to_text(*t.graph));
}

INSTANTIATE_TEST_SUITE_P(Examples, RoundTrip, ::testing::ValuesIn(test::example_configs()),
                         [](const auto& info) { return "config" + std::to_string(info.index); });

// A small graph with a captured constant, saved to disk.
struct Saved {
  std::string path;
  json j;
};
Saved save_small(const std::string& name) {
  at::Tensor c = at::arange(6, at::kFloat).view({2, 3});
  Trace t = trace([c](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0] * c + 1}; },
                  {{"x", at::ones({2, 3})}});
  Saved s{temp_path(name + ".json"), to_json(*t.graph)};
  save(*t.graph, s.path);
  std::ifstream f(s.path);
  s.j = json::parse(f);
  return s;
}

void expect_load_error(const std::string& text, const std::string& fragment, bool trusted = false) {
  try {
    parse_graph(text, trusted);
    FAIL() << "accepted: " << text.substr(0, 200);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "multi-line error: " << e.what();
  }
}

TEST(Serialize, ConstantsRoundTripThroughSafetensors) {
  Saved s = save_small("const");
  auto g = load(s.path);
  ASSERT_EQ(g->inputs().size(), 2u);
  EXPECT_TRUE(g->inputs()[1].data.equal(at::arange(6, at::kFloat).view({2, 3})));
}

TEST(Serialize, RejectsInvalidJson) {
  expect_load_error("{\"schema_version\": 1, \"nodes\": [", "invalid JSON at byte");
}

TEST(Serialize, RejectsDeepNesting) { expect_load_error(std::string(100, '[') + std::string(100, ']'), "nesting"); }

TEST(Serialize, RejectsNumbersPastDoubleRange) {  // nlohmann's out_of_range 406
  expect_load_error(R"({"schema_version": 1, "x": 0.3E535533905932738})", "invalid JSON: number overflow parsing");
}

TEST(Serialize, RejectsMissingSchemaVersion) {
  json j = save_small("nover").j;
  j.erase("schema_version");
  expect_load_error(j.dump(), "missing \"schema_version\"");
}

TEST(Serialize, RejectsWrongSchemaVersion) {
  json j = save_small("badver").j;
  j["schema_version"] = 99;
  expect_load_error(j.dump(), "schema_version 99 is not supported");
}

TEST(Serialize, RejectsUnknownOp) {
  json j = save_small("unknownop").j;
  j["nodes"][0]["op"] = "aten::frobnicate";
  expect_load_error(j.dump(), "$.nodes[0].op: unknown op 'aten::frobnicate'");
}

TEST(Serialize, RejectsInPlaceOps) {  // they would write to the caller's inputs
  json j = save_small("inplace").j;
  j["nodes"][1]["op"] = "aten::add_.Scalar";
  expect_load_error(j.dump(), "$.nodes[1].op: aten::add_.Scalar is not on the list of ops graph files may use");
  expect_load_error(j.dump(), "aten::add_.Scalar writes to an argument; jvpc graphs are functional", /*trusted=*/true);
}

TEST(Serialize, RejectsTensorsFromNonTensorReturns) {
  json j = save_small("scalarret").j;
  int x = j["inputs"][0]["id"];
  j["nodes"] = json::array(
      {{{"op", "aten::_local_scalar_dense"},
        {"args", json::array({{{"tensor", x}}})},
        {"outputs",
         json::array(
             {{{"id", 50},
               {"meta",
                {{"sizes", json::array()}, {"strides", json::array()}, {"dtype", "Float"}, {"device", "cpu"}}}}})}}});
  j["outputs"] = json::array({{{"name", "out0"}, {"id", 50}}});
  expect_load_error(j.dump(), "aten::_local_scalar_dense is not on the list of ops graph files may use");
  expect_load_error(j.dump(), "return 0 of aten::_local_scalar_dense is Scalar, which cannot give 1 tensor(s)",
                    /*trusted=*/true);
}

TEST(Serialize, RejectsUnsupportedDtypesAndDevices) {
  json j = save_small("dtypes").j;
  j["inputs"][0]["meta"]["dtype"] = "ComplexFloat";
  expect_load_error(j.dump(), "$.inputs[0].meta: dtype 'ComplexFloat' is not supported");
  j = save_small("devices").j;
  j["inputs"][0]["meta"]["device"] = "lazy";
  expect_load_error(j.dump(), "$.inputs[0].meta: device 'lazy' is not supported (cpu or cuda)");
}

TEST(Serialize, CpuWithAnIndexIsTheCpu) {
  json j = save_small("cpu0").j;
  j["inputs"][0]["meta"]["device"] = "cpu:0";
  j.erase("constants_file");
  j["inputs"][1]["stored"] = false;
  auto g = parse_graph(j.dump());
  EXPECT_EQ(g->inputs()[0].value->meta().device, c10::Device(c10::kCPU));
}

TEST(Serialize, RejectsControlCharactersInNames) {  // they would cut one-line errors short
  json j = save_small("ctrl").j;
  j["inputs"][0]["name"] = "a\nb";
  expect_load_error(j.dump(), "$.inputs[0].name: contains a control character");
  j = save_small("ctrlop").j;
  j["nodes"][0]["op"] = "aten::mul.Tensor\nx";
  expect_load_error(j.dump(), "$.nodes[0].op: contains a control character");
}

TEST(Serialize, RejectsDirectories) {
  test::expect_error([] { load(::testing::TempDir()); }, "is a directory");
}

TEST(Serialize, RejectsWrongArgumentCount) {
  json j = save_small("argcount").j;
  j["nodes"][0]["args"].push_back({{"int", 1}});
  expect_load_error(j.dump(), "$.nodes[0].args: aten::mul.Tensor takes 2 arguments, got 3");
}

TEST(Serialize, RejectsWrongArgumentType) {
  json j = save_small("argtype").j;
  j["nodes"][0]["args"][1] = {{"str", "x"}};
  expect_load_error(j.dump(), "$.nodes[0].args[1]: argument 'other'");
}

TEST(Serialize, RejectsMalformedArgument) {
  json j = save_small("argform").j;
  j["nodes"][0]["args"][1] = {{"int", "seven"}};
  expect_load_error(j.dump(), "$.nodes[0].args[1].int: expected an integer");
}

TEST(Serialize, RejectsDanglingIds) {
  json j = save_small("dangling").j;
  j["nodes"][0]["args"][0] = {{"tensor", 77}};
  expect_load_error(j.dump(), "value %77 is not defined anywhere");
}

TEST(Serialize, RejectsDuplicateIds) {
  json j = save_small("dup").j;
  j["nodes"][1]["outputs"][0]["id"] = j["nodes"][0]["outputs"][0]["id"];
  expect_load_error(j.dump(), "is defined twice");
}

TEST(Serialize, RejectsCycles) {
  json j = save_small("cycle").j;
  // node 0 reads node 1's output, which reads node 0's: a cycle.
  j["nodes"][0]["args"][0] = {{"tensor", j["nodes"][1]["outputs"][0]["id"]}};
  expect_load_error(j.dump(), "used before it is defined");
}

TEST(Serialize, RejectsShapesInconsistentWithTheOp) {
  json j = save_small("shape").j;
  j["nodes"][0]["outputs"][0]["meta"]["sizes"] = {3, 2};
  expect_load_error(j.dump(), "is declared f32[3,2] but aten::mul.Tensor produces f32[2,3]");
}

TEST(Serialize, RejectsShapesThatAShapeRuleRefuses) {
  // where.self has no Meta kernel in C++; its shape rule must reject, not throw c10::Error.
  // (Found by the fuzzer.)
  auto meta = [](std::vector<int64_t> sizes, const char* dtype) {
    json strides = json::array();
    int64_t s = 1;
    for (size_t i = sizes.size(); i-- > 0;) strides.insert(strides.begin(), s), s *= sizes[i];
    return json{{"sizes", sizes}, {"strides", strides}, {"dtype", dtype}, {"device", "cpu"}};
  };
  json j = {{"schema_version", 1},
            {"inputs",
             {{{"name", "c"}, {"id", 0}, {"role", "primal"}, {"meta", meta({4, 8}, "Bool")}},
              {{"name", "x"}, {"id", 1}, {"role", "primal"}, {"meta", meta({4, 64}, "Float")}}}},
            {"nodes",
             {{{"op", "aten::where.self"},
               {"args", {{{"tensor", 0}}, {{"tensor", 1}}, {{"tensor", 1}}}},
               {"outputs", {{{"id", 2}, {"meta", meta({4, 64}, "Float")}}}}}}},
            {"outputs", {{{"name", "y"}, {"id", 2}}}}};
  expect_load_error(j.dump(), "aten::where.self: The size of tensor a (8) must match the size of tensor b (64)");
}

TEST(Serialize, RejectsElementCountOverflow) {
  json j = save_small("overflow").j;
  j["inputs"][0]["meta"]["sizes"] = {4294967296LL, 4294967296LL};
  j["inputs"][0]["meta"]["strides"] = {4294967296LL, 1};
  expect_load_error(j.dump(), "overflows 64 bits");
}

TEST(Serialize, AbsurdSizesAreNotAllocated) {
  // 10^15 elements: the loader checks shapes on Meta tensors and never allocates them.
  json j = save_small("huge").j;
  for (auto* v :
       {&j["inputs"][0]["meta"], &j["nodes"][0]["outputs"][0]["meta"], &j["nodes"][1]["outputs"][0]["meta"]}) {
    (*v)["sizes"] = {1000000000000000LL};
    (*v)["strides"] = {1};
  }
  j["inputs"][1]["meta"]["sizes"] = {1};
  j["inputs"][1]["meta"]["strides"] = {1};
  j["inputs"][1]["stored"] = false;
  auto g = from_json(j);
  EXPECT_EQ(g->inputs()[0].value->meta().numel(), 1000000000000000LL);
}

TEST(Serialize, RejectsMalformedStoredFlags) {
  json j = save_small("stored").j;
  j["inputs"][1]["stored"] = "yes";
  expect_load_error(j.dump(), "$.inputs[1].stored: expected true or false");
  j["inputs"][1]["stored"] = false;
  j["inputs"][0]["stored"] = true;
  expect_load_error(j.dump(), "$.inputs[0].stored: only constants are stored");
}

TEST(Serialize, RejectsMissingConstantsFile) {
  Saved s = save_small("nofile");
  std::remove(constants_path_for(s.path).c_str());
  test::expect_error([&] { load(s.path); }, "cannot read constants file");
}

// Makes the graph file record the size and hash of the constants file beside it as it is now, as
// a graph file written with it would: what load() checks after those.
void vouch_for_constants(Saved& s) {
  std::ifstream in(constants_path_for(s.path), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  s.j["constants_size"] = bytes.size();
  s.j["constants_sha1"] = c10::sha1(bytes).str();
  std::ofstream(s.path, std::ios::trunc) << s.j.dump();
}

TEST(Serialize, RejectsMismatchedConstants) {
  Saved s = save_small("mismatch");
  write_safetensors(constants_path_for(s.path), {{"c0", at::ones({3, 2}, at::kDouble)}});
  vouch_for_constants(s);
  test::expect_error([&] { load(s.path); }, "constant 'c0' is f64[3,2] but the graph declares f32[2,3]");
}

TEST(Serialize, RejectsTruncatedConstantsFile) {
  Saved s = save_small("truncated");
  std::string cpath = constants_path_for(s.path);
  std::ifstream in(cpath, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(cpath, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 5);
  vouch_for_constants(s);
  test::expect_error([&] { load(s.path); }, "data_offsets out of range");
}

// Captured constants a = base[0:12] as [3,4] and b = base[2:10] as [4,2] transposed share one
// storage; `lone` has its own.
Saved save_shared(const std::string& name) {
  at::Tensor base = at::arange(12, at::kFloat);
  at::Tensor a = base.view({3, 4}), b = base.narrow(0, 2, 8).view({2, 4}).t(), lone = at::ones({5});
  Trace t = trace(
      [=](const std::vector<at::Tensor>& x) {
        return std::vector<at::Tensor>{x[0] + b, a * 2, lone + 1};
      },
      {{"x", at::ones({4, 2})}});
  Saved s{temp_path(name + ".json"), {}};
  save(*t.graph, s.path);
  std::ifstream f(s.path);
  s.j = json::parse(f);
  return s;
}

TEST(Serialize, SharedStorageIsStoredOnceAndSharedAgainAfterLoading) {
  Saved s = save_shared("shared");
  // inputs: x, c0 = b, c1 = a, c2 = lone
  EXPECT_EQ(s.j["inputs"][1]["view_of"], (json{{"tensor", "c0"}, {"offset", 2}}));
  EXPECT_EQ(s.j["inputs"][2]["view_of"], (json{{"tensor", "c0"}, {"offset", 0}}));
  EXPECT_FALSE(s.j["inputs"][3].contains("view_of"));
  auto entries = read_safetensors(constants_path_for(s.path));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_TRUE(entries.at("c0").equal(at::arange(12, at::kFloat)));  // the span of a and b, once
  auto g = load(s.path);
  const at::Tensor &b = g->inputs()[1].data, &a = g->inputs()[2].data;
  EXPECT_TRUE(a.equal(at::arange(12, at::kFloat).view({3, 4})));
  EXPECT_TRUE(b.equal(at::arange(2, 10, at::kFloat).view({2, 4}).t()));
  EXPECT_TRUE(a.storage().is_alias_of(b.storage()));
  EXPECT_EQ(graph_cost(*g).residual_bytes, (12 + 5) * 4);
}

// A constant alone in its storage but with gaps or repeats (a step slice, a column slice, an
// expand) is stored as the span it reaches and rebuilt with its strides, so such graphs load
// back. A constant named like safetensors' own header is refused.
TEST(Serialize, StridedConstantsAloneInTheirStorageRoundTrip) {
  at::Tensor cols = at::randn({4, 8}).slice(1, 0, 3), steps = at::randn({8}).slice(0, 0, 8, 2),
             repeated = at::randn({3}).expand({4, 3});
  auto fn = [=](const std::vector<at::Tensor>& x) {
    return std::vector<at::Tensor>{x[0] * cols, steps * 2, x[0] + repeated};
  };
  Trace t = trace(fn, {{"x", at::ones({4, 3})}}, TraceOptions::graph_only());
  std::string path = temp_path("strided.json");
  save(*t.graph, path);
  auto g = load(path);
  for (size_t i = 1; i < g->inputs().size(); ++i)
    EXPECT_EQ(g->inputs()[i].data.strides(), t.graph->inputs()[i].data.strides()) << g->inputs()[i].name;
  at::Tensor x = at::randn({4, 3});
  auto got = Executable(std::move(g)).run({x}), want = fn({x});
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << i;

  Graph h;
  h.add_constant("__metadata__", at::ones({2}));
  test::expect_error([&] { save(h, temp_path("reserved.json")); }, "may not be named '__metadata__'");
}

TEST(Serialize, RejectsBadViewsOfStoredTensors) {
  Saved s = save_shared("badview");
  auto expect = [&](json j, const std::string& fragment) {
    std::ofstream(s.path, std::ios::trunc) << j.dump();
    test::expect_error([&] { load(s.path); }, fragment);
  };
  json j = s.j;
  j["inputs"][1]["view_of"]["offset"] = 5;
  expect(j, "constant 'c0' is a view of 'c0' past its end");
  j = s.j;
  j["inputs"][1]["view_of"]["tensor"] = "nope";
  expect(j, "constant 'c0' is a view of 'nope' but that tensor is missing");
  j = s.j;
  j["inputs"][1]["view_of"]["tensor"] = "c2";
  j["inputs"][1]["view_of"]["offset"] = 0;
  expect(j, "past its end");
  j = s.j;
  j["inputs"][1]["view_of"]["offset"] = -1;
  expect_load_error(j.dump(), "$.inputs[1].view_of.offset: expected an offset of 0 or more");
  j = s.j;
  j["inputs"][1]["stored"] = false;
  expect_load_error(j.dump(), "$.inputs[1].view_of: only a stored constant can be a view");
}

TEST(Serialize, RejectsMissingGraphFile) {
  test::expect_error([] { load(temp_path("does_not_exist.json")); }, "cannot read graph file");
}

}  // namespace
}  // namespace jvpc

namespace jvpc {
namespace {

// Moving a graph re-derives what depends on the device: native_layer_norm's bfloat16
// statistics are bfloat16 on CPU and float32 on CUDA (the meta device follows CUDA here).
TEST(Serialize, RetargetRederivesDeviceDependentMetadata) {
  auto ex = test::make_example({"block", "--seq-len", "8"}, {"--dtype", "bfloat16"});
  std::unique_ptr<Graph> g = trace(ex.fn(), ex.inputs, TraceOptions::graph_only()).graph;
  auto stats_dtypes = [&] {
    std::set<c10::ScalarType> d;
    for (const Node* n : g->nodes())
      if (n->op() == "aten::native_layer_norm") d.insert(n->output(1)->meta().dtype);
    return d;
  };
  ASSERT_EQ(stats_dtypes(), std::set<c10::ScalarType>{c10::kBFloat16});
  retarget(*g, c10::Device(c10::kMeta));
  EXPECT_EQ(stats_dtypes(), std::set<c10::ScalarType>{c10::kFloat});
  for (const Node* n : g->nodes())
    for (const Value* o : n->outputs()) EXPECT_TRUE(o->meta().device.is_meta()) << n->op();
  verify(*g);
}

// Retyping to float64 (the central-differences reference of a graph file): every floating value,
// constant and dtype argument becomes float64; integer values stay. The bfloat16 math path's
// casts to float32 and back become casts to float64, and the graph computes the float64 result.
TEST(Serialize, RetypeFloatingMakesEveryFloatingValueFloat64) {
  auto ex = test::make_example({"sdpa", "--seq-len", "8", "--model-dim", "16", "--head-dim", "8", "--mask", "bool"},
                               {"--dtype", "bfloat16"});
  std::unique_ptr<Graph> g = trace(ex.fn(), ex.inputs, TraceOptions::graph_only()).graph;
  retype_floating(*g, c10::kDouble);
  verify(*g);
  std::set<c10::ScalarType> dtypes;
  for (const Input& in : g->inputs()) dtypes.insert(in.value->meta().dtype);
  for (const Node* n : g->nodes()) {
    for (const Value* o : n->outputs()) dtypes.insert(o->meta().dtype);
    for (const Arg& a : n->args())
      if (a.kind == ArgKind::ScalarType) dtypes.insert(static_cast<c10::ScalarType>(a.value.toInt()));
  }
  EXPECT_EQ(dtypes, (std::set<c10::ScalarType>{c10::kDouble, c10::kBool})) << to_text(*g);
  std::vector<at::Tensor> x64;
  for (const TraceInput& in : ex.inputs)
    x64.push_back(in.value.is_floating_point() ? in.value.to(at::kDouble) : in.value);
  Executable exe(std::move(g));
  EXPECT_TRUE(exe.run(x64)[0].allclose(ex.make_fn(examples::Backend::Math)(x64)[0], 1e-12, 1e-12));
}

}  // namespace
}  // namespace jvpc
