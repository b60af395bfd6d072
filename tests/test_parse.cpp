// Parsing graph files from strangers: JSON parsed in linear time with duplicate keys and deep
// nesting refused, safetensors headers checked by the format's rules, a graph and its constants
// file checked to come from one save, and errors that name the file's own value ids.
#include "ir/io/graph_files.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "ir/io/safetensors.h"
#include "compiler/trace/tracer.h"
#include "tests/helpers.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define JVPC_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define JVPC_TEST_SANITIZED 1
#endif
#endif

namespace jvpc {
namespace {

using nlohmann::json;
using test::temp_path;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << "cannot read " << path;
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
/// A hostile file of the fuzzer's seeds (tests/fuzz/seeds/).
std::string seed(const std::string& name) { return read_all(std::string(JVPC_FUZZ_SEEDS) + "/" + name); }

/// The message of the jvpc::Error that f throws (a failure if it throws none, or a multi-line one).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no error";
  return "";
}
#define EXPECT_CONTAINS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

std::string parse_error_of(const std::string& text) {
  return error_of([&] { parse_graph(text); });
}

// --- duplicate keys and nesting -------------------------------------------------------------

TEST(Parse, RejectsDuplicateKeys) {
  // A node with two "op" keys: before, the last one won silently.
  std::string text = seed("duplicate_key.json");
  size_t second = text.find("\"op\"", text.find("\"op\"") + 1) + 4;  // just past the second key
  EXPECT_CONTAINS(parse_error_of(text), "invalid JSON at byte " + std::to_string(second) + ": duplicate key \"op\"");
  // At the top, and deep inside.
  EXPECT_CONTAINS(parse_error_of(R"({"schema_version": 1, "schema_version": 1})"), "duplicate key \"schema_version\"");
  EXPECT_CONTAINS(parse_error_of(R"({"a": [{"b": {"c": 1, "d": 2, "c": 3}}]})"), "duplicate key \"c\"");
  // The same key in two objects is fine: the JSON parses (and is then no graph).
  EXPECT_CONTAINS(parse_error_of(R"([{"a": 1}, {"a": 2}])"), "$: expected a JSON object");
}

TEST(Parse, DuplicateKeysAreShownEscapedAndShort) {
  std::string key = "k\\u0007" + std::string(200, 'x');
  std::string msg = parse_error_of("{\"" + key + "\": 1, \"" + key + "\": 2}");
  EXPECT_CONTAINS(msg, "duplicate key \"k\\u0007xxx");
  EXPECT_EQ(msg.find('\a'), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 200u) << msg;
}

TEST(Parse, RejectsDeepNesting) {
  EXPECT_CONTAINS(parse_error_of(seed("deep_nesting.json")), "invalid JSON at byte 17: JSON nesting deeper than 16");
  // 16 levels parse (then they are no graph); 17 do not.
  EXPECT_CONTAINS(parse_error_of(std::string(16, '[') + std::string(16, ']')), "$: expected a JSON object");
  EXPECT_CONTAINS(parse_error_of(std::string(17, '[') + std::string(17, ']')), "nesting deeper than 16");
  EXPECT_CONTAINS(parse_error_of(R"({"a": )" + std::string(20, '[')), "nesting deeper than 16");
}

TEST(Parse, KeepsTheOtherErrorsOfTheParser) {
  EXPECT_CONTAINS(parse_error_of(R"({"schema_version": 1, "nodes": [)"), "invalid JSON at byte 33: ");
  EXPECT_CONTAINS(parse_error_of(R"({"schema_version": 1, "x": 0.3E535533905932738})"),
                  "invalid JSON: number overflow parsing '0.3E535533905932738'");
  EXPECT_CONTAINS(parse_error_of(R"({"a": 1} x)"), "invalid JSON at byte 10: ");
  EXPECT_CONTAINS(parse_error_of(""), "invalid JSON at byte 1: ");
}

// --- time linear in the size -----------------------------------------------------------------

// The CPU time this thread spends parsing each of texts, keeping every result until all are
// parsed (freeing is linear too, but its cost depends on the allocator's state, and is not
// counted). CPU time, not wall time: other processes on the machine do not count.
double seconds_to_parse(const std::vector<const std::string*>& texts) {
  auto now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  std::vector<json> parsed;
  parsed.reserve(texts.size());
  double start = now();
  for (const std::string* text : texts) parsed.push_back(parse_json(*text));
  double seconds = now() - start;
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(parsed[i].size(), static_cast<size_t>(std::count(texts[i]->begin(), texts[i]->end(), '{')));
  return seconds;
}

// One array of 8N small objects against eight arrays of N: the same bytes, objects and memory,
// so a linear parser takes as long for both (measured: 0.9 to 1.2). nlohmann's callback parser
// scanned the array at the end of every object, so the one array took 8 times as long (7.5 at
// N = 10,000; 160,000 objects took 9.8 s, and 800,000 would take minutes). For the rest of this
// process the allocator keeps what is freed (no trimming, no mmap below 32 MiB), and a first
// parse is not counted, so neither side pays page faults: with glibc's defaults in this binary,
// the one array faulted in 67 MB on every try and the eight did not, and "N against 8N" swung
// from 8 to 33. The tries alternate the sides; the least of each counts. Skipped under the
// sanitizers, whose costs are not the parser's.
TEST(Parse, ParsingIsLinearInTheFileSize) {
#ifdef JVPC_TEST_SANITIZED
  GTEST_SKIP() << "timing is not meaningful under AddressSanitizer";
#endif
  // 20,000 objects of one member (empty ones, 3 bytes each, take more memory than the parser
  // admits per byte of text: Parse.MemoryIsBoundedByTheTextsSize).
  std::string objects;
  for (int i = 0; i < 20000; ++i) objects += std::string(i ? "," : "") + R"({"id": 12345678})";
  auto copies = [&](int k) {
    std::string s = "[";
    for (int i = 0; i < k; ++i) s += (i ? "," : "") + objects;
    return s + "]";
  };
  std::string small = copies(5), large = copies(40);
  std::vector<const std::string*> eight_small(8, &small), one_large{&large};
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  seconds_to_parse(one_large);
  double t_small = 1e9, t_large = 1e9;
  for (int i = 0; i < 4; ++i) {
    t_small = std::min(t_small, seconds_to_parse(eight_small));
    t_large = std::min(t_large, seconds_to_parse(one_large));
  }
  RecordProperty("ratio", std::to_string(t_large / t_small));
  EXPECT_LT(t_large / t_small, 3) << "8 x N: " << t_small << " s, 8N: " << t_large << " s";
}

// A chain of n nodes alternating aten::neg and aten::add.Tensor on an f32[4] (the ids are the
// file's own, from 1000 up in steps of 3).
std::string chain_graph(int n) {
  const std::string meta = R"({"sizes": [4], "strides": [1], "dtype": "Float", "device": "cpu"})";
  auto id = [](int i) { return std::to_string(1000 + 3 * i); };
  std::string s = R"({"format": "jvpc-graph", "schema_version": 1, "inputs": [{"name": "x", "id": )" + id(0) +
                  R"(, "role": "primal", "differentiable": true, "meta": )" + meta + R"(}], "nodes": [)";
  for (int i = 1; i <= n; ++i) {
    s += i > 1 ? ",\n" : "\n";
    if (i % 2)
      s += R"({"op": "aten::neg", "args": [{"tensor": )" + id(i - 1) + "}]";
    else
      s += R"({"op": "aten::add.Tensor", "args": [{"tensor": )" + id(i - 1) + R"(}, {"tensor": )" + id(0) +
           R"(}, {"int": 1}])";
    s += R"(, "outputs": [{"id": )" + id(i) + R"(, "meta": )" + meta + "}]}";
  }
  return s + R"(], "outputs": [{"name": "y", "id": )" + id(n) + "}]}";
}

// 80,000 real nodes took 5.4 s to load. The bound is generous (sanitizer builds, a busy machine):
// it fails on quadratic behaviour, not on a slow machine.
TEST(Parse, AnEightyThousandNodeGraphLoads) {
  std::string path = temp_path("chain.json");
  write_all(path, chain_graph(80000));
  auto start = std::chrono::steady_clock::now();
  auto g = load(path);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(g->num_nodes(), 80000u);
  EXPECT_LT(seconds, 60) << "loading 80,000 nodes";
  std::remove(path.c_str());
}

// --- memory bounded by the size ----------------------------------------------------------------

// 50 MB of "{}," took 2 GB before any check (96 bytes of objects per 3 bytes of text), and
// 150 MB aborted with std::bad_alloc. The parser counts what the document takes as it builds
// it and stops at kJsonMemoryPerTextByte per byte of text.
TEST(Parse, MemoryIsBoundedByTheTextsSize) {
  auto repeated = [](const std::string& item, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s + "]";
  };
  for (const char* item : {"{}", "[]", "\"\"", "{\"\": 0}", "[[], [], []]"}) {
    std::string text = repeated(item, 1 << 19);
    EXPECT_CONTAINS(parse_error_of(text),
                    "takes more than " +
                        std::to_string(kJsonMemoryPerTextByte * static_cast<int64_t>(text.size()) + (1 << 20)) +
                        " bytes of memory (16 per byte of text, and 1 MiB)")
        << item;
  }
  // Numbers and long strings take less than 16 bytes per byte.
  EXPECT_EQ(parse_json(repeated("0", 1 << 19)).size(), 1u << 19);
  EXPECT_EQ(parse_json(repeated("\"" + std::string(40, 'x') + "\"", 1 << 16)).size(), 1u << 16);
  // jvpc's graph files, as written and compact, fit with room to spare.
  json g = json::parse(chain_graph(1000));
  EXPECT_NO_THROW(parse_json(g.dump()));
  EXPECT_NO_THROW(parse_json(g.dump(1)));
}

// Running out of memory while parsing (150 MB of "{}," aborted: nlohmann's destructor allocates)
// is a one-line error. In a child process whose address space is limited to what it uses now
// and 256 MiB more, 80 MB of "0," (640 MB of values) run out.
TEST(Parse, RunningOutOfMemoryIsAnError) {
#ifdef JVPC_TEST_SANITIZED
  GTEST_SKIP() << "AddressSanitizer reserves address space of its own";
#endif
  std::string text = "[";
  for (int i = 0; i < 40000000; ++i) text += "0,";
  text += "0]";
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    ::alarm(60);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    struct rlimit r {};
    r.rlim_cur = r.rlim_max = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (256 << 20);
    ::setrlimit(RLIMIT_AS, &r);
    std::string msg = "no error";
    try {
      parse_json(text);
    } catch (const Error& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("another exception: ") + e.what();
    }
    (void)!::write(p[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(p[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child ended with status " << status;
  EXPECT_EQ(msg, "out of memory parsing 80000003 bytes of JSON");
}

// --- value ids in errors --------------------------------------------------------------------

// The graph numbers the values it loads itself; errors name them by the file's ids.
TEST(Parse, ErrorsNameTheFilesValueIds) {
  json j = json::parse(chain_graph(2));  // x = %1000, neg -> %1003, add -> %1006
  j["nodes"][1]["outputs"][0]["meta"]["sizes"] = {5};
  std::string msg = parse_error_of(j.dump());
  EXPECT_CONTAINS(msg,
                  "node aten::add.Tensor -> %1006: output %1006 is declared f32[5] but aten::add.Tensor produces "
                  "f32[4]");
  j = json::parse(chain_graph(2));
  j["nodes"][0]["outputs"][0]["meta"]["strides"] = {-1};
  EXPECT_CONTAINS(parse_error_of(j.dump()), "node aten::neg -> %1003 output %1003: negative stride -1");
}

// --- safetensors headers --------------------------------------------------------------------

/// A safetensors file: the header's length (or `length` where given), the header, the data.
std::string safetensors(const std::string& header, const std::string& data, std::optional<uint64_t> length = {}) {
  uint64_t n = length ? *length : header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>(static_cast<unsigned char>(n >> (8 * i)));
  return out + header + data;
}
std::string f32(const std::string& name, int64_t n, int64_t begin, int64_t end) {
  return "\"" + name + R"(": {"dtype": "F32", "shape": [)" + std::to_string(n) + R"(], "data_offsets": [)" +
         std::to_string(begin) + ", " + std::to_string(end) + "]}";
}
/// The error read_safetensors gives for these bytes.
std::string safetensors_error(const std::string& bytes) {
  std::string path = temp_path("lying.safetensors");
  write_all(path, bytes);
  return error_of([&] { read_safetensors(path); });
}

TEST(Parse, ReadsAValidSafetensorsFile) {
  std::string header =
      "{" + f32("a", 2, 0, 8) + ", " + f32("empty", 0, 8, 8) + ", " +
      R"("b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}, "__metadata__": {"format": "pt"}})";
  float a[2] = {1.5f, -2};
  int64_t b = 7;
  std::string data(reinterpret_cast<const char*>(a), 8);
  data.append(reinterpret_cast<const char*>(&b), 8);
  std::string path = temp_path("valid.safetensors");
  write_all(path, safetensors(header + "   ", data));  // the header may end in spaces
  auto t = read_safetensors(path);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(t.at("a").equal(at::tensor({1.5f, -2.f})));
  EXPECT_TRUE(t.at("b").equal(at::tensor({int64_t{7}})));
  EXPECT_EQ(t.at("empty").numel(), 0);
}

TEST(Parse, RejectsSafetensorsFilesThatLie) {
  std::string data(16, '\0');
  auto header = [](const std::string& entries) { return "{" + entries + "}"; };
  // Two tensors sharing bytes.
  EXPECT_CONTAINS(
      safetensors_error(safetensors(header(f32("a", 2, 0, 8) + ", " + f32("b", 2, 4, 12)), data.substr(0, 12))),
      "tensor \"b\" overlaps tensor \"a\"");
  // One name twice (nlohmann's parser kept the last one).
  std::string twice = header(f32("a", 2, 0, 8) + ", " + f32("a", 2, 8, 16));
  EXPECT_CONTAINS(safetensors_error(safetensors(twice, data)),
                  "header: invalid JSON at byte " + std::to_string(twice.rfind("\"a\"") + 3) + ": duplicate key");
  // Bytes after the last tensor, between tensors, before the first.
  EXPECT_CONTAINS(safetensors_error(safetensors(header(f32("a", 2, 0, 8)), data.substr(0, 12))),
                  "4 bytes after the last tensor belong to no tensor");
  EXPECT_CONTAINS(safetensors_error(safetensors(header(f32("a", 2, 0, 8) + ", " + f32("b", 1, 12, 16)), data)),
                  "4 bytes of data before tensor \"b\" belong to no tensor");
  EXPECT_CONTAINS(safetensors_error(safetensors(header(f32("a", 2, 4, 12)), data.substr(0, 12))),
                  "4 bytes of data before tensor \"a\" belong to no tensor");
  // Offsets reversed, past the end, or not the tensor's size.
  EXPECT_CONTAINS(safetensors_error(safetensors(header(f32("a", 0, 8, 0)), data.substr(0, 8))),
                  "tensor \"a\": data_offsets end before they begin");
  EXPECT_CONTAINS(safetensors_error(safetensors(header(f32("a", 4, 0, 16)), data.substr(0, 8))),
                  "tensor \"a\": data_offsets out of range");
  EXPECT_CONTAINS(safetensors_error(safetensors(header(f32("a", 2, 0, 4)), data.substr(0, 4))),
                  "tensor \"a\": data_offsets span 4 bytes, but f32[2] takes 8");
  // A header that is no JSON object, or too deep.
  EXPECT_CONTAINS(safetensors_error(safetensors("[]", "")), "header is not a JSON object");
  EXPECT_CONTAINS(safetensors_error(safetensors(std::string(20, '[') + std::string(20, ']'), "")),
                  "header: invalid JSON at byte 17: JSON nesting deeper than 16");
  EXPECT_CONTAINS(safetensors_error(safetensors(R"({"__metadata__": {"n": 1}})", "")),
                  "__metadata__ holds a value that is not a string");
  // Names are shown escaped.
  std::string msg = safetensors_error(safetensors(header(f32("a\\u001b[31m", 2, 0, 4)), data.substr(0, 4)));
  EXPECT_CONTAINS(msg, "tensor \"a\\u001b[31m\"");
  EXPECT_EQ(msg.find('\x1b'), std::string::npos);
}

// The header's length is checked against the format's limit and the file before anything else
// is read, and no error shows the file's bytes: "header length N exceeds the file" printed the
// first 8 bytes of any readable file as a number.
TEST(Parse, SafetensorsErrorsNeverShowTheFilesBytes) {
  std::string text = "root:x:0:0:root:/root:/bin/bash\n";  // a text file given as constants
  uint64_t first8 = 0;
  for (int i = 0; i < 8; ++i) first8 |= static_cast<uint64_t>(static_cast<unsigned char>(text[i])) << (8 * i);
  std::string msg = safetensors_error(text);
  EXPECT_CONTAINS(msg, "header length exceeds the limit of 100000000 bytes");
  EXPECT_EQ(msg.find(std::to_string(first8)), std::string::npos) << msg;
  EXPECT_EQ(msg.find("root"), std::string::npos) << msg;

  msg = safetensors_error(safetensors("{}", "", 4096));  // within the limit, past the file
  EXPECT_CONTAINS(msg, "header length exceeds the file");
  EXPECT_EQ(msg.find("4096"), std::string::npos) << msg;
  msg = safetensors_error(safetensors(R"({"secret-key" "value"})", ""));
  EXPECT_CONTAINS(msg, "header: invalid JSON at byte 21");
  EXPECT_EQ(msg.find("secret"), std::string::npos) << msg;
  msg = safetensors_error(safetensors(R"({"a": 1e999999})", ""));
  EXPECT_CONTAINS(msg, "header: invalid JSON: a number out of range");
  EXPECT_EQ(msg.find("999"), std::string::npos) << msg;
  EXPECT_CONTAINS(safetensors_error("1234567"), "too short for a safetensors file");
}

// What write_safetensors writes passes the checks: data 8-byte aligned, tensors contiguous.
TEST(Parse, WrittenSafetensorsFilesPassTheChecks) {
  std::vector<std::pair<std::string, at::Tensor>> tensors = {{"u8", at::arange(3, at::kByte)},
                                                             {"f32", at::randn({5})},
                                                             {"flag", at::ones({1}, at::kBool)},
                                                             {"none", at::ones({0})},
                                                             {"f64", at::randn({2, 3}, at::kDouble).t()}};
  std::string path = temp_path("written.safetensors");
  write_safetensors(path, tensors);
  std::string bytes = read_all(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);
  auto back = read_safetensors(path);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(back.at(name).equal(t)) << name;
  test::expect_error(
      [&] {
        write_safetensors(path, {{"a", at::ones({1})}, {"a", at::ones({2})}});
      },
      "tensor 'a' is given twice");
}

// --- a graph and its constants file from one save ----------------------------------------------

/// Saves x * c + 1 with the constant c into its own folder `name`/; returns the graph's path.
std::string save_pair(const std::string& name, const at::Tensor& c) {
  std::string dir = temp_path(name);
  std::filesystem::create_directories(dir);
  Trace t = trace([c](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0] * c + 1}; },
                  {{"x", at::ones(c.sizes())}});
  std::string path = dir + "/g.json";
  save(*t.graph, path);
  return path;
}

TEST(Parse, AGraphAndAConstantsFileFromTwoSavesDoNotLoadAsAPair) {
  std::string a = save_pair("a", at::arange(6, at::kFloat)), b = save_pair("b", at::arange(6, at::kFloat) * 2);
  json j = json::parse(read_all(a));
  EXPECT_EQ(j["constants_size"], std::filesystem::file_size(constants_path_for(a)));
  EXPECT_EQ(j["constants_sha1"].get<std::string>().size(), 40u);
  EXPECT_TRUE(load(a)->inputs()[1].data.equal(at::arange(6, at::kFloat)));

  // Same size, other bytes: the hash tells them apart.
  std::string ca = read_all(constants_path_for(a)), cb = read_all(constants_path_for(b));
  ASSERT_EQ(ca.size(), cb.size());
  write_all(constants_path_for(a), cb);
  EXPECT_CONTAINS(error_of([&] { load(a); }), "g.safetensors' is not the one saved with the graph file");
  // One byte changed.
  std::string changed = ca;
  changed[changed.size() - 1] ^= 1;
  write_all(constants_path_for(a), changed);
  EXPECT_CONTAINS(error_of([&] { load(a); }), "is not the one saved with the graph file (its SHA-1 differs");
  // Another size: told before the hash.
  std::string c = save_pair("c", at::arange(8, at::kFloat));
  write_all(constants_path_for(a), read_all(constants_path_for(c)));
  EXPECT_CONTAINS(error_of([&] { load(a); }), "is larger than " + std::to_string(ca.size()) + " bytes");
  write_all(constants_path_for(a), ca.substr(0, ca.size() - 4));
  EXPECT_CONTAINS(error_of([&] { load(a); }), "has " + std::to_string(ca.size() - 4) +
                                                  " bytes but the graph file records " + std::to_string(ca.size()) +
                                                  ": the two are not from the same save");
  write_all(constants_path_for(a), ca);
  EXPECT_NO_THROW(load(a));
}

TEST(Parse, ChecksTheRecordedSizeAndHash) {
  std::string a = save_pair("keys", at::arange(6, at::kFloat));
  json saved = json::parse(read_all(a));
  auto error_with = [&](const std::function<void(json&)>& edit) {
    json j = saved;
    edit(j);
    write_all(a, j.dump());
    return error_of([&] { load(a); });
  };
  EXPECT_CONTAINS(error_with([](json& j) { j.erase("constants_sha1"); }),
                  "$: constants_size and constants_sha1 come together");
  EXPECT_CONTAINS(error_with([](json& j) { j["constants_size"] = -1; }),
                  "$.constants_size: expected a size of 0 or more");
  EXPECT_CONTAINS(error_with([](json& j) { j["constants_size"] = "12"; }), "$.constants_size: expected an integer");
  EXPECT_CONTAINS(error_with([](json& j) { j["constants_sha1"] = "ABC"; }),
                  "$.constants_sha1: expected 40 lowercase hex digits");
  // Graph files written before jvpc recorded them load as they did, unchecked.
  json old = saved;
  old.erase("constants_size");
  old.erase("constants_sha1");
  write_all(a, old.dump());
  EXPECT_TRUE(load(a)->inputs()[1].data.equal(at::arange(6, at::kFloat)));
}

}  // namespace
}  // namespace jvpc
