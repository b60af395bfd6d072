// The reader of the text form (printer.cpp writes it). A hand-written recursive descent over
// the characters: the grammar is small, and errors name a line and column.
//
//   graph   := "graph" "(" [input {"," input}] ")" ":" {node} return
//   input   := ref ":" meta name ["[" role {"," flag} "]"]
//   node    := ("()" | ref ":" meta {"," ref ":" meta}) "=" op "(" [arg {"," arg}] ")" ["#" nflag {"," nflag}]
//   return  := "return" "(" [ref [name] {"," ref [name]}] ")"
//   meta    := dtype "[" ints "]" ["{" ints "}"] ["@" device]
//   arg     := None | true | false | int | float | 'str' | ref | word | "[" [arg {"," arg}] "]"
//
// An argument's kind is read from its text where the text tells (1 is an int, 1. a float, %3 a
// tensor) and from the op's schema where it does not (Float is a dtype, [] an empty list of the
// schema's element type), so the text needs no kind annotations.
#include "ir/text.h"

#include "ir/dtypes.h"

#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/verifier.h"

#include <ATen/ATen.h>

#include <cctype>
#include <charconv>
#include <sstream>
#include <unordered_map>

namespace jvpc {

namespace {

// An argument as written, before the schema gives it a kind.
struct Lit {
  enum K { None, Bool, Int, Float, Str, Word, Ref, List } k = None;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;   // Str, Word
  int ref = -1;    // Ref: the value's id
  size_t pos = 0;  // where it starts, for errors
  std::vector<Lit> items;
};

class Parser {
 public:
  Parser(const std::string& text, const ParseTextOptions& options) : t_(text), options_(options) {}

  std::unique_ptr<Graph> graph() {
    g_ = std::make_unique<Graph>();
    keyword("graph");
    expect('(');
    if (!peek(')')) do
        input();
      while (accept(','));
    expect(')');
    expect(':');
    while (!at_word("return")) node();
    keyword("return");
    expect('(');
    if (!peek(')')) do
        output();
      while (accept(','));
    expect(')');
    skip_space();
    if (pos_ < t_.size()) fail("text after the return");
    g_->renumber([&](const Value* v) { return ids_.at(v); });
    if (options_.verify) verify(*g_);
    return std::move(g_);
  }

 private:
  const std::string& t_;
  const ParseTextOptions& options_;
  size_t pos_ = 0;
  std::unique_ptr<Graph> g_;
  std::unordered_map<int, Value*> values_;     // text id -> value
  std::unordered_map<const Value*, int> ids_;  // value -> text id

