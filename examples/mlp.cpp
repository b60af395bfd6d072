// mlp: linear, GELU, linear.
#include "examples/common.h"

namespace jvpc::examples {
namespace {

struct MlpFlags {
  Common c;
  int64_t hidden = 0;  // 0: 4 * model-dim
};

void add_flags(CLI::App& app, MlpFlags& f) {
  add_common_flags(app, f.c, false);
  app.add_option("--hidden-dim", f.hidden, "hidden width (default: 4 * model-dim)")->check(flags::kPositive);
}

Instance make_mlp(const std::vector<std::string>& args) {
  MlpFlags f;
  CLI::App app("mlp");
  add_flags(app, f);
  parse(app, "mlp", args);
  int64_t d = f.c.model_dim, h = f.hidden ? f.hidden : 4 * d;
  Instance inst;
  inst.name = "mlp";
  inst.description = "mlp bsz=" + std::to_string(f.c.bsz) + " seq=" + std::to_string(f.c.seq_len) +
                     " model_dim=" + std::to_string(d) + " hidden=" + std::to_string(h);
  resolve(f.c, inst);
  at::Generator gen = at::detail::createCPUGenerator(f.c.seed);
  inst.inputs = {{"x", randn(gen, {f.c.bsz, f.c.seq_len, d}, inst)},
                 {"w1", randn(gen, {h, d}, inst, 1.0 / std::sqrt(double(d)))},
                 {"b1", randn(gen, {h}, inst, 0.1)},
                 {"w2", randn(gen, {d, h}, inst, 1.0 / std::sqrt(double(h)))},
                 {"b2", randn(gen, {d}, inst, 0.1)}};
  inst.make_fn = [](Backend) -> TensorFn {
    return [](const std::vector<at::Tensor>& x) {
      at::Tensor hdn = at::gelu(at::linear(x.at(0), x.at(1), x.at(2)));
      return std::vector<at::Tensor>{at::linear(hdn, x.at(3), x.at(4))};
    };
  };
  return inst;
}

std::string help_mlp() {
  MlpFlags f;
  CLI::App app("two-layer MLP: linear, GELU, linear", "mlp");
  add_flags(app, f);
  return app.help();
}

}  // namespace

Registration mlp_example() {
  return {"mlp", "linear -> GELU -> linear on x [bsz, seq, model_dim]", make_mlp, help_mlp};
}

}  // namespace jvpc::examples
