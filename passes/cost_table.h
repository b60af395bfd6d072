// The cost report of a pipeline: one row per pass (and one for the input graph), printed as a
// table and available as data for --report.
#pragma once

#include "ir/cost/cost_model.h"
#include "passes/pass.h"

#include <iosfwd>

namespace jvpc {

struct CostRow {
  std::string pass;
  GraphCost cost;
};

/// Prints rows as the pipeline's cost table.
void print_cost_rows(const std::vector<CostRow>& rows, std::ostream& os);

class CostTable : public PassObserver {
 public:
  explicit CostTable(std::string first_row = "input") : first_(std::move(first_row)) {}
  void start(const Graph& g) override;
  void after_pass(const std::string& pass, const Graph& g, bool changed) override;
  const std::vector<CostRow>& rows() const { return rows_; }
  /// Wall time spent counting the rows, in ms.
  double ms() const { return ms_; }
  void print(std::ostream& os) const { print_cost_rows(rows_, os); }

 private:
  std::string first_;
  std::vector<CostRow> rows_;
  double ms_ = 0;
};

/// 20971520 -> "20.972M" (as FlopCounterMode prints), bytes -> "640.0KiB".
std::string human_count(int64_t n);
std::string human_bytes(int64_t n);

}  // namespace jvpc