  [[noreturn]] void fail(const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error("IR text, line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + msg);
  }

  // Spaces, newlines and comments (// to the end of the line); with `same_line` only spaces,
  // tabs and a comment, not the newline after it.
  void skip_space(bool same_line = false) {
    while (pos_ < t_.size()) {
      char c = t_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (!same_line && c == '\n')) {
        ++pos_;
      } else if (c == '/' && pos_ + 1 < t_.size() && t_[pos_ + 1] == '/') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  bool peek(char c) {
    skip_space();
    return pos_ < t_.size() && t_[pos_] == c;
  }
  bool accept(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  static bool word_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' || c == '\'' || c == '-' ||
           c == '+';
  }
  // A run of word characters (op names, dtypes, devices, bare names, numbers).
  std::string word() {
    skip_space();
    size_t start = pos_;
    while (pos_ < t_.size() && word_char(t_[pos_])) ++pos_;
    if (start == pos_) fail("expected a word");
    return t_.substr(start, pos_ - start);
  }
  bool at_word(const std::string& w) {
    skip_space();
    if (t_.compare(pos_, w.size(), w) != 0) return false;
    size_t end = pos_ + w.size();
    return end >= t_.size() || !word_char(t_[end]);
  }
  void keyword(const std::string& w) {
    if (!at_word(w)) fail("expected '" + w + "'");
    pos_ += w.size();
  }
  // A quoted string with backslash escapes, opened and closed by `q`.
  std::string quoted(char q) {
    expect(q);
    std::string out;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n') fail("unterminated string");
      char c = t_[pos_++];
      if (c == q) return out;
      if (c == '\\') {
        if (pos_ >= t_.size()) fail("unterminated string");
        c = t_[pos_++];
      }
      out += c;
    }
  }
  std::string name() { return peek('"') ? quoted('"') : word(); }
  int64_t integer() {
    std::string w = word();
    int64_t v = 0;
    auto r = std::from_chars(w.data(), w.data() + w.size(), v);
    if (r.ec != std::errc() || r.ptr != w.data() + w.size()) fail("expected an integer, not '" + w + "'");
    return v;
  }
  std::vector<int64_t> ints(char open, char close) {
    expect(open);
    std::vector<int64_t> out;
    if (!peek(close)) do
        out.push_back(integer());
      while (accept(','));
    expect(close);
    return out;
  }
  int ref() {
    expect('%');
    int64_t id = integer();
    if (id < 0 || id > INT32_MAX) fail("value id %" + std::to_string(id) + " is out of range");
    return static_cast<int>(id);
  }
  Value* use(int id) {
    auto it = values_.find(id);
    if (it == values_.end()) fail("%" + std::to_string(id) + " is not defined before this use");
    return it->second;
  }
  void define(int id, Value* v) {
    if (!values_.emplace(id, v).second) fail("%" + std::to_string(id) + " is defined twice");
    ids_[v] = id;
  }

  TensorMeta meta() {
    skip_space();
    size_t start = pos_;
    while (pos_ < t_.size() && std::isalnum(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    std::string dt = t_.substr(start, pos_ - start);
    c10::ScalarType dtype;
    try {
      dtype = dtype_from_text(dt);
    } catch (const Error& e) {
      pos_ = start;
      fail(e.what());
    }
    std::vector<int64_t> sizes = ints('[', ']');
    std::optional<std::vector<int64_t>> strides;
    if (pos_ < t_.size() && t_[pos_] == '{') strides = ints('{', '}');
    c10::Device device(c10::kCPU);
    if (pos_ < t_.size() && t_[pos_] == '@') {
      ++pos_;
      std::string d = word();
      try {
        device = c10::Device(d);
      } catch (const std::exception&) {
        fail("unknown device '" + d + "'");
      }
    }
    if (strides && strides->size() != sizes.size()) fail("sizes and strides differ in length");
    try {
      TensorMeta m = TensorMeta::contiguous(sizes, dtype, device);
      if (strides) m.strides = *strides;
      return m;
    } catch (const Error& e) {
      fail(e.what());
    }
  }

  void input() {
    int id = ref();
    expect(':');
    TensorMeta m = meta();
    std::string n = name();
    Role role = Role::Primal;
    bool differentiable = true, stored = false;
    std::string aliases, tangent_of;
    if (accept('[')) {
      std::string r = word();
      if (r == "primal")
        differentiable = false;
      else if (r == "tangent")
        role = Role::Tangent;
      else if (r == "constant")
        role = Role::Constant;
      else
        fail("unknown role '" + r + "'");
      while (accept(',')) {
        std::string f = word();
        if (f == "stored" && role == Role::Constant)
          stored = true;
        else if (f == "differentiable" && role == Role::Primal)
          differentiable = true;
        else if (f == "aliases")
          aliases = name();
        else if (f == "tangent_of")
          tangent_of = name();
        else
          fail("unknown flag '" + f + "' for a " + role_name(role) + " input");
      }
      expect(']');
    }
    Value* v = g_->add_input(n, m, role, role == Role::Primal && differentiable);
    Input& in = g_->inputs().back();
    in.aliases = aliases;
    in.tangent_of = tangent_of;
    if (stored)
      in.bind(options_.bind
                  ? options_.bind(n, m)
                  : at::empty_strided(m.sizes, m.strides, at::TensorOptions(m.dtype).device(m.device)).zero_());
    define(id, v);
  }

  Lit literal() {
    Lit l;
    skip_space();
    l.pos = pos_;
    if (pos_ >= t_.size()) fail("expected an argument");
    char c = t_[pos_];
    if (c == '%') {
      l.k = Lit::Ref;
      l.ref = ref();
    } else if (c == '\'') {
      l.k = Lit::Str;
      l.s = quoted('\'');
    } else if (c == '[') {
      l.k = Lit::List;
      ++pos_;
      if (!peek(']')) do
          l.items.push_back(literal());
        while (accept(','));
      expect(']');
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+') {
      std::string w = word();
      bool is_float = w.find_first_of(".eEn") != std::string::npos;  // 1.  1e-05  inf  nan
      const char* b = w.data() + (w[0] == '+' ? 1 : 0);
      std::from_chars_result r{};
      if (is_float) {
        l.k = Lit::Float;
        r = std::from_chars(b, w.data() + w.size(), l.d);
      } else {
        l.k = Lit::Int;
        r = std::from_chars(b, w.data() + w.size(), l.i);
      }
      if (r.ec != std::errc() || r.ptr != w.data() + w.size()) fail("bad number '" + w + "'");
    } else {
      std::string w = word();
      if (w == "None") {
        l.k = Lit::None;
      } else if (w == "true" || w == "false") {
        l.k = Lit::Bool;
        l.b = w == "true";
      } else if (w == "inf" || w == "nan") {
        l.k = Lit::Float;
        l.d = w == "inf" ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
      } else {
        l.k = Lit::Word;
        l.s = w;
      }
    }
    return l;
  }

  // A word argument: a dtype, layout, memory format or device, whichever the schema takes.
  std::optional<Arg> word_arg(const std::string& w, const c10::Argument& sa) {
    if (kind_matches(ArgKind::ScalarType, sa)) {
      try {
        return Arg::of_scalar_type(dtype_from_text(w));
      } catch (const Error&) {}
    }
    auto str = [](auto x) {
      std::ostringstream os;
      os << x;
      return os.str();
    };
    if (kind_matches(ArgKind::Layout, sa))
      for (auto l : {c10::kStrided, c10::kSparse, c10::kSparseCsr, c10::kMkldnn})
        if (str(l) == w) return Arg{ArgKind::Layout, static_cast<int64_t>(l), {}};
    if (kind_matches(ArgKind::MemoryFormat, sa))
      for (auto m : {c10::MemoryFormat::Contiguous, c10::MemoryFormat::Preserve, c10::MemoryFormat::ChannelsLast,
                     c10::MemoryFormat::ChannelsLast3d})
        if (str(m) == w) return Arg{ArgKind::MemoryFormat, static_cast<int64_t>(m), {}};
    if (kind_matches(ArgKind::Device, sa)) {
      try {
        return Arg::of_device(c10::Device(w));
      } catch (const std::exception&) {}
    }
    return std::nullopt;
  }

  // Errors point at the argument's text, though it was read already.
  Arg to_arg(const Lit& l, const c10::Argument& sa, std::vector<Value*>& inputs) {
    size_t after = pos_;
    pos_ = l.pos;
    Arg a = to_arg_here(l, sa, inputs);
    pos_ = after;
    return a;
  }
  Arg to_arg_here(const Lit& l, const c10::Argument& sa, std::vector<Value*>& inputs) {
    auto operand = [&](const Lit& r) {
      pos_ = r.pos;
      inputs.push_back(use(r.ref));
      return static_cast<int>(inputs.size()) - 1;
    };
    switch (l.k) {
      case Lit::None:
        return Arg::none();
      case Lit::Bool:
        return Arg::of_bool(l.b);
      case Lit::Int:
        return Arg::of_int(l.i);
      case Lit::Float:
        return Arg::of_float(l.d);
      case Lit::Str:
        return Arg::of_str(l.s);
      case Lit::Ref:
        return Arg::tensor(operand(l));
      case Lit::Word: {
        auto a = word_arg(l.s, sa);
        if (!a) fail("'" + l.s + "' is no value of argument '" + sa.name() + "' (" + sa.real_type()->str() + ")");
        return *a;
      }
      case Lit::List:
        break;
    }
    bool tensors = false, floats = false, bools = !l.items.empty(), numbers = true;
    for (const Lit& i : l.items) {
      tensors |= i.k == Lit::Ref || i.k == Lit::None;
      floats |= i.k == Lit::Float;
      bools &= i.k == Lit::Bool;
      numbers &= i.k == Lit::Int || i.k == Lit::Float;
    }
    if (l.items.empty()) {  // the schema says of what
      for (ArgKind k : {ArgKind::OptTensorList, ArgKind::TensorList, ArgKind::Ints, ArgKind::Floats, ArgKind::Bools})
        if (kind_matches(k, sa)) {
          if (k == ArgKind::Ints) return Arg::of_ints({});
          if (k == ArgKind::Floats) return Arg{ArgKind::Floats, std::vector<double>{}, {}};
          if (k == ArgKind::Bools) return Arg{ArgKind::Bools, c10::List<bool>(), {}};
          return Arg{k, {}, {}};
        }
      return Arg::of_ints({});
    }
    if (tensors) {
      Arg a{kind_matches(ArgKind::OptTensorList, sa) ? ArgKind::OptTensorList : ArgKind::TensorList, {}, {}};
      for (const Lit& i : l.items) {
        if (i.k == Lit::None && a.kind == ArgKind::OptTensorList)
          a.operands.push_back(-1);
        else if (i.k == Lit::Ref)
          a.operands.push_back(operand(i));
        else
          fail("a list of tensors holds something else");
      }
      return a;
    }
    if (bools) {
      c10::List<bool> bs;
      for (const Lit& i : l.items) bs.push_back(i.b);
      return Arg{ArgKind::Bools, bs, {}};
    }
    if (!numbers) fail("a list of mixed kinds");
    if (floats) {
      std::vector<double> ds;
      for (const Lit& i : l.items) ds.push_back(i.k == Lit::Float ? i.d : static_cast<double>(i.i));
      return Arg{ArgKind::Floats, ds, {}};
    }
    std::vector<int64_t> is;
    for (const Lit& i : l.items) is.push_back(i.i);
    return Arg::of_ints(is);
  }

  void node() {
    std::vector<std::pair<int, TensorMeta>> outs;
    if (accept('(')) {
      expect(')');
    } else {
      do {
        int id = ref();
        expect(':');
        outs.emplace_back(id, meta());
      } while (accept(','));
    }
    expect('=');
    size_t op_pos = (skip_space(), pos_);
    std::string op = word();
    const OpInfo* info = nullptr;
    try {
      info = &op_info(op);
    } catch (const std::exception&) {
      pos_ = op_pos;
      fail(std::string("unknown op '") + op + "'");
    }
    const auto& schema = info->schema().arguments();
    expect('(');
    std::vector<Lit> lits;
    if (!peek(')')) do
        lits.push_back(literal());
      while (accept(','));
    expect(')');
    if (lits.size() != schema.size())
      fail(op + " takes " + std::to_string(schema.size()) + " arguments, the text gives " +
           std::to_string(lits.size()));
    std::vector<Arg> args;
    std::vector<Value*> inputs;
    for (size_t i = 0; i < lits.size(); ++i) args.push_back(to_arg(lits[i], schema[i], inputs));
    bool impure = false;
    std::vector<int> counts;
    skip_space(true);
    if (pos_ < t_.size() && t_[pos_] == '#') {
      ++pos_;
      do {
        std::string f = word();
        if (f == "impure") {
          impure = true;
        } else if (f == "returns") {
          for (int64_t c : ints('[', ']')) counts.push_back(static_cast<int>(c));
        } else {
          fail("unknown node flag '" + f + "'");
        }
        skip_space(true);
      } while (pos_ < t_.size() && t_[pos_] == ',' && ++pos_);
    }
    std::vector<TensorMeta> metas;
    for (const auto& o : outs) metas.push_back(o.second);
    Node* n = nullptr;
    try {
      n = g_->create(op, std::move(args), std::move(inputs), std::move(metas), std::move(counts), impure);
    } catch (const Error& e) {
      fail(e.what());
    }
    for (size_t i = 0; i < outs.size(); ++i) define(outs[i].first, n->output(i));
  }

  void output() {
    Value* v = use(ref());
    std::string n;
    if (!peek(',') && !peek(')')) n = name();
    g_->add_output(v, n);
  }
};

}  // namespace

std::unique_ptr<Graph> parse_text(const std::string& text, const ParseTextOptions& options) {
  return Parser(text, options).graph();
}

}  // namespace jvpc
