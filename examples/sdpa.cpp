// sdpa: at::scaled_dot_product_attention, with the seed script's flags and sizes.
#include "examples/common.h"

namespace jvpc::examples {
namespace {

struct SdpaFlags {
  Common c;
  int64_t head_dim = 64;
  int64_t kv_seq_len = 0;  // 0: same as --seq-len
  int64_t kv_heads = 0;    // 0: same as the query heads
  bool causal = false;
  std::string mask = "none";
  std::optional<double> scale;
};

void add_flags(CLI::App& app, SdpaFlags& f) {
  add_common_flags(app, f.c, true);
  app.add_option("--head-dim", f.head_dim, "head dimension; heads = model-dim / head-dim")
      ->capture_default_str()
      ->check(flags::kPositive);
  app.add_option("--kv-seq-len", f.kv_seq_len, "key/value sequence length (default: --seq-len)")
      ->check(flags::kPositive);
  app.add_option("--kv-heads", f.kv_heads, "key/value heads, for grouped-query attention (default: all heads)")
      ->check(flags::kPositive);
  app.add_flag("--causal", f.causal, "causal attention");
  app.add_option("--mask", f.mask,
                 "attention mask: none|bool|float (an input, not differentiated unless --wrt names it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "bool", "float"}));
  app.add_option("--scale", f.scale, "softmax scale (default: 1/sqrt(head-dim))")->check(flags::kFinite);
}

Instance make_sdpa(const std::vector<std::string>& args) {
  SdpaFlags f;
  CLI::App app("sdpa");
  add_flags(app, f);
  parse(app, "sdpa", args);
  if (f.c.model_dim % f.head_dim) throw Error("sdpa: --model-dim must be a multiple of --head-dim");
  int64_t heads = f.c.model_dim / f.head_dim;
  int64_t kv_heads = f.kv_heads ? f.kv_heads : heads;
  if (heads % kv_heads)
    throw Error("sdpa: the query heads (" + std::to_string(heads) + ") must be a multiple of --kv-heads");
  int64_t kv_len = f.kv_seq_len ? f.kv_seq_len : f.c.seq_len;
  if (f.causal && f.mask != "none") throw Error("sdpa: --causal and --mask cannot be combined (LibTorch rejects it)");

  Instance inst;
  inst.name = "sdpa";
  inst.description =
      "sdpa bsz=" + std::to_string(f.c.bsz) + " heads=" + std::to_string(heads) +
      (kv_heads != heads ? " kv_heads=" + std::to_string(kv_heads) : "") + " seq=" + std::to_string(f.c.seq_len) +
      (kv_len != f.c.seq_len ? " kv_seq=" + std::to_string(kv_len) : "") + " head_dim=" + std::to_string(f.head_dim) +
      (f.causal ? " causal" : "") + (f.mask != "none" ? " mask=" + f.mask : "");
  resolve(f.c, inst);
  inst.description += " backend=" + f.c.backend;
  at::Generator gen = at::detail::createCPUGenerator(f.c.seed);
  inst.inputs = {{"q", randn(gen, {f.c.bsz, heads, f.c.seq_len, f.head_dim}, inst)},
                 {"k", randn(gen, {f.c.bsz, kv_heads, kv_len, f.head_dim}, inst)},
                 {"v", randn(gen, {f.c.bsz, kv_heads, kv_len, f.head_dim}, inst)}};
  if (f.mask == "bool") {
    // Random keep-pattern; column 0 is always kept so that no row is fully masked.
    at::Tensor m = at::rand({f.c.seq_len, kv_len}, gen) < 0.8;
    m.select(1, 0).fill_(true);
    inst.inputs.push_back({"mask", m.to(inst.device), false});
  } else if (f.mask == "float") {
    inst.inputs.push_back({"mask", randn(gen, {f.c.seq_len, kv_len}, inst), false});
  }
  bool has_mask = f.mask != "none", causal = f.causal, gqa = kv_heads != heads;
  std::optional<double> scale = f.scale;
  inst.make_fn = [=](Backend b) -> TensorFn {
    return [=](const std::vector<at::Tensor>& x) {
      BackendScope scope(b);
      std::optional<at::Tensor> mask;
      if (has_mask) mask = x.at(3);
      return std::vector<at::Tensor>{
          at::scaled_dot_product_attention(x.at(0), x.at(1), x.at(2), mask, 0.0, causal, scale, gqa)};
    };
  };
  return inst;
}

std::string help_sdpa() {
  SdpaFlags f;
  CLI::App app("scaled dot-product attention (seed defaults: --bsz 1 --model-dim 320 --head-dim 64 --seq-len 128)",
               "sdpa");
  add_flags(app, f);
  return app.help();
}

}  // namespace

Registration sdpa_example() {
  return {"sdpa", "at::scaled_dot_product_attention on q, k, v [bsz, heads, seq, head_dim]", make_sdpa, help_sdpa};
}

}  // namespace jvpc::examples
