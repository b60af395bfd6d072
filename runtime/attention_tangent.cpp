// jvpc::attention_tangent: the operator, its Meta kernel and their registration (see the header).
//
// One kernel serves every device (CompositeExplicitAutograd): it is written in ATen ops, so
// it runs on CPU and CUDA alike, and the bmms it calls are ordinary kernels that the profiler,
// KernelWatch and FlopCounterMode see inside it.
#include "runtime/attention_tangent.h"
#include "ir/op.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
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
            const std::optional<at::Tensor>& dmask, int64_t block_q, int64_t block_k,
            const char* op = "jvpc::attention_tangent: ") {
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

// The kernels' layout, shared by the operator and its backward. A [B, H, L, X] tensor is viewed
// as [B, Hkv, G, L, X] (query head h = hkv·G + g reads key head hkv), and a block of it is a bmm
// operand [B·Hkv, rows, X] in the accumulation type. Tangents carry a leading dim of K.
struct Layout {
  Sizes s;
  int64_t K, BH;
  at::ScalarType acc;
  bool causal;
  double scale;
  at::Tensor mask5;   // [B, Hkv, G, Lq, Lk] view of the mask, or undefined
  at::Tensor dk;      // [K, B, Hkv, Lk, D], or undefined
  at::Tensor dmask6;  // [K, B, Hkv, G, Lq, Lk] view of dmask, or undefined

  Layout(const Sizes& s_, int64_t K_, const at::Tensor& q, const std::optional<at::Tensor>& mask, const at::Tensor& dk_,
         const at::Tensor& dmask, bool causal_, double scale_)
      : s(s_),
        K(K_),
        BH(s_.B * s_.Hkv),
        acc(at::isReducedFloatingType(q.scalar_type()) ? at::kFloat : q.scalar_type()),
        causal(causal_),
        scale(scale_),
        dk(dk_) {
    if (present(mask)) mask5 = grouped(mask->expand({s.B, s.H, s.Lq, s.Lk}));
    if (dmask.defined()) dmask6 = dmask.expand({K, s.B, s.H, s.Lq, s.Lk}).reshape({K, s.B, s.Hkv, s.G, s.Lq, s.Lk});
  }
  at::Tensor grouped(const at::Tensor& x) const { return x.reshape({s.B, s.Hkv, s.G, x.size(2), x.size(3)}); }
  // Rows [i0, i0 + n) of a grouped tensor: [B·Hkv, G·n, X].
  at::Tensor rows(const at::Tensor& x5, int64_t i0, int64_t n) const {
    return x5.narrow(3, i0, n).reshape({BH, s.G * n, x5.size(4)}).to(acc);
  }
  // Keys [j0, j0 + n) of k or v: [B·Hkv, n, X].
  at::Tensor keys(const at::Tensor& x, int64_t j0, int64_t n) const {
    return x.narrow(2, j0, n).reshape({BH, n, x.size(3)}).to(acc);
  }
  // The K tangents' rows [i0, i0 + n) of a grouped tangent [K, B, Hkv, G, L, X]: [B·Hkv, K·G·n, X].
  at::Tensor rows_k(const at::Tensor& x6, int64_t i0, int64_t n) const {
    return x6.narrow(4, i0, n).permute({1, 2, 0, 3, 4, 5}).reshape({BH, K * s.G * n, x6.size(5)}).to(acc);
  }
  // Key block j0 and all after it are hidden from query block [i0, i0 + bq) by the causal mask.
  bool hidden(int64_t i0, int64_t bq, int64_t j0) const { return causal && j0 > i0 + bq - 1; }
  // The row lse of rows [i0, i0 + bq) with the rows whose every key is masked (lse −inf, written
  // to `dead`) at 0, so that their P is 0.
  at::Tensor row_lse(const at::Tensor& lse5, int64_t i0, int64_t bq, at::Tensor& dead) const {
    at::Tensor lb = rows(lse5, i0, bq).clone();
    dead = lb.eq(-std::numeric_limits<double>::infinity());
    return lb.masked_fill_(dead, 0.0);
  }
  // P of the block (queries [i0, i0 + bq), keys [j0, j0 + bk)): exact by itself, since lse is
  // the full row's. qb [B·Hkv, G·bq, D], kbt [B·Hkv, D, bk], lb [B·Hkv, G·bq, 1].
  at::Tensor probs(const at::Tensor& qb, const at::Tensor& kbt, const at::Tensor& lb, int64_t i0, int64_t bq,
                   int64_t j0, int64_t bk) const {
    const double inf = std::numeric_limits<double>::infinity();
    at::Tensor sc = at::bmm(qb, kbt).mul_(scale);
    if (mask5.defined()) {
      at::Tensor mb = mask5.narrow(3, i0, bq).narrow(4, j0, bk).reshape({BH, s.G * bq, bk});
      if (mb.scalar_type() == at::kBool)
        sc.masked_fill_(mb.logical_not(), -inf);
      else
        sc.add_(mb.to(acc));
    }
    if (causal && j0 + bk - 1 > i0) {  // partly hidden: key j > query i
      auto opts = qb.options().dtype(at::kLong);
      at::Tensor hide = at::arange(j0, j0 + bk, opts).unsqueeze(0).gt(at::arange(i0, i0 + bq, opts).unsqueeze(1));
      sc.masked_fill_(hide.repeat({s.G, 1}), -inf);
    }
    return sc.sub_(lb).exp_();
  }
  // The block's score tangents dS = (dq·kᵀ + q·dkᵀ)·scale + dmask for the K tangents, their rows
  // stacked: [B·Hkv, K·G·bq, bk]; undefined where no tangent reaches the scores. dqb is the K
  // tangents' dq rows (rows_k), or undefined.
  at::Tensor tangent_scores(const at::Tensor& qb, const at::Tensor& dqb, const at::Tensor& kbt, int64_t i0, int64_t bq,
                            int64_t j0, int64_t bk) const {
    const int64_t R = s.G * bq;
    at::Tensor ds;
    if (dqb.defined()) ds = at::bmm(dqb, kbt);
    if (dk.defined()) {  // q·dkᵀ with the K key blocks in the columns: [B·Hkv, R, K·bk]
      at::Tensor dkt = dk.narrow(3, j0, bk).permute({1, 2, 4, 0, 3}).reshape({BH, s.D, K * bk}).to(acc);
      at::Tensor t = at::bmm(qb, dkt).view({BH, R, K, bk}).permute({0, 2, 1, 3}).reshape({BH, K * R, bk});
      ds = ds.defined() ? ds.add_(t) : t.contiguous();
    }
    if (ds.defined()) ds.mul_(scale);
    if (dmask6.defined()) {
      at::Tensor mb =
          dmask6.narrow(4, i0, bq).narrow(5, j0, bk).permute({1, 2, 0, 3, 4, 5}).reshape({BH, K * R, bk}).to(acc);
      ds = ds.defined() ? ds.add_(mb) : mb.clone();
    }
    return ds;
  }
};

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
  const Layout L(s, K, q, mask, dk, dmask, causal, scale);
  const int64_t BH = L.BH;
  const at::Tensor q5 = L.grouped(q), out5 = L.grouped(out);
  const at::Tensor dq6 = dq.defined() ? dq.reshape({K, B, Hkv, G, Lq, D}) : at::Tensor();
  const at::Tensor lse5 = lse.reshape({B, Hkv, G, Lq, 1});
  const at::Tensor result6 = result.view({K, B, Hkv, G, Lq, Dv});

  for (int64_t i0 = 0; i0 < Lq; i0 += block_q) {
    const int64_t bq = std::min(block_q, Lq - i0), R = G * bq;
    const at::Tensor qb = L.rows(q5, i0, bq);
    const at::Tensor dqb = dq.defined() ? L.rows_k(dq6, i0, bq) : at::Tensor();
    at::Tensor dead;  // every key masked: the row's tangent is 0
    const at::Tensor lb = L.row_lse(lse5, i0, bq, dead);
    at::Tensor acc_o = at::zeros({BH, K * R, Dv}, q.options().dtype(L.acc));
    at::Tensor c = at::zeros({BH, K * R, 1}, q.options().dtype(L.acc));
    const at::Tensor acc_o4 = acc_o.view({BH, K, R, Dv});
    for (int64_t j0 = 0; j0 < Lk && !L.hidden(i0, bq, j0); j0 += block_k) {
      const int64_t bk = std::min(block_k, Lk - j0);
      const at::Tensor kbt = L.keys(k, j0, bk).transpose(1, 2);
      const at::Tensor p = L.probs(qb, kbt, lb, i0, bq, j0, bk);  // shared by the K tangents
      if (has_ds) {
        at::Tensor ds = L.tangent_scores(qb, dqb, kbt, i0, bq, j0, bk);  // [B·Hkv, K·R, bk]
        at::Tensor pds = ds.view({BH, K, R, bk}).mul_(p.unsqueeze(1)).view({BH, K * R, bk});
        c.add_(pds.sum(-1, /*keepdim=*/true));
        acc_o.add_(at::bmm(pds, L.keys(v, j0, bk)));
      }
      if (dv.defined()) {  // P·dv with the K value blocks in the columns: [B·Hkv, R, K·Dv]
        at::Tensor dvb = dv.narrow(3, j0, bk).permute({1, 2, 3, 0, 4}).reshape({BH, bk, K * Dv}).to(L.acc);
        acc_o4.add_(at::bmm(p, dvb).view({BH, R, K, Dv}).permute({0, 2, 1, 3}));
      }
    }
    if (has_ds) acc_o4.addcmul_(c.view({BH, K, R, 1}), L.rows(out5, i0, bq).unsqueeze(1), -1.0);  // − c ⊙ out
    acc_o4.masked_fill_(dead.unsqueeze(1), 0.0);
    result6.narrow(4, i0, bq).copy_(acc_o.view({B, Hkv, K, G, bq, Dv}).permute({2, 0, 1, 3, 4, 5}));
  }
  return result;
}

