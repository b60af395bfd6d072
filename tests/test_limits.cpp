// Memory limits: sizes as flags spell them, the default limit and the cgroup reader, and graphs
// that ask for more memory than the limit, refused by the loader before anything is allocated
// and by the runtime at construction.
#include "ir/cost/cost_model.h"
#include "ir/builder.h"
#include "ir/io/limits.h"
#include "ir/liveness.h"
#include "ir/io/graph_files.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "ir/io/safetensors.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

#include <ATen/ATen.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace jvpc {
namespace {

using test::expect_error;
using test::f32;
using test::temp_path;

constexpr int64_t kTiB = int64_t{1} << 40;
constexpr int64_t kGiB = int64_t{1} << 30;

TEST(Limits, ParsesSizes) {
  EXPECT_EQ(parse_size("1048576", "--max-memory"), 1048576);
  EXPECT_EQ(parse_size("0", "--max-memory"), 0);
  EXPECT_EQ(parse_size("64MiB", "--max-memory"), 64 << 20);
  EXPECT_EQ(parse_size("2GiB", "--max-memory"), 2 * kGiB);
  EXPECT_EQ(parse_size("2gib", "--max-memory"), 2 * kGiB);
  EXPECT_EQ(parse_size("1.5G", "--max-memory"), 3 * kGiB / 2);
  EXPECT_EQ(parse_size("10GB", "--max-memory"), 10000000000LL);
  EXPECT_EQ(parse_size("512k", "--max-memory"), 512 * 1024);
  EXPECT_EQ(parse_size("3TiB", "--max-memory"), 3 * kTiB);
  EXPECT_EQ(parse_size("1.5", "--max-memory"), 1);  // fractions of a byte round down
  EXPECT_EQ(parse_size("100B", "--max-memory"), 100);
  EXPECT_EQ(parse_size("9223372036854775807", "--max-memory"), kNoMemoryLimit);
  EXPECT_EQ(parse_size("inf", "--max-memory"), kNoMemoryLimit);
  EXPECT_EQ(parse_size("INF", "--max-memory"), kNoMemoryLimit);
  for (const char* bad : {"", "-1", "12XB", "1e9", "1..5G", "G", " 1G", "1G ", "nan", "0x10", "+5", "1 G", "inf1"})
    expect_error([&] { parse_size(bad, "--max-memory"); }, std::string("--max-memory: '") + bad + "' is not a size");
  for (const char* big : {"9223372036854775808", "99999999999999999999", "8388608TiB", "9000000PiB", "1e30"}) try {
      parse_size(big, "--residual-budget");
      ADD_FAILURE() << big << " parsed";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--residual-budget: '", 0), 0u) << e.what();
    }
  expect_error([] { parse_size("1\nG", "--max-memory"); }, "--max-memory: contains a control character");
}

TEST(Limits, DefaultLimitIsAFractionOfTheMachinesMemory) {
  std::optional<int64_t> ram = physical_memory_bytes();
  ASSERT_TRUE(ram.has_value());
  int64_t cpu = device_memory_bytes(c10::Device(c10::kCPU));
  EXPECT_GT(cpu, 0);
  EXPECT_LE(cpu, *ram);
  if (auto cgroup = cgroup_memory_limit()) {
    EXPECT_LE(cpu, *cgroup);
  }
  int64_t limit = default_memory_limit(c10::Device(c10::kCPU));
  EXPECT_GT(limit, 0);
  EXPECT_LE(limit, *ram);
  EXPECT_EQ(limit, cpu / 4 * 3);
}

TEST(Limits, CudaDefaultIsAFractionOfTheDevicesMemory) {
  if (!at::hasCUDA()) {
    expect_error([] { default_memory_limit(c10::Device(c10::kCUDA)); }, "CUDA is not available");
    GTEST_SKIP() << "no CUDA device";
  }
  int64_t total = device_memory_bytes(c10::Device(c10::kCUDA, 0));
  EXPECT_GT(total, 0);
  EXPECT_EQ(default_memory_limit(c10::Device(c10::kCUDA, 0)), total / 4 * 3);
  EXPECT_EQ(default_memory_limit(c10::Device(c10::kCUDA)), default_memory_limit(c10::Device(c10::kCUDA, 0)));
}

// A new empty directory (mkdtemp: no files left from an earlier run).
std::string fresh_dir(const std::string& name) {
  std::string pattern = temp_path(name + "_XXXXXX");
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  return pattern;
}

// A fake cgroup file system: `files` maps paths under the root to their contents.
struct FakeCgroups {
  std::string root, proc;
  FakeCgroups(const std::string& name, const std::string& proc_self_cgroup,
              const std::vector<std::pair<std::string, std::string>>& files)
      : root(fresh_dir(name)), proc(root + ".cgroup") {
    for (const auto& [path, text] : files) {
      std::filesystem::create_directories(std::filesystem::path(root + path).parent_path());
      std::ofstream(root + path) << text << "\n";
    }
    std::ofstream(proc) << proc_self_cgroup;
  }
  std::optional<int64_t> limit() const { return cgroup_memory_limit(root, proc); }
};

TEST(Limits, ReadsCgroupLimitsAlongThePathOfTheProcess) {
  // cgroup v2: the smallest memory.max from the process's cgroup up; "max" is no limit.
  FakeCgroups v2("v2", "0::/a/b\n",
                 {{"/memory.max", "max"}, {"/a/memory.max", "1073741824"}, {"/a/b/memory.max", "max"}});
  EXPECT_EQ(v2.limit(), std::optional<int64_t>(kGiB));
  FakeCgroups none("none", "0::/a\n", {{"/a/memory.max", "max"}});
  EXPECT_EQ(none.limit(), std::nullopt);
  // cgroup v1: memory/.../memory.limit_in_bytes; LONG_MAX rounded to a page is no limit.
  FakeCgroups v1(
      "v1", "5:cpu,cpuacct:/x\n4:memory:/x/y\n0::/\n",
      {{"/memory/memory.limit_in_bytes", "9223372036854771712"}, {"/memory/x/y/memory.limit_in_bytes", "2147483648"}});
  EXPECT_EQ(v1.limit(), std::optional<int64_t>(2 * kGiB));
  FakeCgroups v1_unlimited("v1u", "4:memory:/x\n", {{"/memory/x/memory.limit_in_bytes", "9223372036854771712"}});
  EXPECT_EQ(v1_unlimited.limit(), std::nullopt);
  // A container that sees the host's path: the levels that exist, down to the mount's own.
  FakeCgroups container("container", "0::/docker/abc\n", {{"/memory.max", "536870912"}});
  EXPECT_EQ(container.limit(), std::optional<int64_t>(512 << 20));
  // No /proc/self/cgroup: the root's files; garbage is no limit.
  EXPECT_EQ(cgroup_memory_limit(container.root, container.proc + ".missing"), std::optional<int64_t>(512 << 20));
  FakeCgroups garbage("garbage", "0::/\n", {{"/memory.max", "12x"}});
  EXPECT_EQ(garbage.limit(), std::nullopt);
  std::string empty = fresh_dir("nothing");
  EXPECT_EQ(cgroup_memory_limit(empty, empty + "/none"), std::nullopt);
}

TEST(Limits, DescribesBytesExactly) {
  EXPECT_EQ(describe_bytes(100), "100 bytes");
  EXPECT_EQ(describe_bytes(4 * kTiB), "4.00 TiB (4398046511104 bytes)");
  EXPECT_EQ(describe_bytes(1536), "1.50 KiB (1536 bytes)");
}

TEST(Limits, TheCostModelsPeakIsTheLivenessPeak) {
  Graph g;
  Value* x = g.add_input("x", f32({1024}), Role::Primal);
  Builder b(g);
  Value* a = b.call("aten::exp", {x});
  Value* c = b.call("aten::exp", {a});
  g.add_output(b.call("aten::exp", {c}));
  EXPECT_EQ(peak_intermediate_bytes(g), 2 * 4096);
  EXPECT_EQ(graph_cost(g).peak_bytes, peak_intermediate_bytes(g));
  MemoryNeed need = memory_needed(g);
  EXPECT_EQ(need.inputs, 4096);
  EXPECT_EQ(need.constants, 0);
  EXPECT_EQ(need.intermediates, 2 * 4096);
  EXPECT_EQ(need.total(), 3 * 4096);
}

TEST(Limits, ConstantsCountEachStorageOnce) {
  Graph g;
  at::Tensor base = at::randn({16, 16});
  Value* r0 = g.add_constant("r0", base);
  Value* r1 = g.add_constant("r1", base.view({256}));     // the same storage
  Value* u = g.add_input("u", f32({8}), Role::Constant);  // unbound: its declared size
  Builder b(g);
  g.add_output(b.call("aten::add.Tensor", {b.call("aten::view", {r0, std::vector<int64_t>{256}}), r1}));
  g.add_output(b.call("aten::exp", {u}));
  MemoryNeed need = memory_needed(g);
  EXPECT_EQ(need.constants, 1024 + 32);
  EXPECT_EQ(need.inputs, 0);
  EXPECT_EQ(need.intermediates, 1024 + 32);
}

// Saves `g` (no constants) and returns the path.
std::string saved(const Graph& g, const std::string& name) {
  std::string path = temp_path(name + ".json");
  save(g, path);
  return path;
}

LoadOptions limited(int64_t bytes) {
  LoadOptions o;
  o.max_memory = bytes;
  return o;
}

// aten::zeros of [2^20, 2^20] floats: 4 TiB from a graph file of a few hundred bytes.
std::unique_ptr<Graph> terabyte_zeros() {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  g->add_output(b.call("aten::zeros", {std::vector<int64_t>{1 << 20, 1 << 20}, c10::kFloat}));
  return g;
}

TEST(Limits, ATerabyteGraphIsRefusedByTheLoaderBeforeAnythingIsAllocated) {
  std::string path = saved(*terabyte_zeros(), "zeros");
  EXPECT_LT(std::filesystem::file_size(path), 1024u);
  // The default limit: 3/4 of this machine's memory, which is less than 4 TiB.
  expect_error([&] { load(path); },
               "graph needs 4.00 TiB (4398046511104 bytes) at its peak (constants 0 bytes, "
               "inputs 0 bytes, intermediates 4.00 TiB) but the memory limit on cpu is ");
  expect_error([&] { load(path); }, "3/4 of its memory by default (LoadOptions::max_memory, --max-memory)");
  expect_error([&] { load(path, limited(16 * kGiB)); },
               "but the memory limit on cpu is 16.00 GiB (17179869184 bytes) (LoadOptions::max_memory");
  // No limit: the loader allocates nothing itself (the zeros are made when the graph runs).
  LoadOptions none = limited(kNoMemoryLimit);
  auto g = load(path, none);
  EXPECT_EQ(memory_needed(*g).total(), 4 * kTiB);
  EXPECT_EQ(load(path, limited(4 * kTiB))->nodes().size(), 1u);  // exactly at the limit
  expect_error([&] { load(path, limited(4 * kTiB - 1)); }, "graph needs 4.00 TiB");
}

TEST(Limits, TheLoaderChecksDeclaredConstantsBeforeReadingTheConstantsFile) {
  // A constant of 4 TiB and no constants file: the limit is what fails, before any read.
  Graph big;
  Value* c = big.add_input("c", f32({1 << 20, 1 << 20}), Role::Constant);
  Builder b(big);
  big.add_output(b.call("aten::exp", {b.call("aten::view", {c, std::vector<int64_t>{-1}})}));
  std::string path = temp_path("constant.json");
  {
    nlohmann::json j = to_json(big, "constant.safetensors");
    j["inputs"][0]["stored"] = true;
    std::ofstream(path) << j.dump();
  }
  expect_error([&] { load(path, limited(kTiB)); },
               "graph needs 8.00 TiB (8796093022208 bytes) at its peak (constants 4.00 TiB");
  expect_error([&] { load(path, limited(kNoMemoryLimit)); }, "cannot read constants file");
}

TEST(Limits, TheLoaderCountsConstantsStoredAsViewsOnce) {
  // Two constants sharing one storage are stored once, as views of one entry: the limit counts
  // that entry once, before reading it, as the runtime counts the bound storage.
  Graph g;
  at::Tensor base = at::randn({64, 64});
  Value* r0 = g.add_constant("r0", base);
  Value* r1 = g.add_constant("r1", base.view({4096}).slice(0, 0, 4096, 2));  // every other element
  Builder b(g);
  g.add_output(b.call("aten::sum", {r0}));
  g.add_output(b.call("aten::sum", {r1}));
  std::string path = temp_path("views.json");
  save(g, path);
  int64_t need = memory_needed(*load(path, limited(kNoMemoryLimit))).total();
  EXPECT_EQ(need, 4096 * 4 + 2 * 4);  // the storage once, two scalar sums
  EXPECT_NO_THROW(load(path, limited(need)));
  expect_error([&] { load(path, limited(need - 1)); }, "constants 16.00 KiB");
}

// One data-sized op at a time, each from a graph file that asks for 4 TiB or more.
struct DataSized {
  const char* name;
  std::function<void(Graph&, Builder&)> build;
};

class DataSizedOps : public ::testing::TestWithParam<DataSized> {};

TEST_P(DataSizedOps, AreRefusedByTheLoaderAndTheRuntime) {
  Graph g;
  Builder b(g);
  GetParam().build(g, b);
  std::string path = saved(g, GetParam().name);
  expect_error([&] { load(path, limited(64 * kGiB)); }, "but the memory limit on cpu is 64.00 GiB");
  expect_error([&] { load(path); }, "3/4 of its memory by default");
  auto loaded = load(path, limited(kNoMemoryLimit));
  EXPECT_GE(memory_needed(*loaded).total(), 4 * kTiB);
  expect_error([&] { Executable exe(std::move(loaded)); }, "(ExecutableOptions::max_memory, --max-memory)");
}

const std::vector<int64_t> kTera = {1 << 20, 1 << 20};  // 2^40 elements

INSTANTIATE_TEST_SUITE_P(
    Ops, DataSizedOps,
    ::testing::Values(DataSized{"zeros",
                                [](Graph& g, Builder& b) {
                                  g.add_output(b.call("aten::zeros", {kTera, c10::kFloat}));
                                }},
                      DataSized{"ones",
                                [](Graph& g, Builder& b) {
                                  g.add_output(b.call("aten::ones", {kTera, c10::kFloat}));
                                }},
                      DataSized{"full",
                                [](Graph& g, Builder& b) {
                                  g.add_output(b.call("aten::full", {kTera, 2.5, c10::kFloat}));
                                }},
                      DataSized{"empty",
                                [](Graph& g, Builder& b) {
                                  Value* e = b.call("aten::empty.memory_format", {kTera, c10::kFloat});
                                  g.add_output(b.call("aten::fill.Scalar", {e, 1.0}));
                                }},
                      DataSized{"arange",
                                [](Graph& g, Builder& b) {
                                  g.add_output(b.call("aten::arange", {static_cast<double>(kTiB), c10::kFloat}));
                                }},
                      DataSized{"repeat",
                                [](Graph& g, Builder& b) {
                                  Value* x = g.add_input("x", f32({1024}), Role::Primal);
                                  g.add_output(b.call("aten::repeat", {x, std::vector<int64_t>{1 << 30}}));
                                }},
                      DataSized{"cat",
                                [](Graph& g, Builder& b) {
                                  // The same 4 GiB input 1024 times.
                                  Value* x = g.add_input("x", f32({1 << 30}), Role::Primal);
                                  g.add_output(b.call("aten::cat", {std::vector<Value*>(1024, x), int64_t{0}}));
                                }}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Limits, SumOfAnExpandIsSmallInMemoryAndLargeInFlops) {
  // sum(expand(x, [2^40])): 4 bytes of input, 2^40 additions. Memory admits it; the cost model
  // counts its FLOPs, which the CLI's --max-flops refuses (tests/cli_test.sh).
  Graph g;
  Value* x = g.add_input("x", f32({1}), Role::Primal);
  Builder b(g);
  g.add_output(b.call("aten::sum", {b.call("aten::expand", {x, std::vector<int64_t>{kTiB}})}));
  auto loaded = load(saved(g, "sum_expand"));
  EXPECT_EQ(memory_needed(*loaded).total(), 4 + 4);
  GraphCost c = graph_cost(*loaded);
  EXPECT_EQ(c.matmul_flops + c.other_flops, kTiB);
}

TEST(Limits, TheRuntimeChecksAtConstruction) {
  // In memory, without a file: the default limit refuses 4 TiB; none admits it (nothing runs).
  expect_error(
      [] { Executable exe(terabyte_zeros()); },
      "graph needs 4.00 TiB (4398046511104 bytes) at its peak (constants 0 bytes, inputs 0 bytes, intermediates "
      "4.00 TiB) but the memory limit on cpu is ");
  ExecutableOptions none;
  none.max_memory = kNoMemoryLimit;
  EXPECT_NO_THROW(Executable(terabyte_zeros(), none));
  // A small graph against a small limit: constants, inputs and intermediates all count.
  auto small = [] {
    auto g = std::make_unique<Graph>();
    Value* c = g->add_constant("c", at::randn({256}));  // 1 KiB
    Value* x = g->add_input("x", f32({256}), Role::Primal);
    Builder b(*g);
    g->add_output(b.call("aten::mul.Tensor", {b.call("aten::exp", {x}), c}));
    return g;
  };
  ExecutableOptions tight;  // exp's result is alive while mul's is made
  tight.max_memory = 4 * 1024 - 1;
  expect_error([&] { Executable exe(small(), tight); },
               "graph needs 4.00 KiB (4096 bytes) at its peak (constants 1.00 KiB, inputs 1.00 KiB, intermediates "
               "2.00 KiB) but the memory limit on cpu is 4.00 KiB (4095 bytes) (ExecutableOptions::max_memory");
  tight.max_memory = 4 * 1024;
  Executable exe(small(), tight);
  EXPECT_EQ(exe.run({at::ones({256})})[0].numel(), 256);
}

// Temporaries LibTorch's kernels make beyond their outputs count (the op's contract's workspace,
// ir/op_contracts.h): mvlgamma(x, p) builds [numel, p] (1 to 2 GB resident under a
// 64 MiB limit), and losses and distances over a stride-0 expand make terms as large as it.
TEST(Limits, KernelWorkspaceCountsAgainstTheLimit) {
  auto mvlgamma = [](int64_t p) {
    Graph g;
    Value* x = g.add_input("x", f32({1 << 20}), Role::Primal);  // 4 MiB
    Builder b(g);
    g.add_output(b.call("aten::mvlgamma", {x, p}));
    return load(saved(g, "mvlgamma"), limited(kNoMemoryLimit));
  };
  EXPECT_EQ(memory_needed(*mvlgamma(1)).total(), 4 * (4 << 20));  // input, output, two [2^20, 1] temporaries
  // p = 64: two [2^20, 64] temporaries, 512 MiB.
  EXPECT_EQ(memory_needed(*mvlgamma(64)).intermediates, (4 << 20) + 2 * 64 * (4 << 20));
  expect_error([&] { load(saved(*mvlgamma(64), "mvlgamma64"), limited(64 << 20)); },
               "graph needs 520.00 MiB (545259520 bytes) at its peak (constants 0 bytes, inputs 4.00 MiB, "
               "intermediates 516.00 MiB) but the memory limit on cpu is 64.00 MiB");
  for (const char* loss : {"aten::mse_loss", "aten::huber_loss", "aten::smooth_l1_loss", "aten::binary_cross_entropy",
                           "aten::binary_cross_entropy_with_logits", "aten::dist", "aten::logsumexp"}) {
    Graph g;
    Value* x = g.add_input("x", f32({1}), Role::Primal);
    Value* y = g.add_input("y", f32({1}), Role::Primal);
    Builder b(g);
    Value* big = b.call("aten::expand", {x, std::vector<int64_t>{1 << 28}});
    Value* other = b.call("aten::expand", {y, std::vector<int64_t>{1 << 28}});
    Value* r = std::string(loss) == "aten::logsumexp" ? b.call(loss, {big, std::vector<int64_t>{0}})
                                                      : b.call(loss, {big, other});
    g.add_output(r);
    std::string path = saved(g, "loss");
    // Terms as large as the expand (1 GiB each), and the dense copies the kernel may make.
    EXPECT_GE(memory_needed(*load(path, limited(kNoMemoryLimit))).intermediates, 2 * kGiB) << loss;
    expect_error([&] { load(path, limited(64 << 20)); }, "but the memory limit on cpu is 64.00 MiB");
  }
}

// Ops whose work per output element grows with their arguments are counted by it: avg_pool2d of
// a 1024² input with a 512 window ran 60 s under --max-flops 2e6 (1 FLOP per output counted).
TEST(Limits, WindowsAndFactorizationsAreCountedByTheirWork) {
  Graph g;
  Value* x = g.add_input("x", f32({1, 1, 1024, 1024}), Role::Primal);
  Builder b(g);
  std::vector<int64_t> window = {512, 512}, stride = {1, 1};
  g.add_output(b.call("aten::avg_pool2d", {x, window, stride}));
  GraphCost c = graph_cost(*load(saved(g, "pool")));
  EXPECT_EQ(c.other_flops, int64_t{513} * 513 * 512 * 512);  // each output averages its window
  EXPECT_TRUE(c.uncosted_ops.empty());
  Graph h;
  Value* a = h.add_input("a", f32({512, 512}), Role::Primal);
  Builder hb(h);
  h.add_output(hb.call("aten::_linalg_det", {a}));
  EXPECT_GE(graph_cost(h).other_flops, int64_t{512} * 512 * 512);  // one output, n³ work
}

}  // namespace
}  // namespace jvpc
