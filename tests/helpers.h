// Shared test helpers.
#pragma once

#include "compiler/api/reference.h"
#include "ir/graph.h"
#include "ir/ops.h"
#include "examples/examples.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

namespace jvpc::test {

/// Example configurations the tests sweep: every example and every SDPA variant, on CPU.
inline std::vector<std::vector<std::string>> example_configs() {
  return {
      {"sdpa"},
      {"sdpa", "--causal"},
      {"sdpa", "--mask", "bool"},
      {"sdpa", "--mask", "float", "--kv-seq-len", "96"},
      {"sdpa", "--kv-heads", "1"},
      {"sdpa", "--scale", "0.3", "--seq-len", "64"},
      {"sdpa", "--backend", "flash"},
      {"sdpa", "--backend", "flash", "--causal", "--kv-heads", "5", "--seq-len", "80", "--kv-seq-len", "112"},
      {"mlp"},
      {"block"},
      {"block", "--causal", "--backend", "flash"},
  };
}

/// Builds an example on the CPU: the first entry is the name, the rest its flags.
inline examples::Instance make_example(const std::vector<std::string>& cfg,
                                       const std::vector<std::string>& extra = {}) {
  std::vector<std::string> flags(cfg.begin() + 1, cfg.end());
  flags.push_back("--device");
  flags.push_back("cpu");
  flags.insert(flags.end(), extra.begin(), extra.end());
  return examples::make(cfg[0], flags);
}

inline std::string config_name(const std::vector<std::string>& cfg) {
  std::string s;
  for (const auto& a : cfg) s += (s.empty() ? "" : " ") + a;
  return s;
}

inline std::vector<at::Tensor> values_of(const std::vector<TraceInput>& in) {
  std::vector<at::Tensor> v;
  for (const auto& i : in) v.push_back(i.value);
  return v;
}

/// Contiguous float32 CPU metadata of `sizes`.
inline TensorMeta f32(std::vector<int64_t> sizes) {
  return TensorMeta::contiguous(std::move(sizes), c10::kFloat, c10::kCPU);
}

/// A temporary file path of the running test alone (ctest runs tests, parameterized cases too,
/// in parallel processes, and two checkouts may run the same test at once: the process id).
inline std::string temp_path(const std::string& suffix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& ch : name)
    if (!isalnum(static_cast<unsigned char>(ch)) && ch != '.') ch = '_';
  return ::testing::TempDir() + "jvpc_" + std::to_string(getpid()) + "_" + name + "_" + suffix;
}

/// Runs f and expects a jvpc::Error whose message contains `fragment`.
inline void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error (expected: " << fragment << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

/// Whether the LibTorch jvpc runs on has the op ("aten::name.overload"): the rule tables keep ops
/// that some supported release lacks (aten::cholesky, which LibTorch 2.15 removed), and tests of
/// them are left out there.
inline bool has_op(const std::string& name) {
  try {
    op_info(name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

/// ‖a − b‖ / ‖b‖ in float64.
inline double rel_error(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = real_pairs(a), y = real_pairs(b);
  double den = y.norm().item<double>();
  double num = (x - y).norm().item<double>();
  return den > 0 ? num / den : num;
}

}  // namespace jvpc::test