// The backward (see the header for the formulas). Per query block: a first sweep over the key
// blocks gives c = rowsum(P ⊙ dS); the second recomputes P and dS and accumulates every
// gradient. Gradients of q and dq are written per query block; those of k, v, dk, dv are
// accumulated over the query blocks in [B·Hkv, Lk, X] buffers of the accumulation type.
// The backward's operands: the forward's (check), and grad and dout shaped like out (the same
// checks on Meta tensors and real ones).
Sizes check_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                     const std::optional<at::Tensor>& dq, const std::optional<at::Tensor>& dk,
                     const std::optional<at::Tensor>& dv, const std::optional<at::Tensor>& mask,
                     const std::optional<at::Tensor>& dmask, int64_t block_q, int64_t block_k) {
  const char* op = "jvpc::attention_tangent_backward: ";
  const Sizes s = check(q, k, v, out, lse, dq, dk, dv, mask, dmask, block_q, block_k, op);
  for (const at::Tensor* t : {&grad, &dout})
    TORCH_CHECK(t->sizes() == out.sizes() && t->scalar_type() == out.scalar_type(), op,
                "grad and dout must have out's shape ", shape(out), " and dtype, got ", shape(*t), " ",
                t->scalar_type());
  return s;
}

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Grads attention_tangent_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                                 const std::optional<at::Tensor>& dq_, const std::optional<at::Tensor>& dk_,
                                 const std::optional<at::Tensor>& dv_, const std::optional<at::Tensor>& mask,
                                 const std::optional<at::Tensor>& dmask_, bool causal, double scale, int64_t block_q,
                                 int64_t block_k) {
  const Sizes s = check_backward(grad, q, k, v, out, lse, dout, dq_, dk_, dv_, mask, dmask_, block_q, block_k);
  auto get = [](const std::optional<at::Tensor>& t) { return present(t) ? *t : at::Tensor(); };
  const at::Tensor dq = get(dq_), dk = get(dk_), dv = get(dv_), dmask = get(dmask_);
  const int64_t B = s.B, Hkv = s.Hkv, G = s.G, Lq = s.Lq, Lk = s.Lk, D = s.D, Dv = s.Dv;
  const Layout L(s, 1, q, mask, dk.defined() ? dk.unsqueeze(0) : at::Tensor(),
                 dmask.defined() ? dmask.unsqueeze(0) : at::Tensor(), causal, scale);
  const int64_t BH = L.BH;
  const auto acc = q.options().dtype(L.acc);
  const bool has_ds = dq.defined() || dk.defined() || dmask.defined();

  at::Tensor gq = at::zeros({B, Hkv, G, Lq, D}, acc), gk = at::zeros({BH, Lk, D}, acc),
             gv = at::zeros({BH, Lk, Dv}, acc);
  at::Tensor gdq = dq.defined() ? at::zeros({B, Hkv, G, Lq, D}, acc) : at::Tensor();
  at::Tensor gdk = dk.defined() ? at::zeros({BH, Lk, D}, acc) : at::Tensor();
  at::Tensor gdv = dv.defined() ? at::zeros({BH, Lk, Dv}, acc) : at::Tensor();
  const at::Tensor q5 = L.grouped(q), g5 = L.grouped(grad), out5 = L.grouped(out), dout5 = L.grouped(dout);
  const at::Tensor dq6 = dq.defined() ? dq.reshape({1, B, Hkv, G, Lq, D}) : at::Tensor();
  const at::Tensor lse5 = lse.reshape({B, Hkv, G, Lq, 1});

  for (int64_t i0 = 0; i0 < Lq && (has_ds || dv.defined()); i0 += block_q) {
    const int64_t bq = std::min(block_q, Lq - i0), R = G * bq;
    const at::Tensor qb = L.rows(q5, i0, bq);
    const at::Tensor dqb = dq.defined() ? L.rows_k(dq6, i0, bq) : at::Tensor();
    at::Tensor dead;  // every key masked: P is 0 on the row; its out and dout rows are ignored
    const at::Tensor lb = L.row_lse(lse5, i0, bq, dead);
    const at::Tensor gb = L.rows(g5, i0, bq).masked_fill(dead, 0.0);
    const at::Tensor ob = L.rows(out5, i0, bq).masked_fill(dead, 0.0);
    const at::Tensor dob = L.rows(dout5, i0, bq).masked_fill(dead, 0.0);
    auto kbt = [&](int64_t j0, int64_t bk) { return L.keys(k, j0, bk).transpose(1, 2); };

    at::Tensor c = at::zeros({BH, R, 1}, acc);  // c = rowsum(P ⊙ dS): the first sweep
    for (int64_t j0 = 0; has_ds && j0 < Lk && !L.hidden(i0, bq, j0); j0 += block_k) {
      const int64_t bk = std::min(block_k, Lk - j0);
      const at::Tensor kt = kbt(j0, bk);
      c.add_(L.probs(qb, kt, lb, i0, bq, j0, bk).mul_(L.tangent_scores(qb, dqb, kt, i0, bq, j0, bk)).sum(-1, true));
    }
    const at::Tensor r = (gb * ob).sum(-1, true);                   // rowsum(G ⊙ out)
    const at::Tensor q_row = (gb * dob).sum(-1, true).sub_(r * c);  // rowsum(G ⊙ dout) − r·c
    at::Tensor gqb = at::zeros({BH, R, D}, acc);
    at::Tensor gdqb = dq.defined() ? at::zeros({BH, R, D}, acc) : at::Tensor();

    for (int64_t j0 = 0; j0 < Lk && !L.hidden(i0, bq, j0); j0 += block_k) {
      const int64_t bk = std::min(block_k, Lk - j0);
      const at::Tensor kb = L.keys(k, j0, bk), kt = kb.transpose(1, 2), vb = L.keys(v, j0, bk);
      const at::Tensor p = L.probs(qb, kt, lb, i0, bq, j0, bk);
      const at::Tensor pt = p.transpose(1, 2);
      // The gradient of P; bmms into the gradients accumulate (baddbmm), scale as their alpha.
      at::Tensor gp;
      if (dv.defined()) {
        gp = at::bmm(gb, L.keys(dv, j0, bk).transpose(1, 2));
        gdv.narrow(1, j0, bk).baddbmm_(pt, gb);
      } else {
        gp = at::zeros({BH, R, bk}, acc);
      }
      if (has_ds) {
        at::Tensor ds = L.tangent_scores(qb, dqb, kt, i0, bq, j0, bk);
        at::Tensor a = at::bmm(gb, vb.transpose(1, 2));                // A = G·vᵀ
        gp.addcmul_(ds, r, -1.0);                                      // − r·dS
        const at::Tensor& dsc = ds.sub_(c);                            // dS − c
        gp.addcmul_(a, dsc);                                           // + A ⊙ (dS − c)
        gv.narrow(1, j0, bk).baddbmm_((p * dsc).transpose(1, 2), gb);  // dPᵀ·G
        const at::Tensor& gds = a.sub_(r).mul_(p);                     // the gradient of dS
        const at::Tensor gdst = gds.transpose(1, 2);
        if (dq.defined()) {
          gdqb.baddbmm_(gds, kb, 1.0, scale);
          gk.narrow(1, j0, bk).baddbmm_(gdst, dqb, 1.0, scale);
        }
        if (dk.defined()) {
          gdk.narrow(1, j0, bk).baddbmm_(gdst, qb, 1.0, scale);
          gqb.baddbmm_(gds, L.keys(dk, j0, bk), 1.0, scale);
        }
      }
      const at::Tensor& gs = gp.sub_(q_row).mul_(p);  // the gradient of S
      gqb.baddbmm_(gs, kb, 1.0, scale);
      gk.narrow(1, j0, bk).baddbmm_(gs.transpose(1, 2), qb, 1.0, scale);
    }
    gq.narrow(3, i0, bq).copy_(gqb.view({B, Hkv, G, bq, D}));
    if (dq.defined()) gdq.narrow(3, i0, bq).copy_(gdqb.view({B, Hkv, G, bq, D}));
  }
  const auto dt = q.scalar_type();
  auto as = [&](const at::Tensor& t, const at::Tensor& like) {
    return t.defined() ? t.view(like.sizes()).to(dt) : at::Tensor();
  };
  return Grads{as(gq, q), as(gk, k), as(gv, v), as(gdq, q), as(gdk, k), as(gdv, v)};
}

