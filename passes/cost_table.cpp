#include "passes/cost_table.h"

#include <chrono>
#include <cstdio>
#include <ostream>

namespace jvpc {

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1000000000)
    std::snprintf(buf, sizeof buf, "%.3fG", static_cast<double>(n) / 1e9);
  else if (n >= 1000000)
    std::snprintf(buf, sizeof buf, "%.3fM", static_cast<double>(n) / 1e6);
  else if (n >= 1000)
    std::snprintf(buf, sizeof buf, "%.3fK", static_cast<double>(n) / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

std::string human_bytes(int64_t n) {
  char buf[32];
  double d = static_cast<double>(n);
  if (n >= (1LL << 30))
    std::snprintf(buf, sizeof buf, "%.2fGiB", d / (1LL << 30));
  else if (n >= (1LL << 20))
    std::snprintf(buf, sizeof buf, "%.2fMiB", d / (1LL << 20));
  else if (n >= (1LL << 10))
    std::snprintf(buf, sizeof buf, "%.1fKiB", d / (1LL << 10));
  else
    std::snprintf(buf, sizeof buf, "%lldB", static_cast<long long>(n));
  return buf;
}

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void CostTable::start(const Graph& g) {
  auto t0 = std::chrono::steady_clock::now();
  rows_.push_back({first_, graph_cost(g)});
  ms_ += ms_since(t0);
}

void CostTable::after_pass(const std::string& pass, const Graph& g, bool changed) {
  auto t0 = std::chrono::steady_clock::now();
  // A pass that changed nothing leaves the cost as it was (constants may still be rebound by
  // none: passes change graphs only).
  rows_.push_back({pass, changed || rows_.empty() ? graph_cost(g) : rows_.back().cost});
  ms_ += ms_since(t0);
}

void print_cost_rows(const std::vector<CostRow>& rows, std::ostream& os) {
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %6s %12s %12s %10s %10s %10s %10s %10s\n", "pass", "nodes", "matmul_flops",
                "other_flops", "transc", "bytes", "residual", "aliased", "peak");
  os << line;
  for (const CostRow& r : rows) {
    const GraphCost& c = r.cost;
    std::snprintf(line, sizeof line, "%-20s %6lld %12s %12s %10s %10s %10s %10s %10s\n", r.pass.c_str(),
                  static_cast<long long>(c.nodes), human_count(c.matmul_flops).c_str(),
                  human_count(c.other_flops).c_str(), human_count(c.transcendentals).c_str(),
                  human_bytes(c.bytes).c_str(), human_bytes(c.residual_bytes).c_str(),
                  human_bytes(c.aliased_input_bytes).c_str(), human_bytes(c.peak_bytes).c_str());
    os << line;
  }
}

}  // namespace jvpc
