// jvpc::attention_tangent: the operator, its Meta kernel and their registration (see the header).
//
// One kernel serves every device (CompositeExplicitAutograd): it is written in ATen ops, so
// it runs on CPU and CUDA alike, and the bmms it calls are ordinary kernels that the profiler,
// KernelWatch and FlopCounterMode see inside it.
#include "runtime/attention_tangent.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

namespace jvpc::runtime {

void register_ops() {}

namespace {

struct Sizes {
  int64_t B, H, Hkv, G, Lq, Lk, D, Dv;
};

std::string shape(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
  return s + "]";
}

// Checks the operands against each other (the same checks on Meta tensors and real ones).
Sizes check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
            const std::optional<at::Tensor>& dq, const std::optional<at::Tensor>& dk,
            const std::optional<at::Tensor>& dv, const std::optional<at::Tensor>& mask,
            const std::optional<at::Tensor>& dmask, int64_t block_q, int64_t block_k) {
  const char* op = "jvpc::attention_tangent: ";
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, "q, k and v must be 4-d [B, H, L, D], got ", shape(q),
              ", ", shape(k), ", ", shape(v));
  Sizes s{q.size(0), q.size(1), k.size(1), 0, q.size(2), k.size(2), q.size(3), v.size(3)};
  TORCH_CHECK(k.size(0) == s.B && v.size(0) == s.B && v.size(1) == s.Hkv && v.size(2) == s.Lk && k.size(3) == s.D, op,
              "q ", shape(q), ", k ", shape(k), " and v ", shape(v), " do not fit together");
  TORCH_CHECK(s.Hkv > 0 && s.H % s.Hkv == 0, op, "the ", s.H, " query heads are not a multiple of the ", s.Hkv,
              " key heads");
  s.G = s.H / s.Hkv;
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), op, "q must be floating point, got ", q.scalar_type());
  for (const at::Tensor* t : {&k, &v, &out})
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), op, "q, k, v and out must have one dtype");
  TORCH_CHECK(out.sizes() == at::IntArrayRef({s.B, s.H, s.Lq, s.Dv}), op, "out must be [B, H, Lq, Dv] = [", s.B, ",",
              s.H, ",", s.Lq, ",", s.Dv, "], got ", shape(out));
  TORCH_CHECK(at::isFloatingType(lse.scalar_type()) && lse.numel() == s.B * s.H * s.Lq &&
                  (lse.dim() == 3 || (lse.dim() == 4 && lse.size(3) == 1)) && lse.size(0) == s.B &&
                  lse.size(1) == s.H && lse.size(2) == s.Lq,
              op, "lse must be [B, H, Lq] (or [B, H, Lq, 1]) floating point, got ", shape(lse));
  auto like = [&](const std::optional<at::Tensor>& t, const at::Tensor& x, const char* name) {
    if (!t || !t->defined()) return;
    TORCH_CHECK(t->sizes() == x.sizes() && t->scalar_type() == x.scalar_type(), op, name, " must have the shape ",
                shape(x), " and dtype of its primal, got ", shape(*t), " ", t->scalar_type());
  };
  like(dq, q, "dq");
  like(dk, k, "dk");
  like(dv, v, "dv");
  std::vector<int64_t> scores = {s.B, s.H, s.Lq, s.Lk};
  for (const auto* m : {&mask, &dmask}) {
    if (!*m || !(*m)->defined()) continue;
    TORCH_CHECK((*m)->dim() <= 4 && at::infer_size((*m)->sizes(), scores) == scores, op, "a mask ", shape(**m),
                " does not broadcast to the scores [", s.B, ",", s.H, ",", s.Lq, ",", s.Lk, "]");
  }
  if (mask && mask->defined())
    TORCH_CHECK(mask->scalar_type() == at::kBool || at::isFloatingType(mask->scalar_type()), op,
                "mask must be boolean or floating point, got ", mask->scalar_type());
  if (dmask && dmask->defined()) {
    TORCH_CHECK(at::isFloatingType(dmask->scalar_type()), op, "dmask must be floating point");
    TORCH_CHECK(mask && mask->defined() && mask->scalar_type() != at::kBool, op,
                "dmask is the tangent of a float mask, and there is none");
  }
  TORCH_CHECK(block_q > 0 && block_k > 0, op, "block sizes must be positive, got ", block_q, " and ", block_k);
  return s;
}