Grads attention_tangent_backward_meta(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                      const at::Tensor& dout, const std::optional<at::Tensor>& dq,
                                      const std::optional<at::Tensor>& dk, const std::optional<at::Tensor>& dv,
                                      const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& dmask,
                                      bool, double, int64_t block_q, int64_t block_k) {
  check_backward(grad, q, k, v, out, lse, dout, dq, dk, dv, mask, dmask, block_q, block_k);
  auto like = [](const at::Tensor& x, bool here) { return here ? at::empty_like(x) : at::Tensor(); };
  return Grads{like(q, true),        like(k, true),        like(v, true),
               like(q, present(dq)), like(k, present(dk)), like(v, present(dv))};
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

// The Autograd kernel of jvpc::attention_tangent: the operator's result differentiated through
// q, k, v, dq, dk, dv by jvpc::attention_tangent_backward.
class AttentionTangentFunction : public torch::autograd::Function<AttentionTangentFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                            const std::optional<at::Tensor>& dq, const std::optional<at::Tensor>& dk,
                            const std::optional<at::Tensor>& dv, const std::optional<at::Tensor>& mask,
                            const std::optional<at::Tensor>& dmask, bool causal, double scale, int64_t block_q,
                            int64_t block_k) {
    for (const auto* m : {&mask, &dmask})
      TORCH_CHECK(!present(*m) || !(*m)->requires_grad(),
                  "jvpc::attention_tangent: gradients to mask and dmask are not propagated; detach them, or "
                  "differentiate the attention on the math path");
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("jvpc::attention_tangent", "")
                         .typed<decltype(attention_tangent)>();
    at::Tensor result = op.call(q, k, v, out, lse, dq, dk, dv, mask, dmask, causal, scale, block_q, block_k);
    auto opt = [](const std::optional<at::Tensor>& t) { return present(t) ? *t : at::Tensor(); };
    ctx->save_for_backward({q, k, v, out, lse, opt(dq), opt(dk), opt(dv), opt(mask), opt(dmask), result});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    return result;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto x = ctx->get_saved_variables();
    auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("jvpc::attention_tangent_backward", "")
                         .typed<decltype(attention_tangent_backward)>();
    at::Tensor g = grads[0].defined() ? grads[0] : at::zeros_like(x[10]);
    auto [gq, gk, gv, gdq, gdk, gdv] =
        op.call(g, x[0], x[1], x[2], x[3], x[4], x[10], opt(x[5]), opt(x[6]), opt(x[7]), opt(x[8]), opt(x[9]),
                ctx->saved_data["causal"].toBool(), ctx->saved_data["scale"].toDouble(),
                ctx->saved_data["block_q"].toInt(), ctx->saved_data["block_k"].toInt());
    // q, k, v, out, lse (none: a by-product), dq, dk, dv, mask, dmask, and the four non-tensors.
    return {gq, gk, gv, {}, {}, gdq, gdk, gdv, {}, {}, {}, {}, {}, {}};
  }
};

