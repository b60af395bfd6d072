// The table of rule cases the JVP rule tests share: each case is a callable on float64 inputs
// whose trace contains the op under test (test_jvp_rules.cpp checks each rule against forward AD
// and central differences; test_rule_graphs.cpp checks every case's graphs as files, as text,
// under the list of loadable ops, and batched).
#pragma once

#include "compiler/trace/tracer.h"

#include <functional>
#include <string>
#include <vector>

namespace jvpc::test {

using Shapes = std::vector<std::vector<int64_t>>;
using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct RuleCase {
  std::string op;  ///< the op whose rule is exercised (must appear in the trace)
  Shapes shapes;   ///< float64 inputs, all differentiated
  Fn fn;
  Fn reference = nullptr;  ///< what forward AD runs, when it differs (fused kernels)
  bool positive = false;   ///< inputs in (0.5, 1.5) (log, sqrt, pow)
  size_t ad_outputs = 99;  ///< outputs LibTorch's forward AD defines (the rest: central differences only; 0: none)
  bool central_differences = true;  ///< false where differences see through the op (detach)
};

/// Complex rules (complex.cpp) and the rules marked as holding for complex tensors: inputs
/// whose shape is listed in `complex` are complex128, the others float64.
struct ComplexCase {
  std::string op;
  Shapes shapes;
  std::vector<bool> complex;
  Fn fn;
};

/// The seed a random op's case sets before each evaluation of its function (the trace, forward AD,
/// every difference), so that each sees the same draw; what runs a program's graph (which holds
/// no seeding) sets it first.
constexpr uint64_t kRandomCaseSeed = 20;

/// The real cases, one or more per rule.
std::vector<RuleCase> cases();
const std::vector<ComplexCase>& complex_cases();

/// A callable of one result.
Fn one(std::function<at::Tensor(const std::vector<at::Tensor>&)> f);

/// Every rule case, real and complex, with seeded float64 primals "x0", "x1", ... (positive
/// where the case asks), and a name for messages.
void for_each_case(const std::function<void(const Fn&, const std::vector<TraceInput>&, const std::string&)>& f);

}  // namespace jvpc::test
