#include "ir/op.h"

#include <ostream>
#include <unordered_map>

namespace jvpc {

namespace {

struct Entry {
  std::string name;
  uint32_t properties;
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> t = {
      {"", 0},
#define JVPC_OP(handle, name, properties) {name, properties},
#include "ir/op_names.def"
#undef JVPC_OP
  };
  return t;
}

}  // namespace

Op Op::find(const std::string& qualified_name) {
  static const std::unordered_map<std::string, uint16_t> index = [] {
    std::unordered_map<std::string, uint16_t> m;
    const auto& t = table();
    for (size_t i = 1; i < t.size(); ++i) m.emplace(t[i].name, static_cast<uint16_t>(i));
    return m;
  }();
  auto it = index.find(qualified_name);
  return it == index.end() ? Op() : Op(it->second);
}

std::vector<Op> Op::all() {
  std::vector<Op> out;
  for (uint16_t i = 1; i < ops::count_index; ++i) out.emplace_back(i);
  return out;
}

const std::string& Op::name() const { return table()[index_].name; }

uint32_t Op::properties() const { return table()[index_].properties; }

std::ostream& operator<<(std::ostream& os, Op op) { return os << op.name(); }

}  // namespace jvpc