at::Tensor attention_tangent_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dq,
                                      const std::optional<at::Tensor>& dk, const std::optional<at::Tensor>& dv,
                                      const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& dmask,
                                      bool causal, double scale, int64_t block_q, int64_t block_k) {
  return AttentionTangentFunction::apply(q, k, v, out, lse, dq, dk, dv, mask, dmask, causal, scale, block_q, block_k);
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
  m.def(
      "attention_tangent_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, "
      "Tensor? dq, Tensor? dk, Tensor? dv, Tensor? mask, Tensor? dmask, bool causal, float scale, int block_q, "
      "int block_k) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(jvpc, CompositeExplicitAutograd, m) {
  m.impl("attention_tangent", &jvpc::runtime::attention_tangent);
  m.impl("attention_tangent.batched", &jvpc::runtime::attention_tangent_batched);
  m.impl("attention_tangent_backward", &jvpc::runtime::attention_tangent_backward);
}

// Differentiable through q, k, v and their tangents; the backward itself is not differentiable.
TORCH_LIBRARY_IMPL(jvpc, Autograd, m) {
  m.impl("attention_tangent", &jvpc::runtime::attention_tangent_autograd);
  m.impl("attention_tangent_backward", torch::autograd::autogradNotImplementedFallback());
}

TORCH_LIBRARY_IMPL(jvpc, Meta, m) {
  m.impl("attention_tangent", &jvpc::runtime::attention_tangent_meta);
  m.impl("attention_tangent.batched", &jvpc::runtime::attention_tangent_batched_meta);
  m.impl("attention_tangent_backward", &jvpc::runtime::attention_tangent_backward_meta);
}
