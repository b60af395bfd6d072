// jvpc._C._WeightStamp: the weights a linear map was made with, as jvp_fn checks them before each
// call (python/jvpc/_weights.py). For each weight: the tensor itself, its data pointer, its version
// and, for a tensor in CPU memory, a checksum of its bytes, since a write through `p.data` moves
// no version counter. One call stamps or checks every weight, without the GIL.
#include "python/weight_stamp.h"

#include "ir/graph.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstring>
#include <optional>
#include <utility>

namespace py = pybind11;

namespace jvpc {
namespace {

// Fletcher's two running sums over a byte range read as 8-byte words (the last one zero-padded),
// modulo 2^64: s1 adds every word, s2 adds s1 after every word, so it also sees their order.
struct Checksum {
  uint64_t s1 = 0;
  uint64_t s2 = 0;
  bool operator==(const Checksum& o) const { return s1 == o.s1 && s2 == o.s2; }
  bool operator!=(const Checksum& o) const { return !(*this == o); }  // C++17 builds (torch 2.11)
  // The checksum of this range followed by one of `words` words whose checksum is `next`.
  void append(const Checksum& next, uint64_t words) {
    s2 += next.s2 + words * s1;
    s1 += next.s1;
  }
};

uint64_t words_in(size_t bytes) { return (bytes + 7) / 8; }

Checksum checksum(const unsigned char* p, size_t bytes) {
  // Eight lanes of independent running sums over the words i ≡ l (mod 8), which the compiler
  // vectorizes, then joined: over G groups of 8 words, s1 = Σ a_l and
  // s2 = Σ_i (8G − i)·w_i = Σ_l (8·b_l − l·a_l), the serial sums exactly. The rest word by word.
  constexpr size_t kLanes = 8;
  uint64_t a[kLanes] = {}, b[kLanes] = {};
  size_t i = 0;
  for (; i + 8 * kLanes <= bytes; i += 8 * kLanes) {
    uint64_t w[kLanes];
    std::memcpy(w, p + i, sizeof w);
    for (size_t l = 0; l < kLanes; ++l) {
      a[l] += w[l];
      b[l] += a[l];
    }
  }
  Checksum c;
  for (size_t l = 0; l < kLanes; ++l) {
    c.s1 += a[l];
    c.s2 += kLanes * b[l] - l * a[l];
  }
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    c.s1 += w;
    c.s2 += c.s1;
  }
  if (i < bytes) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, bytes - i);
    c.s1 += w;
    c.s2 += c.s1;
  }
  return c;
}

// The bytes a checksum reads: a strided CPU tensor's elements, where they lie densely (in any
// order of dimensions) from its data pointer, which no Python subclass (DTensor) wraps.
bool summed(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         !t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python) && !t.is_quantized();
}

// Each tensor's checksum; a tensor not summed() gets none. The bytes are cut into chunks of a
// fixed size, summed on ATen's intra-op threads and joined in order: the result does not depend
// on the number of threads.
std::vector<std::optional<Checksum>> checksums(const std::vector<at::Tensor>& tensors) {
  constexpr size_t kChunk = size_t{1} << 20;  // bytes, a multiple of 8
  struct Chunk {
    size_t tensor;
    const unsigned char* begin;
    size_t bytes;
  };
  std::vector<at::Tensor> dense(tensors.size());
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!summed(tensors[i])) continue;
    dense[i] = tensors[i].is_non_overlapping_and_dense() ? tensors[i] : tensors[i].contiguous();
    auto* p = static_cast<const unsigned char*>(dense[i].const_data_ptr());
    size_t bytes = dense[i].numel() * dense[i].element_size();
    chunks.push_back({i, p, std::min(bytes, kChunk)});
    for (size_t at = kChunk; at < bytes; at += kChunk) chunks.push_back({i, p + at, std::min(bytes - at, kChunk)});
  }
  std::vector<Checksum> sums(chunks.size());
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) sums[c] = checksum(chunks[c].begin, chunks[c].bytes);
  });
  std::vector<std::optional<Checksum>> out(tensors.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::optional<Checksum>& total = out[chunks[c].tensor];
    if (!total) total.emplace();
    total->append(sums[c], words_in(chunks[c].bytes));
  }
  return out;
}

// A tensor's version; an inference tensor has no version counter.
std::optional<int64_t> version(const at::Tensor& t) {
  if (t.is_inference()) return std::nullopt;
  return t._version();
}

const void* data(const at::Tensor& t) { return summed(t) ? t.const_data_ptr() : nullptr; }

class WeightStamp {
 public:
  explicit WeightStamp(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)), sums_(checksums(tensors_)) {
    for (const at::Tensor& t : tensors_) {
      data_.push_back(data(t));
      versions_.push_back(version(t));
    }
  }

  // The first weight that changed, by index, and how; none where all are as stamped.
  std::optional<std::pair<size_t, const char*>> changed(const std::vector<at::Tensor>& now) const {
    if (now.size() != tensors_.size())
      throw Error("a weight stamp of " + std::to_string(tensors_.size()) + " tensors checked against " +
                  std::to_string(now.size()));
    for (size_t i = 0; i < now.size(); ++i) {
      if (!now[i].is_same(tensors_[i])) return std::make_pair(i, "replaced");
      if (data(now[i]) != data_[i]) return std::make_pair(i, "rebound (.data = ...)");
      if (version(now[i]) != versions_[i]) return std::make_pair(i, "written in place");
    }
    std::vector<std::optional<Checksum>> sums = checksums(now);
    for (size_t i = 0; i < now.size(); ++i)
      if (sums[i] != sums_[i]) return std::make_pair(i, "written (through .data)");
    return std::nullopt;
  }

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<std::optional<Checksum>> sums_;
  std::vector<const void*> data_;
  std::vector<std::optional<int64_t>> versions_;
};

}  // namespace

void bind_weight_stamp(py::module_& m) {
  py::class_<WeightStamp>(m, "_WeightStamp",
                          "The weights a linear map was made with: each tensor, its data pointer, its version and, "
                          "in CPU memory, a checksum of its bytes")
      .def(py::init<std::vector<at::Tensor>>(), py::arg("tensors"), py::call_guard<py::gil_scoped_release>())
      .def("changed", &WeightStamp::changed, py::arg("tensors"), py::call_guard<py::gil_scoped_release>(),
           "(index, how) of the first tensor that is not as stamped, or None");
}

}  // namespace jvpc
