#include <ATen/ATen.h>
#include "compiler/api/linearize.h"
#include "compiler/api/reference.h"
#include "compiler/ir/printer.h"
#include "examples/examples.h"
#include <iostream>
int main(int argc, char** argv) { try {
  std::vector<std::string> args(argv + 2, argv + argc);
  auto ex = jvpc::examples::make(argv[1], args);
  auto lin = jvpc::linearize(ex.fn(), ex.inputs);

  jvpc::CostTable t; 
  for (auto& r : lin.report.passes) std::cout << r.pass << " nodes=" << r.cost.nodes << " mm=" << r.cost.matmul_flops << " res=" << r.cost.residual_bytes << " alias=" << r.cost.aliased_input_bytes << "\n";
  std::cout << "linearize mm flops " << lin.report.linearize_matmul_flops << " fwd " << lin.report.forward.matmul_flops << "\n";
  std::cout << jvpc::to_text(*lin.tangent_graph);
  std::vector<at::Tensor> tans; std::vector<std::optional<at::Tensor>> otans; std::vector<at::Tensor> prim;
  for (auto& in : ex.inputs) { prim.push_back(in.value); if (in.differentiable) { auto t = at::randn(in.value.sizes(), in.value.options()); tans.push_back(t); otans.push_back(t);} else otans.push_back(std::nullopt); }
  auto got = lin.jvp(tans);
  auto ref = jvpc::forward_ad_jvp(ex.make_fn(jvpc::examples::Backend::Math), prim, otans);
  auto e = jvpc::compare(got, ref);
  std::cout << "rel " << e.rel_error << " max " << e.max_abs_error << "\n"; } catch (const std::exception& e) { std::cout << "ERR " << e.what() << "\n"; return 2; }
}
