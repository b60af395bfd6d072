// The compile report as JSON (report.h).
#include "compiler/api/report.h"

#include "ir/cost/cost_model.h"

#include <cstdio>

namespace jvpc {

void print_phases(const std::vector<PhaseTime>& phases, std::ostream& os) {
  char line[128];
  std::snprintf(line, sizeof line, "%-20s %10s\n", "phase", "ms");
  os << line;
  for (const PhaseTime& t : phases) {
    std::snprintf(line, sizeof line, "%-20s %10.3f\n", t.phase.c_str(), t.ms);
    os << line;
  }
}

nlohmann::json report_json(const Linearized& lin) {
  const CompileReport& r = lin.report;
  nlohmann::json rep;
  rep["passes"] = nlohmann::json::array();
  for (const auto& row : r.passes) {
    nlohmann::json j = to_json(row.cost);
    j.erase("ops");
    j["name"] = row.pass;
    rep["passes"].push_back(j);
  }
  rep["timing_ms"] = nlohmann::json::array();
  for (const PassTime& t : r.timings)
    rep["timing_ms"].push_back({{"pass", t.pass}, {"run", t.run_ms}, {"verify", t.verify_ms}});
  rep["phases_ms"] = nlohmann::json::object();
  for (const PhaseTime& t : r.phases) rep["phases_ms"][t.phase] = t.ms;
  rep["forward"] = to_json(r.forward);
  rep["random_ops"] = r.random_ops;
  rep["linearize"] = {{"matmul_flops", r.linearize_matmul_flops}, {"matmul_flops_by_op", r.linearize_matmul_by_op}};
  rep["jvp"] = to_json(r.tangent);
  rep["jvp"]["tangents"] = lin.tangent_names();
  rep["attention"] = nlohmann::json::array();
  for (const AttentionChoice& a : r.attention) {
    auto form = [](const AttentionChoice::Form& f) {
      return nlohmann::json{
          {"residual_bytes", f.residual_bytes}, {"peak_bytes", f.peak_bytes}, {"matmul_flops", f.matmul_flops}};
    };
    const AttentionChoice::Form& f = a.o_l_form ? a.o_l : a.p;
    rep["attention"].push_back({{"node", a.node},
                                {"choice", a.o_l_form ? "O(L)" : "P"},
                                {"reason", a.reason},
                                {"residual_bytes", f.residual_bytes},
                                {"peak_bytes", f.peak_bytes},
                                {"matmul_flops", f.matmul_flops},
                                {"forms", {{"P", form(a.p)}, {"O(L)", form(a.o_l)}}}});
  }
  return rep;
}

}  // namespace jvpc
