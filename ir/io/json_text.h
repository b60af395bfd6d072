// JSON text as jvpc reads it from files: a parser linear in the text's length with limits that
// suit data from strangers, and At, a JSON value with the path that led to it, so that every
// check of a file's contents fails with one line naming where ("nodes[4].args[1]: ...").
#pragma once

#include "ir/graph.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace jvpc {

/// The memory a parsed document may take, per byte of its text (and 1 MiB more). The document's
/// parts are counted as they are built, at what they take on the heap (an object 64 bytes, a
/// member 96, an array element 32, a string 48, long strings and keys their length more), so
/// that a file of nothing but `{},` (96 bytes per 3 of text) is refused early. A jvpc graph
/// file, compact, takes at most about 11 per byte, and as jvpc writes it about 5.
constexpr int64_t kJsonMemoryPerTextByte = 16;

/// Text to JSON, in time linear in its length: nesting limited to 16 arrays and objects, a key
/// twice in one object refused, memory limited to kJsonMemoryPerTextByte per byte, errors one
/// line with their byte offset (running out of memory too). With `quote` false, errors never
/// quote the text (for files that may not be what they claim to be).
nlohmann::json parse_json(const std::string& text, bool quote = true);

/// Frees `j`'s contents in place, innermost first, without allocating. nlohmann's destructor
/// first moves a container's elements into a vector as large as it, which fails (and, in a
/// destructor, aborts) where memory has run out.
void release(nlohmann::json& j) noexcept;
/// release()s a document when it goes out of scope, as an error unwinds too.
struct ReleaseOnExit {
  nlohmann::json& j;
  ~ReleaseOnExit() { release(j); }
};

/// A string from a file as errors show it: escaped (no control characters reach the terminal),
/// quoted, and cut short.
std::string shown(const std::string& s);

/// A JSON value with the path that led to it, for error messages. Every accessor checks the
/// value's kind and fails with the path.
struct At {
  const nlohmann::json& j;
  std::string path;

  [[noreturn]] void fail(const std::string& msg) const { throw Error(path + ": " + msg); }
  At operator[](const char* key) const {
    if (!j.is_object()) fail("expected an object");
    auto it = j.find(key);
    if (it == j.end()) fail(std::string("missing \"") + key + "\"");
    return At{*it, path + "." + key};
  }
  bool has(const char* key) const { return j.is_object() && j.contains(key); }
  At operator[](size_t i) const { return At{j[i], path + "[" + std::to_string(i) + "]"}; }
  size_t size() const { return j.size(); }
  const nlohmann::json& array() const {
    if (!j.is_array()) fail("expected an array");
    return j;
  }
  int64_t integer() const {
    if (!j.is_number_integer()) fail("expected an integer");
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("integer out of range");
    return j.get<int64_t>();
  }
  int id() const {
    int64_t i = integer();
    if (i < 0 || i > std::numeric_limits<int>::max()) fail("value id out of range");
    return static_cast<int>(i);
  }
  double number() const {
    if (j.is_number()) return j.get<double>();
    if (j.is_string()) {
      const auto& s = j.get_ref<const std::string&>();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    }
    fail("expected a number");
  }
  bool boolean() const {
    if (!j.is_boolean()) fail("expected true or false");
    return j.get<bool>();
  }
  const std::string& str() const {
    if (!j.is_string()) fail("expected a string");
    return j.get_ref<const std::string&>();
  }
  /// A name or op: a string without control characters (they would garble one-line errors).
  const std::string& name() const {
    const std::string& s = str();
    for (unsigned char ch : s)
      if (ch < 0x20 || ch == 0x7f) fail("contains a control character");
    return s;
  }
  std::vector<int64_t> ints() const {
    std::vector<int64_t> out;
    const nlohmann::json& a = array();
    for (size_t i = 0; i < a.size(); ++i) out.push_back((*this)[i].integer());
    return out;
  }
};

/// Calls `f`; a jvpc::Error from a helper that does not know the JSON path gets `at`'s path
/// prefixed.
template <class F>
auto wrap(const At& at, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(at.path, 0) == 0) throw;
    at.fail(msg);
  }
}

}  // namespace jvpc
