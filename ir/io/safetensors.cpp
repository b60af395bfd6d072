// Safetensors files (safetensors.h): written whole, and checked whole before any tensor is made.
#include "ir/io/safetensors.h"

#include "ir/dtypes.h"
#include "ir/io/files.h"
#include "ir/io/json_text.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace jvpc {

using nlohmann::json;

namespace {

// The safetensors format's own limit on the header (the reference implementation's).
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

}  // namespace

std::string safetensors_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  json header = json::object();
  std::vector<at::Tensor> blobs;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw Error("safetensors: the name '__metadata__' is reserved");
    if (header.contains(name)) throw Error("safetensors: tensor '" + name + "' is given twice");  // one would be lost
    at::Tensor c = t.to(at::kCPU).contiguous();
    int64_t nbytes = static_cast<int64_t>(c.nbytes());
    header[name] = {{"dtype", safetensors_dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    blobs.push_back(c);
  }
  header["__metadata__"] = {{"format", "pt"}, {"writer", "jvpc"}};
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h += ' ';  // data starts 8-byte aligned
  std::string out;
  out.reserve(8 + h.size() + static_cast<size_t>(offset));
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>(static_cast<unsigned char>(n >> (8 * i)));
  out += h;
  for (const auto& b : blobs) out.append(static_cast<const char*>(b.data_ptr()), b.nbytes());
  return out;
}

std::unordered_map<std::string, at::Tensor> parse_safetensors(const std::string& bytes, const std::string& path,
                                                              const std::string& what) {
  auto bad = [&](const std::string& why) { return Error(what + " " + quoted_path(path) + ": " + why); };
  if (bytes.size() < 8) throw bad("too short for a safetensors file");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  if (n > kMaxSafetensorsHeader)
    throw bad("header length exceeds the limit of " + std::to_string(kMaxSafetensorsHeader) + " bytes");
  if (n > bytes.size() - 8) throw bad("header length exceeds the file");
  json header;
  ReleaseOnExit free_header{header};
  try {
    header = parse_json(bytes.substr(8, n), /*quote=*/false);
  } catch (const Error& e) {
    throw bad(std::string("header: ") + e.what());
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;

  struct Entry {
    const std::string* name;
    TensorMeta meta;
    int64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    At e{it.value(), "tensor " + shown(it.key())};
    if (it.key() == "__metadata__") {  // a map of strings to strings
      if (!e.j.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& v : e.j)
        if (!v.is_string()) throw bad("__metadata__ holds a value that is not a string");
      continue;
    }
    try {
      c10::ScalarType dtype = wrap(e, [&] { return dtype_from_safetensors_name(e["dtype"].str()); });
      TensorMeta m = wrap(e, [&] { return TensorMeta::contiguous(e["shape"].ints(), dtype, c10::kCPU); });
      int64_t nbytes = wrap(e, [&] { return m.nbytes(); });  // negative sizes, overflow
      auto offs = e["data_offsets"].ints();
      if (offs.size() != 2) e.fail("data_offsets must be [begin, end]");
      if (offs[0] < 0 || offs[1] < offs[0]) e.fail("data_offsets end before they begin");
      if (static_cast<uint64_t>(offs[1]) > data_size) e.fail("data_offsets out of range (past the end of the file)");
      if (offs[1] - offs[0] != nbytes)
        e.fail("data_offsets span " + std::to_string(offs[1] - offs[0]) + " bytes, but " + m.str() + " takes " +
               std::to_string(nbytes));
      entries.push_back({&it.key(), std::move(m), offs[0], offs[1]});
    } catch (const Error& err) {
      throw bad(err.what());
    }
  }
  // In the order of their offsets, the tensors must tile the data.
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return std::make_pair(a->begin, a->end) < std::make_pair(b->begin, b->end);
  });
  int64_t pos = 0;
  const Entry* last = nullptr;
  for (const Entry* e : order) {
    if (e->begin < pos) throw bad("tensor " + shown(*e->name) + " overlaps tensor " + shown(*last->name));
    if (e->begin > pos)
      throw bad(std::to_string(e->begin - pos) + " bytes of data before tensor " + shown(*e->name) +
                " belong to no tensor");
    pos = e->end;
    last = e;
  }
  if (static_cast<uint64_t>(pos) != data_size)
    throw bad(std::to_string(data_size - static_cast<uint64_t>(pos)) +
              " bytes after the last tensor belong to no tensor");

  const char* data = bytes.data() + 8 + n;
  std::unordered_map<std::string, at::Tensor> out;
  for (const Entry& e : entries) {
    at::Tensor t = at::empty(e.meta.sizes, at::TensorOptions().dtype(e.meta.dtype));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, static_cast<size_t>(e.end - e.begin));
    out.emplace(*e.name, std::move(t));
  }
  return out;
}

void write_safetensors(AtomicFile& f, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  f.write(safetensors_bytes(tensors));
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  AtomicFile f(path);
  write_safetensors(f, tensors);
  f.commit();
}

std::unordered_map<std::string, at::Tensor> read_safetensors(const std::string& path, const std::string& what) {
  return parse_safetensors(read_regular_file(path, what, int64_t{1} << 38), path, what);
}

}  // namespace jvpc
