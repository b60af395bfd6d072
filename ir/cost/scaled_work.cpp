// FLOPs of the ops whose work per output element grows with their arguments: windows (pooling,
// antialiased resampling), factorizations and solves of whole matrices, sorts and selections
// along a dim, transforms, distances and embedding bags. Counted as 1 per output element, a
// graph file could make these run for minutes under a small --max-flops (an avg_pool2d of a
// 1024² input with a 512 window: 2.7e5 outputs, 7e10 additions). Each count here is an upper
// bound on the kernel's work, by the convention in docs/cost-model.md.
#include "ir/cost/scaled_work.h"
#include "ir/checked_math.h"
#include "ir/op.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace jvpc {

namespace {

int64_t mul(int64_t a, int64_t b) { return count_or_throw(checked::mul(a, b)); }
int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n = mul(n, x);
  return n;
}
int64_t last(const std::vector<int64_t>& s) { return s.empty() ? 1 : s.back(); }
int64_t ceil_log2(int64_t n) {
  int64_t k = 1;
  while (k < 62 && (int64_t{1} << k) < n) ++k;
  return k;
}

const TensorMeta& in(const Node& n, size_t i = 0) { return n.input(i)->meta(); }
const TensorMeta& out(const Node& n, size_t i = 0) { return n.output(i)->meta(); }

// The window of a pool: kernel_size for each of the last `dims` dims (one value: all of them).
int64_t window(const Node& n, size_t arg, size_t dims) {
  std::vector<int64_t> k = n.arg(arg).value.toIntVector();
  int64_t w = 1;
  for (size_t d = 0; d < dims; ++d) w = mul(w, std::max<int64_t>(1, k.empty() ? 1 : k[k.size() == 1 ? 0 : d]));
  return w;
}

// Adaptive pooling and antialiased resampling: per output element, the input elements its
// window spans in each of the last `dims` dims (ceil(in/out) + 1), times `taps` per element.
int64_t spanned(const Node& n, size_t dims, int64_t taps) {
  const auto &i = in(n).sizes, &o = out(n).sizes;
  int64_t w = 1;
  for (size_t d = 0; d < dims && d < i.size() && d < o.size(); ++d) {
    int64_t a = i[i.size() - 1 - d], b = std::max<int64_t>(1, o[o.size() - 1 - d]);
    w = mul(w, mul(taps, (a + b - 1) / b + 1));
  }
  return mul(numel_of(o), w);
}

// Factorizations and inverses of [..., m, n] matrices: c·m·n·min(m, n) per matrix.
int64_t matrices(const Node& n, int64_t c) {
  const auto& s = in(n).sizes;
  if (s.size() < 2) return numel_of(s);
  int64_t m = s[s.size() - 2], k = s.back();
  int64_t batch = numel_of(std::vector<int64_t>(s.begin(), s.end() - 2));
  return mul(mul(mul(mul(batch, c), m), k), std::min(m, k));
}

