// The compile report as JSON: the one form `jvpc linearize --report` writes (with the check's
// results beside it) and jvpc_fn.report() returns in Python.
//
//   {"passes": [{"name": "trace", "nodes": ..., "matmul_flops": ...}, ...],   // cost after each pass
//    "timing_ms": [{"pass", "run", "verify"}, ...],
//    "phases_ms": {"trace": ms, "passes": ms, ...},                         // CompileReport::phases
//    "forward": {cost}, "linearize": {"matmul_flops", "matmul_flops_by_op"},
//    "jvp": {cost, "tangents": ["dq", ...]},
//    "attention": [{"node", "choice": "P" | "O(L)", "reason", "residual_bytes", "peak_bytes",
//                   "matmul_flops", "forms": {"P": {...}, "O(L)": {...}}}, ...]}
#pragma once

#include "compiler/api/linearize.h"

#include <nlohmann/json.hpp>

#include <ostream>

namespace jvpc {

/// The compile report of `lin` (see above): costs as to_json(GraphCost) writes them, per-pass
/// rows without their op counts.
nlohmann::json report_json(const Linearized& lin);

/// The phases' times as a table (--timing, after the passes').
void print_phases(const std::vector<PhaseTime>& phases, std::ostream& os);

}  // namespace jvpc