bool present(const std::optional<at::Tensor>& t) { return t && t->defined(); }

// The kernel, for K tangents at once: dq, dk, dv are [K, ...] of their primals' shapes (or
// undefined), dmask [K, ...] broadcastable to the scores; returns [K, B, H, Lq, Dv]. The scores
// and P of each block are computed once and shared by the K tangents; the K tangents' rows (dq,
// dS, the accumulators) are stacked in each bmm's rows, and their dk and dv blocks in its
// columns, so every bmm with a residual operand is one bmm for all K.
at::Tensor attention_tangent_k(const Sizes& s, int64_t K, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dq, const at::Tensor& dk,
                               const at::Tensor& dv, const std::optional<at::Tensor>& mask, const at::Tensor& dmask,
                               bool causal, double scale, int64_t block_q, int64_t block_k) {
  const int64_t B = s.B, H = s.H, Hkv = s.Hkv, G = s.G, Lq = s.Lq, Lk = s.Lk, Dv = s.Dv, D = s.D;
  at::Tensor result = at::empty({K, B, H, Lq, Dv}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const bool has_ds = dq.defined() || dk.defined() || dmask.defined();
  if ((!has_ds && !dv.defined()) || result.numel() == 0) return result.zero_();
  const at::ScalarType acc = at::isReducedFloatingType(q.scalar_type()) ? at::kFloat : q.scalar_type();
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t BH = B * Hkv;

  // [B, H, L, X] viewed as [B, Hkv, G, L, X]: query head h = hkv·G + g reads key head hkv.
  auto grouped = [&](const at::Tensor& x) { return x.reshape({B, Hkv, G, x.size(2), x.size(3)}); };
  // Rows [i0, i0 + n) of a grouped tensor as one bmm operand [B·Hkv, G·n, X] in `acc`.
  auto rows = [&](const at::Tensor& x5, int64_t i0, int64_t n) {
    return x5.narrow(3, i0, n).reshape({BH, G * n, x5.size(4)}).to(acc);
  };
  // Keys [j0, j0 + n) of k or v as [B·Hkv, n, X] in `acc`.
  auto keys = [&](const at::Tensor& x, int64_t j0, int64_t n) {
    return x.narrow(2, j0, n).reshape({BH, n, x.size(3)}).to(acc);
  };
  // The K tangents' rows [i0, i0 + n) of dq (grouped: [K, B, Hkv, G, L, X]) as [B·Hkv, K·G·n, X].
  auto rows_k = [&](const at::Tensor& x6, int64_t i0, int64_t n) {
    return x6.narrow(4, i0, n).permute({1, 2, 0, 3, 4, 5}).reshape({BH, K * G * n, x6.size(5)}).to(acc);
  };
  const at::Tensor q5 = grouped(q), out5 = grouped(out);
  const at::Tensor dq6 = dq.defined() ? dq.reshape({K, B, Hkv, G, Lq, D}) : at::Tensor();
  const at::Tensor lse5 = lse.reshape({B, Hkv, G, Lq, 1});
  std::vector<int64_t> scores = {B, H, Lq, Lk};
  const at::Tensor mask5 = present(mask) ? grouped(mask->expand(scores)) : at::Tensor();
  const at::Tensor dmask6 =
      dmask.defined() ? dmask.expand({K, B, H, Lq, Lk}).reshape({K, B, Hkv, G, Lq, Lk}) : at::Tensor();
  const at::Tensor result6 = result.view({K, B, Hkv, G, Lq, Dv});

  for (int64_t i0 = 0; i0 < Lq; i0 += block_q) {
    const int64_t bq = std::min(block_q, Lq - i0), R = G * bq;
    const at::Tensor qb = rows(q5, i0, bq);
    const at::Tensor dqb = dq.defined() ? rows_k(dq6, i0, bq) : at::Tensor();
    at::Tensor lb = rows(lse5, i0, bq).clone();  // [B·Hkv, G·bq, 1], written below
    const at::Tensor dead = lb.eq(-inf);         // every key masked: the row's tangent is 0
    lb.masked_fill_(dead, 0.0);
    at::Tensor acc_o = at::zeros({BH, K * R, Dv}, q.options().dtype(acc));
    at::Tensor c = at::zeros({BH, K * R, 1}, q.options().dtype(acc));
    const at::Tensor acc_o4 = acc_o.view({BH, K, R, Dv});
    for (int64_t j0 = 0; j0 < Lk; j0 += block_k) {
      if (causal && j0 > i0 + bq - 1) break;  // this key block and all after it are hidden
      const int64_t bk = std::min(block_k, Lk - j0);
      const at::Tensor kbt = keys(k, j0, bk).transpose(1, 2);
      at::Tensor sc = at::bmm(qb, kbt).mul_(scale);
      if (mask5.defined()) {
        at::Tensor mb = mask5.narrow(3, i0, bq).narrow(4, j0, bk).reshape({BH, R, bk});
        if (mb.scalar_type() == at::kBool)
          sc.masked_fill_(mb.logical_not(), -inf);
        else
          sc.add_(mb.to(acc));
      }
      if (causal && j0 + bk - 1 > i0) {  // partly hidden: key j > query i
        auto opts = q.options().dtype(at::kLong);
        at::Tensor hidden = at::arange(j0, j0 + bk, opts).unsqueeze(0).gt(at::arange(i0, i0 + bq, opts).unsqueeze(1));
        sc.masked_fill_(hidden.repeat({G, 1}), -inf);
      }
      const at::Tensor p = sc.sub_(lb).exp_();  // exact: lse is the full row's; shared by the K tangents
      if (has_ds) {
        at::Tensor ds;  // [B·Hkv, K·R, bk]
        if (dqb.defined()) ds = at::bmm(dqb, kbt);
        if (dk.defined()) {  // q·dkᵀ with the K key blocks in the columns: [B·Hkv, R, K·bk]
          at::Tensor dkt = dk.narrow(3, j0, bk).permute({1, 2, 4, 0, 3}).reshape({BH, D, K * bk}).to(acc);
          at::Tensor t = at::bmm(qb, dkt).view({BH, R, K, bk}).permute({0, 2, 1, 3}).reshape({BH, K * R, bk});
          ds = ds.defined() ? ds.add_(t) : t.contiguous();
        }
        if (ds.defined()) ds.mul_(scale);
        if (dmask6.defined()) {
          at::Tensor mb =
              dmask6.narrow(4, i0, bq).narrow(5, j0, bk).permute({1, 2, 0, 3, 4, 5}).reshape({BH, K * R, bk}).to(acc);
          ds = ds.defined() ? ds.add_(mb) : mb.clone();
        }
        at::Tensor pds = ds.view({BH, K, R, bk}).mul_(p.unsqueeze(1)).view({BH, K * R, bk});
        c.add_(pds.sum(-1, /*keepdim=*/true));
        acc_o.add_(at::bmm(pds, keys(v, j0, bk)));
      }
      if (dv.defined()) {  // P·dv with the K value blocks in the columns: [B·Hkv, R, K·Dv]
        at::Tensor dvb = dv.narrow(3, j0, bk).permute({1, 2, 3, 0, 4}).reshape({BH, bk, K * Dv}).to(acc);
        acc_o4.add_(at::bmm(p, dvb).view({BH, R, K, Dv}).permute({0, 2, 1, 3}));
      }
    }
    if (has_ds) acc_o4.addcmul_(c.view({BH, K, R, 1}), rows(out5, i0, bq).unsqueeze(1), -1.0);  // − c ⊙ out
    acc_o4.masked_fill_(dead.unsqueeze(1), 0.0);
    result6.narrow(4, i0, bq).copy_(acc_o.view({B, Hkv, K, G, bq, Dv}).permute({2, 0, 1, 3, 4, 5}));
  }
  return result;
}

at::Tensor leading(const std::optional<at::Tensor>& t) { return present(t) ? t->unsqueeze(0) : at::Tensor(); }

at::Tensor attention_tangent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                             const at::Tensor& lse, const std::optional<at::Tensor>& dq,
                             const std::optional<at::Tensor>& dk, const std::optional<at::Tensor>& dv,
                             const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& dmask, bool causal,
                             double scale, int64_t block_q, int64_t block_k) {
  const Sizes s = check(q, k, v, out, lse, dq, dk, dv, mask, dmask, block_q, block_k);
  return attention_tangent_k(s, 1, q, k, v, out, lse, leading(dq), leading(dk), leading(dv), mask, leading(dmask),
                             causal, scale, block_q, block_k)
      .squeeze(0);
}

