// block: a pre-norm transformer block.
//   h = x + W_o · attention(split_heads(W_qkv · LayerNorm1(x)))
//   y = h + MLP(LayerNorm2(h))
#include "examples/common.h"

namespace jvpc::examples {
namespace {

struct BlockFlags {
  Common c;
  int64_t head_dim = 64;
  bool causal = false;
};

void add_flags(CLI::App& app, BlockFlags& f) {
  add_common_flags(app, f.c, true);
  app.add_option("--head-dim", f.head_dim, "head dimension; heads = model-dim / head-dim")
      ->capture_default_str()
      ->check(flags::kPositive);
  app.add_flag("--causal", f.causal, "causal self-attention");
}

Instance make_block(const std::vector<std::string>& args) {
  BlockFlags f;
  CLI::App app("block");
  add_flags(app, f);
  parse(app, "block", args);
  int64_t d = f.c.model_dim, b = f.c.bsz, s = f.c.seq_len;
  if (d % f.head_dim) throw Error("block: --model-dim must be a multiple of --head-dim");
  int64_t heads = d / f.head_dim, hd = f.head_dim;
  Instance inst;
  inst.name = "block";
  inst.description = "block bsz=" + std::to_string(b) + " seq=" + std::to_string(s) +
                     " model_dim=" + std::to_string(d) + " heads=" + std::to_string(heads) +
                     (f.causal ? " causal" : "");
  resolve(f.c, inst);
  inst.description += " backend=" + f.c.backend;
  at::Generator gen = at::detail::createCPUGenerator(f.c.seed);
  double sd = 1.0 / std::sqrt(double(d)), sh = 1.0 / std::sqrt(4.0 * double(d));
  inst.inputs = {{"x", randn(gen, {b, s, d}, inst)},        {"ln1_w", randn(gen, {d}, inst, 0.1).add_(1.0)},
                 {"ln1_b", randn(gen, {d}, inst, 0.1)},     {"w_qkv", randn(gen, {3 * d, d}, inst, sd)},
                 {"b_qkv", randn(gen, {3 * d}, inst, 0.1)}, {"w_o", randn(gen, {d, d}, inst, sd)},
                 {"b_o", randn(gen, {d}, inst, 0.1)},       {"ln2_w", randn(gen, {d}, inst, 0.1).add_(1.0)},
                 {"ln2_b", randn(gen, {d}, inst, 0.1)},     {"w1", randn(gen, {4 * d, d}, inst, sd)},
                 {"b1", randn(gen, {4 * d}, inst, 0.1)},    {"w2", randn(gen, {d, 4 * d}, inst, sh)},
                 {"b2", randn(gen, {d}, inst, 0.1)}};
  bool causal = f.causal;
  inst.make_fn = [=](Backend backend) -> TensorFn {
    return [=](const std::vector<at::Tensor>& p) {
      BackendScope scope(backend);
      const at::Tensor& x = p.at(0);
      at::Tensor a = at::layer_norm(x, {d}, p.at(1), p.at(2));
      at::Tensor qkv = at::linear(a, p.at(3), p.at(4)).view({b, s, 3, heads, hd}).permute({2, 0, 3, 1, 4});
      auto parts = qkv.unbind(0);
      at::Tensor o = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], std::nullopt, 0.0, causal);
      o = o.transpose(1, 2).reshape({b, s, d});
      at::Tensor h = x + at::linear(o, p.at(5), p.at(6));
      at::Tensor m = at::layer_norm(h, {d}, p.at(7), p.at(8));
      m = at::linear(at::gelu(at::linear(m, p.at(9), p.at(10))), p.at(11), p.at(12));
      return std::vector<at::Tensor>{h + m};
    };
  };
  return inst;
}

std::string help_block() {
  BlockFlags f;
  CLI::App app(
      "pre-norm transformer block: LayerNorm, QKV projection, SDPA, output projection, residual, "
      "LayerNorm, MLP, residual",
      "block");
  add_flags(app, f);
  return app.help();
}

}  // namespace

Registration block_example() {
  return {"block", "pre-norm transformer block on x [bsz, seq, model_dim]", make_block, help_block};
}

}  // namespace jvpc::examples
