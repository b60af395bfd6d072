// jvpc::attention_tangent, the O(L) form of attention's tangent (runtime/attention_tangent.h):
// exact against LibTorch's forward AD through the math definition and central differences in
// float64, for every variant (causal, boolean and float masks with the mask's tangent, scale,
// grouped-query attention, Lq ≠ Lk, Dv ≠ D, batch > 1, blocks that do not divide L, a fully
// masked key block and query row), and so are its gradients (its Autograd kernel and
// jvpc::attention_tangent_backward) against reverse-mode autograd through the definition; its
// matmul FLOPs counted on the kernels it ran equal the cost model's; its Meta kernel gives the IR
// its shape; a graph that uses it saves, loads and runs.
#include "compiler/api/reference.h"
#include "ir/cost/cost_model.h"
#include "ir/cost/kernel_watch.h"
#include "ir/builder.h"
#include "ir/loadable_ops.h"
#include "ir/ops.h"
#include "ir/io/graph_files.h"
#include "runtime/attention_tangent.h"
#include "runtime/executable.h"
#include "tests/helpers.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>

namespace jvpc {
namespace {

struct Case {
  std::string name;
  int64_t B = 1, H = 2, Hkv = 2, Lq = 13, Lk = 13, D = 8, Dv = 8;
  std::string mask;  // "", "bool", "float"
  bool causal = false;
  std::optional<double> scale;
  int64_t block_q = 4, block_k = 5;
  bool dq = true, dk = true, dv = true, dmask = true;
  bool dead_block = false;  // a bool mask hides key block 1 entirely and query row 2
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

struct Operands {
  at::Tensor q, k, v, mask, dq, dk, dv, dmask;
  double scale;
};

Operands make_operands(const Case& c, at::ScalarType dt = at::kDouble) {
  at::manual_seed(7);
  auto o = at::TensorOptions().dtype(at::kDouble);
  Operands x;
  x.q = at::randn({c.B, c.H, c.Lq, c.D}, o);
  x.k = at::randn({c.B, c.Hkv, c.Lk, c.D}, o);
  x.v = at::randn({c.B, c.Hkv, c.Lk, c.Dv}, o);
  if (c.dq) x.dq = at::randn_like(x.q);
  if (c.dk) x.dk = at::randn_like(x.k);
  if (c.dv) x.dv = at::randn_like(x.v);
  if (c.mask == "bool") {
    x.mask = at::rand({c.B, 1, c.Lq, c.Lk}, o).gt(0.3);
    x.mask.select(3, 0).fill_(true);  // every row keeps a key unless asked otherwise
    if (c.dead_block) {
      x.mask.narrow(3, c.block_k, std::min(c.block_k, c.Lk - c.block_k)).fill_(false);
      x.mask.select(2, 2).fill_(false);
    }
  } else if (c.mask == "float") {
    x.mask = at::randn({c.Lq, c.Lk}, o);
    if (c.dmask) x.dmask = at::randn_like(x.mask);
  }
  for (at::Tensor* t : {&x.q, &x.k, &x.v, &x.dq, &x.dk, &x.dv, &x.mask, &x.dmask})
    if (t->defined() && t->scalar_type() == at::kDouble) *t = t->to(dt);
  x.scale = c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  return x;
}

// The math definition, in the accumulation type: S, and out = softmax(S)·v.
at::Tensor scores(const Case& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, double scale) {
  at::ScalarType acc = at::isReducedFloatingType(q.scalar_type()) ? at::kFloat : q.scalar_type();
  at::Tensor kr = k.repeat_interleave(c.H / c.Hkv, 1);
  at::Tensor s = at::matmul(q.to(acc), kr.to(acc).transpose(-2, -1)) * scale;
  if (mask.defined())
    s = mask.scalar_type() == at::kBool ? s.masked_fill(mask.logical_not(), -INFINITY) : s + mask.to(acc);
  if (c.causal) s = s.masked_fill(at::ones({c.Lq, c.Lk}, at::kBool).triu(1), -INFINITY);
  return s;
}
at::Tensor attention(const Case& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& mask, double scale) {
  at::Tensor p = at::softmax(scores(c, q, k, mask, scale), -1);
  p = at::where(p.isnan(), at::zeros({}, p.options()), p);  // a fully masked row: 0 (and its tangent)
  return at::matmul(p, v.repeat_interleave(c.H / c.Hkv, 1).to(p.scalar_type())).to(q.scalar_type());
}

at::Tensor call_op(const Case& c, const Operands& x, at::Tensor* out_primal = nullptr) {
  at::Tensor s = scores(c, x.q, x.k, x.mask, x.scale);
  at::Tensor lse = at::logsumexp(s, -1);
  at::Tensor out = attention(c, x.q, x.k, x.v, x.mask, x.scale);
  if (out_primal) *out_primal = out;
  auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("jvpc::attention_tangent", "")
                .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                  const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                  const std::optional<at::Tensor>&, bool, double, int64_t, int64_t)>();
  return op.call(x.q, x.k, x.v, out, lse, opt(x.dq), opt(x.dk), opt(x.dv), opt(x.mask), opt(x.dmask), c.causal, x.scale,
                 c.block_q, c.block_k);
}

// The reference: forward AD (or central differences) of the math definition.
std::vector<at::Tensor> reference(const Case& c, const Operands& x, bool central) {
  TensorFn fn = [c, x](const std::vector<at::Tensor>& a) {
    at::Tensor mask = x.mask.defined() && x.mask.scalar_type() != at::kBool ? a[3] : x.mask;
    return std::vector<at::Tensor>{attention(c, a[0], a[1], a[2], mask, x.scale)};
  };
  std::vector<at::Tensor> primals = {
      x.q, x.k, x.v, x.mask.defined() && x.mask.scalar_type() != at::kBool ? x.mask : at::zeros({1}, at::kDouble)};
  auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  std::vector<std::optional<at::Tensor>> tangents = {opt(x.dq), opt(x.dk), opt(x.dv), opt(x.dmask)};
  return central ? central_differences_jvp(fn, primals, tangents) : forward_ad_jvp(fn, primals, tangents);
}

Case named(const std::string& name) {
  Case c;
  c.name = name;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back(named("plain"));
  Case c;
  c = named("causal"), c.causal = true, v.push_back(c);
  c = named("causal_long_keys"), c.causal = true, c.Lk = 21, v.push_back(c);
  c = named("bool_mask"), c.mask = "bool", v.push_back(c);
  c = named("float_mask_and_tangent"), c.mask = "float", v.push_back(c);
  c = named("float_mask_no_tangent"), c.mask = "float", c.dmask = false, v.push_back(c);
  c = named("scale"), c.scale = 0.3, v.push_back(c);
  c = named("gqa"), c.H = 6, c.Hkv = 2, c.causal = true, v.push_back(c);
  c = named("mqa_mask"), c.H = 4, c.Hkv = 1, c.mask = "float", v.push_back(c);
  c = named("lq_ne_lk"), c.Lq = 7, c.Lk = 19, v.push_back(c);
  c = named("dv_ne_d"), c.Dv = 5, v.push_back(c);
  c = named("batch"), c.B = 3, c.mask = "bool", v.push_back(c);
  c = named("one_block"), c.block_q = 64, c.block_k = 64, c.causal = true, v.push_back(c);
  c = named("dead_key_block_and_row"), c.mask = "bool", c.dead_block = true, c.Lk = 17, v.push_back(c);
  c = named("only_dv"), c.dq = c.dk = false, v.push_back(c);
  c = named("only_dq"), c.dk = c.dv = false, c.causal = true, v.push_back(c);
  c = named("only_dmask"), c.dq = c.dk = c.dv = false, c.mask = "float", v.push_back(c);
  return v;
}

class AttentionTangent : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTangent, MatchesForwardAdAndCentralDifferencesInFloat64) {
  const Case& c = GetParam();
  Operands x = make_operands(c);
  at::Tensor got = call_op(c, x);
  ASSERT_TRUE(got.isfinite().all().item<bool>());
  ErrorStats ad = compare({got}, reference(c, x, false));
  EXPECT_LT(ad.rel_error, 1e-10) << "vs forward AD";
  ErrorStats cd = compare({got}, reference(c, x, true));
  EXPECT_LT(cd.rel_error, 1e-7) << "vs central differences";
  if (c.dead_block) {  // the masked row's tangent is exactly 0
    EXPECT_EQ(got.select(2, 2).abs().max().item<double>(), 0.0);
  }
}

TEST_P(AttentionTangent, MatmulFlopsCountedOnItsKernelsEqualTheCostModel) {
  const Case& c = GetParam();
  Operands x = make_operands(c);
  at::Tensor out;
  AttentionTangentShape a;
  a.B = c.B, a.H = c.H, a.Hkv = c.Hkv, a.Lq = c.Lq, a.Lk = c.Lk, a.D = c.D, a.Dv = c.Dv;
  a.dq = c.dq, a.dk = c.dk, a.dv = c.dv, a.mask = !c.mask.empty(), a.dmask = x.dmask.defined();
  a.causal = c.causal, a.block_q = c.block_q, a.block_k = c.block_k;
  at::Tensor s = scores(c, x.q, x.k, x.mask, x.scale);
  at::Tensor lse = at::logsumexp(s, -1);
  out = attention(c, x.q, x.k, x.v, x.mask, x.scale);
  auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("jvpc::attention_tangent", "");
  std::vector<c10::IValue> stack = {x.q,       x.k,         x.v,          out,      lse,     opt(x.dq), opt(x.dk),
                                    opt(x.dv), opt(x.mask), opt(x.dmask), c.causal, x.scale, c.block_q, c.block_k};
  KernelWatch watch;
  op.callBoxed(stack);
  EXPECT_EQ(watch.matmul_flops(), attention_tangent_matmul_flops(a));
  EXPECT_EQ(watch.kernels(), std::vector<std::string>{"jvpc::attention_tangent"});
  EXPECT_GT(watch.matmul_flops(), 0);
}

// The tangent by the math definition, differentiable by reverse-mode autograd: P ⊙ (dS − c)·v +
// P·dv, with P = 0 on a row whose every key is masked.
at::Tensor tangent_by_definition(const Case& c, const Operands& x) {
  at::Tensor s = scores(c, x.q, x.k, x.mask, x.scale);
  at::Tensor alive = s.detach().logsumexp(-1, true).isfinite();
  s = at::where(alive, s, at::zeros({}, s.options()));
  at::Tensor p = at::where(alive, (s - s.logsumexp(-1, true)).exp(), at::zeros({}, s.options()));
  const int64_t g = c.H / c.Hkv;
  at::Tensor ds = at::zeros_like(p);
  if (x.dq.defined()) ds = ds + at::matmul(x.dq, x.k.repeat_interleave(g, 1).transpose(-2, -1)) * x.scale;
  if (x.dk.defined()) ds = ds + at::matmul(x.q, x.dk.repeat_interleave(g, 1).transpose(-2, -1)) * x.scale;
  if (x.dmask.defined()) ds = ds + x.dmask;
  at::Tensor pds = p * ds, v = x.v.repeat_interleave(g, 1);
  at::Tensor dout = at::matmul(pds, v) - pds.sum(-1, true) * at::matmul(p, v);
  if (x.dv.defined()) dout = dout + at::matmul(p, x.dv.repeat_interleave(g, 1));
  return dout;
}

// dout.backward() from C++ through the operator's Autograd kernel (its backward,
// jvpc::attention_tangent_backward) gives autograd's gradients through the math definition.
TEST_P(AttentionTangent, BackwardMatchesAutogradThroughTheDefinitionInFloat64) {
  const Case& c = GetParam();
  Operands x = make_operands(c);
  std::vector<at::Tensor> wrt;
  for (at::Tensor* t : {&x.q, &x.k, &x.v, &x.dq, &x.dk, &x.dv})
    if (t->defined()) wrt.push_back(t->requires_grad_());
  at::Tensor want = tangent_by_definition(c, x);
  at::Tensor grad = at::randn_like(want);
  std::vector<at::Tensor> expected = torch::autograd::grad({want}, wrt, {grad});
  at::Tensor got = call_op(c, x);
  ASSERT_TRUE(got.requires_grad());
  got.backward(grad);
  for (size_t i = 0; i < wrt.size(); ++i) {
    ASSERT_TRUE(wrt[i].grad().defined()) << i;
    EXPECT_TRUE(wrt[i].grad().isfinite().all().item<bool>()) << i;
    EXPECT_LT(compare({wrt[i].grad()}, {expected[i]}).rel_error, 1e-10) << "gradient " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, AttentionTangent, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Counts at the seed's size (B1 H5 L128 D64): 5 bmms per block against the P form's 4.
TEST(AttentionTangentCost, SeedSizeFiveMatmulsAgainstFour) {
  AttentionTangentShape a;
  a.B = 1, a.H = a.Hkv = 5, a.Lq = a.Lk = 128, a.D = a.Dv = 64;
  a.dq = a.dk = a.dv = true;
  a.block_q = 48, a.block_k = 40;  // blocks that do not divide L
  EXPECT_EQ(attention_tangent_matmul_flops(a), 52428800);
  EXPECT_EQ(2LL * 5 * 128 * 128 * (2 * 64 + 2 * 64), 41943040);  // holding P
  // Causal: the pairs of blocks that run, counted by hand. Query blocks [0,48) [48,96) [96,128);
  // key blocks of 40: the first needs keys up to 47 (2 blocks, 80 keys), the second up to 95
  // (3 blocks, 120), the third all 128.
  a.causal = true;
  EXPECT_EQ(attention_tangent_score_elements(a), 48 * 80 + 48 * 120 + 32 * 128);
  EXPECT_EQ(attention_tangent_matmul_flops(a), 2LL * 5 * (48 * 80 + 48 * 120 + 32 * 128) * (3 * 64 + 2 * 64));
}

TEST(AttentionTangentCost, MeasuredEqualsPredictedAtTheSeedSize) {
  for (bool causal : {false, true}) {
    for (int64_t block : {128, 48}) {
      Case c;
      c.H = c.Hkv = 5, c.Lq = c.Lk = 128, c.D = c.Dv = 64, c.causal = causal, c.block_q = block, c.block_k = block;
      at::manual_seed(1);
      auto f = at::TensorOptions().dtype(at::kFloat);
      at::Tensor q = at::randn({1, 5, 128, 64}, f), k = at::randn_like(q), v = at::randn_like(q);
      Case cc = c;
      at::Tensor s = scores(cc, q, k, at::Tensor(), 0.125);
      at::Tensor lse = at::logsumexp(s, -1), out = at::matmul(at::softmax(s, -1), v);
      auto op = c10::Dispatcher::singleton().findSchemaOrThrow("jvpc::attention_tangent", "");
      std::vector<c10::IValue> stack = {q,
                                        k,
                                        v,
                                        out,
                                        lse,
                                        at::randn_like(q),
                                        at::randn_like(k),
                                        at::randn_like(v),
                                        c10::IValue(),
                                        c10::IValue(),
                                        causal,
                                        0.125,
                                        block,
                                        block};
      KernelWatch watch;
      op.callBoxed(stack);
      AttentionTangentShape a;
      a.B = 1, a.H = a.Hkv = 5, a.Lq = a.Lk = 128, a.D = a.Dv = 64, a.dq = a.dk = a.dv = true;
      a.causal = causal, a.block_q = a.block_k = block;
      EXPECT_EQ(watch.matmul_flops(), attention_tangent_matmul_flops(a)) << causal << " " << block;
      if (causal && block < 128) {
        EXPECT_LT(watch.matmul_flops(), 52428800);
      } else {
        EXPECT_EQ(watch.matmul_flops(), 52428800);
      }
    }
  }
}

TEST(AttentionTangent, HalfAndBfloat16ComputeInFloat32) {
  for (at::ScalarType dt : {at::kHalf, at::kBFloat16}) {
    Case c;
    c.causal = true, c.mask = "float", c.H = 4, c.Hkv = 2;
    Operands x = make_operands(c, dt);
    at::Tensor got = call_op(c, x);
    EXPECT_EQ(got.scalar_type(), dt);
    Operands x64 = make_operands(c, at::kDouble);
    // The same numbers, rounded to dt, in float64: the float32 computation is close to it.
    for (at::Tensor* t : {&x64.q, &x64.k, &x64.v, &x64.dq, &x64.dk, &x64.dv, &x64.mask, &x64.dmask})
      if (t->defined()) *t = t->to(dt).to(at::kDouble);
    at::Tensor want = call_op(c, x64);
    EXPECT_LT(compare({got.to(at::kDouble)}, {want}).rel_error, 2e-2) << dt;
  }
}

TEST(AttentionTangent, BadOperandsAreOneLineErrors) {
  Case c;
  Operands x = make_operands(c);
  x.dq = at::randn({1, 2, 13, 7}, at::kDouble);
  try {
    call_op(c, x);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("dq must have the shape"), std::string::npos);
  }
}

// A graph node of it: shape inference by the Meta kernel, the cost model, the loadable list,
// and a save/load round trip that runs in the runtime.
TEST(AttentionTangent, GraphNodeInfersSavesLoadsAndRuns) {
  Case c;
  c.causal = true, c.mask = "float";
  Operands x = make_operands(c);
  at::Tensor out;
  at::Tensor want = call_op(c, x, &out);
  at::Tensor lse = at::logsumexp(scores(c, x.q, x.k, x.mask, x.scale), -1);
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  Value* q = g->add_constant("q", x.q);
  Value* k = g->add_constant("k", x.k);
  Value* v = g->add_constant("v", x.v);
  Value* o = g->add_constant("out", out);
  Value* l = g->add_constant("lse", lse);
  Value* m = g->add_constant("mask", x.mask);
  Value* dq = g->add_input("dq", TensorMeta::of(x.dq), Role::Tangent);
  Value* dk = g->add_input("dk", TensorMeta::of(x.dk), Role::Tangent);
  Value* dv = g->add_input("dv", TensorMeta::of(x.dv), Role::Tangent);
  Value* dm = g->add_input("dmask", TensorMeta::of(x.dmask), Role::Tangent);
  Value* r = b.call("jvpc::attention_tangent", {q, k, v, o, l, dq, dk, dv, m, dm, true, x.scale, c.block_q, c.block_k});
  EXPECT_EQ(r->meta().sizes, (std::vector<int64_t>{1, 2, 13, 8}));
  g->add_output(r, "dout");
  EXPECT_TRUE(is_loadable_op("jvpc::attention_tangent"));
  GraphCost cost = graph_cost(*g);
  AttentionTangentShape a = attention_tangent_shape(*g->nodes()[0]);
  EXPECT_EQ(cost.matmul_flops, attention_tangent_matmul_flops(a));
  EXPECT_GT(cost.workspace_bytes, 0);
  std::string path = test::temp_path("attn.json");
  save(*g, path);
  Executable f(load(path));
  auto got = f({x.dq, x.dk, x.dv, x.dmask});
  EXPECT_LT(compare(got, {want}).rel_error, 1e-12);
}

}  // namespace
}  // namespace jvpc