// The batched overload's operands: the tangents' common K, each checked as its primal's shape
// behind K; the first tangent slice checked as the operator checks one tangent.
std::pair<Sizes, int64_t> check_batched(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& out, const at::Tensor& lse,
                                        const std::optional<at::Tensor>& dq, const std::optional<at::Tensor>& dk,
                                        const std::optional<at::Tensor>& dv, const std::optional<at::Tensor>& mask,
                                        const std::optional<at::Tensor>& dmask, int64_t block_q, int64_t block_k) {
  const char* op = "jvpc::attention_tangent.batched: ";
  int64_t K = -1;
  std::optional<at::Tensor> first[4];
  const std::optional<at::Tensor>* ts[4] = {&dq, &dk, &dv, &dmask};
  const char* names[4] = {"dq", "dk", "dv", "dmask"};
  for (int i = 0; i < 4; ++i) {
    if (!present(*ts[i])) continue;
    const at::Tensor& t = **ts[i];
    TORCH_CHECK(t.dim() >= 1, op, names[i], " must have a leading dim of K tangents, got ", shape(t));
    TORCH_CHECK(K < 0 || t.size(0) == K, op, names[i], " has ", t.size(0), " tangents, the others ", K);
    K = t.size(0);
    first[i] = t.select(0, 0);
  }
  TORCH_CHECK(K >= 0, op, "no tangent is present");
  const Sizes s = check(q, k, v, out, lse, first[0], first[1], first[2], mask, first[3], block_q, block_k);
  return {s, K};
}