// Sorting and selecting along `dim` (an int argument; -1 by default): n·log2(n) per element.
int64_t along(const Node& n, int dim_arg) {
  const auto& s = in(n).sizes;
  if (s.empty()) return 1;
  int64_t dim = dim_arg >= 0 ? n.arg(static_cast<size_t>(dim_arg)).value.toInt() : -1;
  int64_t rank = static_cast<int64_t>(s.size());
  if (dim < -rank || dim >= rank) dim = -1;
  int64_t len = s[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
  return mul(numel_of(s), ceil_log2(std::max<int64_t>(len, 2)));
}

using Rule = int64_t (*)(const Node&);

const std::unordered_map<std::string, Rule>& rules() {
  static const std::unordered_map<std::string, Rule> r = {
      {ops::avg_pool2d, [](const Node& n) { return mul(out(n).numel(), window(n, 1, 2)); }},
      {ops::avg_pool3d, [](const Node& n) { return mul(out(n).numel(), window(n, 1, 3)); }},
      {ops::max_pool2d_with_indices, [](const Node& n) { return mul(out(n).numel(), window(n, 1, 2)); }},
      {ops::max_pool3d_with_indices, [](const Node& n) { return mul(out(n).numel(), window(n, 1, 3)); }},
      {ops::_adaptive_avg_pool2d, [](const Node& n) { return spanned(n, 2, 1); }},
      {ops::_adaptive_avg_pool3d, [](const Node& n) { return spanned(n, 3, 1); }},
      {ops::adaptive_max_pool2d, [](const Node& n) { return spanned(n, 2, 1); }},
      {ops::adaptive_max_pool3d, [](const Node& n) { return spanned(n, 3, 1); }},
      {ops::_upsample_bilinear2d_aa, [](const Node& n) { return spanned(n, 2, 2); }},
      {ops::_upsample_bicubic2d_aa, [](const Node& n) { return spanned(n, 2, 4); }},
      {ops::upsample_bilinear2d, [](const Node& n) { return mul(out(n).numel(), 4); }},
      {ops::upsample_bicubic2d, [](const Node& n) { return mul(out(n).numel(), 16); }},
      {ops::upsample_trilinear3d, [](const Node& n) { return mul(out(n).numel(), 8); }},
      {ops::upsample_linear1d, [](const Node& n) { return mul(out(n).numel(), 2); }},
      {ops::_linalg_det, [](const Node& n) { return matrices(n, 1); }},
      {ops::_linalg_slogdet, [](const Node& n) { return matrices(n, 1); }},
      {ops::linalg_lu, [](const Node& n) { return matrices(n, 1); }},
      {ops::linalg_lu_factor_ex, [](const Node& n) { return matrices(n, 1); }},
      {ops::linalg_cholesky_ex, [](const Node& n) { return matrices(n, 1); }},
      {ops::cholesky, [](const Node& n) { return matrices(n, 1); }},
      {ops::cholesky_inverse, [](const Node& n) { return matrices(n, 2); }},
      {ops::linalg_inv_ex, [](const Node& n) { return matrices(n, 2); }},
      {ops::_linalg_solve_ex,
       [](const Node& n) {
         return std::max(matrices(n, 1), mul(out(n).numel(), in(n).sizes.empty() ? 1 : 2 * last(in(n).sizes)));
       }},
      {ops::linalg_qr, [](const Node& n) { return matrices(n, 4); }},
      {ops::linalg_lstsq,
       [](const Node& n) { return std::max(matrices(n, 4), mul(in(n, 1).numel(), 4 * last(in(n).sizes))); }},
      {ops::_linalg_eigh, [](const Node& n) { return matrices(n, 10); }},
      {ops::_linalg_svd, [](const Node& n) { return matrices(n, 20); }},
      {ops::linalg_pinv_atol_rtol_tensor, [](const Node& n) { return matrices(n, 24); }},
      // Scaling and squaring: up to about 20 products of n×n matrices.
      {ops::linalg_matrix_exp, [](const Node& n) { return matrices(n, 40); }},
      {ops::sort, [](const Node& n) { return along(n, 1); }},
      {ops::sort_stable, [](const Node& n) { return along(n, 2); }},
      {ops::topk, [](const Node& n) { return along(n, 2); }},
      {ops::kthvalue, [](const Node& n) { return along(n, 2); }},
      {ops::median, [](const Node& n) { return mul(in(n).numel(), 2); }},
      {ops::nanmedian, [](const Node& n) { return mul(in(n).numel(), 2); }},
      {ops::median_dim, [](const Node& n) { return along(n, 1); }},
      {ops::nanmedian_dim, [](const Node& n) { return along(n, 1); }},
      {ops::mode, [](const Node& n) { return along(n, 1); }},
      // FFTs: 5·n·log2(n) per transformed signal of n elements, bounded by all of the input.
      {ops::_fft_r2c,
       [](const Node& n) { return mul(mul(in(n).numel(), 5), ceil_log2(std::max<int64_t>(in(n).numel(), 2))); }},
      {ops::_fft_c2r,
       [](const Node& n) { return mul(mul(out(n).numel(), 5), ceil_log2(std::max<int64_t>(out(n).numel(), 2))); }},
      {ops::_fft_c2c,
       [](const Node& n) { return mul(mul(in(n).numel(), 5), ceil_log2(std::max<int64_t>(in(n).numel(), 2))); }},
      // Distances between [.., P, M] and [.., R, M] rows: 3·M per output pair.
      {ops::_cdist_forward,
       [](const Node& n) { return mul(out(n).numel(), 3 * std::max<int64_t>(1, last(in(n).sizes))); }},
      {ops::_euclidean_dist,
       [](const Node& n) { return mul(out(n).numel(), 3 * std::max<int64_t>(1, last(in(n).sizes))); }},
      // Embedding bags: one row of the weight per index.
      {ops::_embedding_bag, [](const Node& n) { return mul(in(n, 1).numel(), last(in(n).sizes)); }},
      {ops::_embedding_bag_forward_only, [](const Node& n) { return mul(in(n, 1).numel(), last(in(n).sizes)); }},
      {ops::mvlgamma,
       [](const Node& n) { return mul(out(n).numel(), 4 * std::max<int64_t>(1, n.arg(1).value.toInt())); }},
  };
  return r;
}

}  // namespace

int64_t count_or_throw(std::optional<int64_t> count) {
  if (!count) throw Error("cost exceeds 2^63 (sizes too large to count)");
  return *count;
}

std::optional<int64_t> scaled_work_flops(const Node& n) {
  auto it = rules().find(n.op());
  if (it == rules().end()) return std::nullopt;
  try {
    return it->second(n);
  } catch (const c10::Error&) {  // arguments of another form than the op's: the kernel refuses them
    return out(n).numel();
  }
}

}  // namespace jvpc
