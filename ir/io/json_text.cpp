// JSON text: the linear-time parser with nesting and duplicate-key limits (json_text.h).
#include "ir/io/json_text.h"

#include <iterator>

namespace jvpc {

using nlohmann::json;

void release(json& j) noexcept {
  if (j.is_array()) {
    auto& a = j.get_ref<json::array_t&>();
    while (!a.empty()) {
      release(a.back());
      a.pop_back();
    }
  } else if (j.is_object()) {
    auto& o = j.get_ref<json::object_t&>();
    while (!o.empty()) {
      auto last = std::prev(o.end());
      release(last->second);
      o.erase(last);
    }
  }
  j = nullptr;
}

std::string shown(const std::string& s) {
  return json(s.size() > 60 ? s.substr(0, 60) + "..." : s).dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// nlohmann's message without its "[json.exception.<kind>.<id>] " prefix.
std::string json_message(const json::exception& e) {
  std::string msg = e.what();
  auto p = msg.find("] ");
  return p == std::string::npos ? msg : msg.substr(p + 2);
}

// An iterator over the text that notes how far the parser has read: the byte offset of the
// errors the handler finds (nlohmann gives offsets only to its own errors).
struct CountingIterator {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  const char* p;
  const char** read;  // where the parser has read up to
  reference operator*() const { return *p; }
  CountingIterator& operator++() {
    *read = ++p;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return p == o.p; }
  bool operator!=(const CountingIterator& o) const { return p != o.p; }
};

constexpr int kMaxJsonDepth = 16;

// What the document's parts take on the heap with libstdc++ on 64 bits, malloc's 16 bytes of
// overhead per block included: a value in an array (16 bytes, with the vector's doubling at
// most 32), an object (its std::map), a member (a map node: links, key and value), an array
// (its std::vector), a string (its std::string), and the block a long string or key needs
// beyond the short-string buffer (15 characters).
constexpr int64_t kArrayElementBytes = 32, kObjectBytes = 64, kMemberBytes = 96, kArrayBytes = 40, kStringBytes = 48;
int64_t long_string_bytes(const std::string& s) { return s.size() > 15 ? static_cast<int64_t>(s.size()) + 1 + 16 : 0; }

// Builds the DOM from nlohmann's SAX events, in time linear in the text (nlohmann's callback
// parser scans the enclosing array at the end of every object, which is quadratic in an array
// of objects). It limits nesting to kMaxJsonDepth arrays and objects, and refuses a key that
// appears twice in one object (nlohmann's own parser keeps the last). It counts the memory the
// document takes as it grows (the k*Bytes above), and refuses a document past `budget` bytes.
class DomBuilder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  DomBuilder(json& root, const char* begin, const char* const* read, bool quote, int64_t budget)
      : root_(root), begin_(begin), read_(read), quote_(quote), budget_(budget) {}

  bool null() { return put(nullptr); }
  bool boolean(bool b) { return put(b); }
  bool number_integer(number_integer_t i) { return put(i); }
  bool number_unsigned(number_unsigned_t u) { return put(u); }
  bool number_float(number_float_t d, const string_t&) { return put(d); }
  bool string(string_t& s) {
    charge(kStringBytes + long_string_bytes(s));
    return put(std::move(s));
  }
  bool binary(binary_t& b) { return put(std::move(b)); }  // not in JSON text
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& k) {
    charge(kMemberBytes + long_string_bytes(k));
    auto& object = stack_.back()->get_ref<json::object_t&>();
    auto [it, fresh] = object.try_emplace(k);  // k is left as it is when the key exists
    if (!fresh)
      fail("duplicate key" + (quote_ ? " " + shown(k) : std::string()) + " (keys in an object must be unique)");
    element_ = &it->second;
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;  // nlohmann's own type, handled by parse_json
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("invalid JSON at byte " + std::to_string(*read_ - begin_) + ": " + what);
  }
  void charge(int64_t bytes) {
    used_ += bytes;
    if (used_ > budget_)
      fail("the document takes more than " + std::to_string(budget_) + " bytes of memory (" +
           std::to_string(kJsonMemoryPerTextByte) + " per byte of text, and 1 MiB)");
  }
  // Places a value: the root, the next element of the array being read, or the value of the key
  // just read. Returns where it is.
  template <class V>
  json* place(V&& v) {
    if (stack_.empty()) {
      root_ = json(std::forward<V>(v));
      return &root_;
    }
    json* top = stack_.back();
    if (top->is_array()) {
      charge(kArrayElementBytes);
      auto& array = top->get_ref<json::array_t&>();
      array.emplace_back(std::forward<V>(v));
      return &array.back();
    }
    *element_ = json(std::forward<V>(v));
    return element_;
  }
  template <class V>
  bool put(V&& v) {
    place(std::forward<V>(v));
    return true;
  }
  bool open(json::value_t kind) {
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth))
      fail("JSON nesting deeper than " + std::to_string(kMaxJsonDepth));
    charge(kind == json::value_t::object ? kObjectBytes : kArrayBytes);
    stack_.push_back(place(kind));  // pointers stay valid: only the innermost container grows
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  json& root_;
  const char* begin_;
  const char* const* read_;
  bool quote_;
  int64_t budget_, used_ = 0;
  std::vector<json*> stack_;  // the arrays and objects being read, outermost first
  json* element_ = nullptr;   // the value of the key just read
};

}  // namespace

json parse_json(const std::string& text, bool quote) {
  json j;
  const char* read = text.data();
  try {
    int64_t budget = kJsonMemoryPerTextByte * static_cast<int64_t>(text.size()) + (int64_t{1} << 20);
    DomBuilder builder(j, text.data(), &read, quote, budget);
    CountingIterator first{text.data(), &read}, last{text.data() + text.size(), &read};
    json::sax_parse(first, last, &builder);
  } catch (const json::parse_error& e) {
    throw Error("invalid JSON at byte " + std::to_string(e.byte) + (quote ? ": " + json_message(e) : ""));
  } catch (const json::exception& e) {  // e.g. out_of_range 406: a number past double's range
    if (!quote) throw Error("invalid JSON: a number out of range");
    std::string msg = json_message(e);
    throw Error("invalid JSON: " + (msg.size() > 120 ? msg.substr(0, 120) + "..." : msg));
  } catch (const std::bad_alloc&) {
    release(j);  // what was built is freed before the error is made
    throw Error("out of memory parsing " + std::to_string(text.size()) + " bytes of JSON");
  }
  return j;
}

}  // namespace jvpc