at::Tensor attention_tangent_batched(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dq,
                                     const std::optional<at::Tensor>& dk, const std::optional<at::Tensor>& dv,
                                     const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& dmask,
                                     bool causal, double scale, int64_t block_q, int64_t block_k) {
  auto [s, K] = check_batched(q, k, v, out, lse, dq, dk, dv, mask, dmask, block_q, block_k);
  auto get = [](const std::optional<at::Tensor>& t) { return present(t) ? *t : at::Tensor(); };
  return attention_tangent_k(s, K, q, k, v, out, lse, get(dq), get(dk), get(dv), mask, get(dmask), causal, scale,
                             block_q, block_k);
}

at::Tensor attention_tangent_batched_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& out, const at::Tensor& lse,
                                          const std::optional<at::Tensor>& dq, const std::optional<at::Tensor>& dk,
                                          const std::optional<at::Tensor>& dv, const std::optional<at::Tensor>& mask,
                                          const std::optional<at::Tensor>& dmask, bool, double, int64_t block_q,
                                          int64_t block_k) {
  auto [s, K] = check_batched(q, k, v, out, lse, dq, dk, dv, mask, dmask, block_q, block_k);
  return at::empty({K, s.B, s.H, s.Lq, s.Dv}, q.options().memory_format(at::MemoryFormat::Contiguous));
}

at::Tensor attention_tangent_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                  const at::Tensor& lse, const std::optional<at::Tensor>& dq,
                                  const std::optional<at::Tensor>& dk, const std::optional<at::Tensor>& dv,
                                  const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& dmask, bool,
                                  double, int64_t block_q, int64_t block_k) {
  const Sizes s = check(q, k, v, out, lse, dq, dk, dv, mask, dmask, block_q, block_k);
  return at::empty({s.B, s.H, s.Lq, s.Dv}, q.options().memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace

}  // namespace jvpc::runtime

TORCH_LIBRARY(jvpc, m) {
  m.def(
      "attention_tangent(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dq, Tensor? dk, Tensor? dv, "
      "Tensor? mask, Tensor? dmask, bool causal, float scale, int block_q, int block_k) -> Tensor");
  m.def(
      "attention_tangent.batched(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dq, Tensor? dk, "
      "Tensor? dv, Tensor? mask, Tensor? dmask, bool causal, float scale, int block_q, int block_k) -> Tensor");
}

TORCH_LIBRARY_IMPL(jvpc, CompositeExplicitAutograd, m) {
  m.impl("attention_tangent", &jvpc::runtime::attention_tangent);
  m.impl("attention_tangent.batched", &jvpc::runtime::attention_tangent_batched);
}

TORCH_LIBRARY_IMPL(jvpc, Meta, m) {
  m.impl("attention_tangent", &jvpc::runtime::attention_tangent_meta);
  m.impl("attention_tangent.batched", &jvpc::runtime::attention_tangent_batched_meta);
}
