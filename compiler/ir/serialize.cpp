// JSON and safetensors reading and writing. Every read is checked: this code faces files
// written by hand, by other versions and by fuzzers.
#include "compiler/ir/serialize.h"

#include "compiler/ir/files.h"
#include "compiler/ir/limits.h"
#include "compiler/ir/loadable_ops.h"
#include "compiler/ir/ops.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verifier.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/hash.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>

namespace jvpc {

using nlohmann::json;

// --- names of enums -------------------------------------------------------------------------

c10::ScalarType parse_dtype(const std::string& s) {
#define JVPC_DTYPE_CASE(_, name) \
  if (s == #name) return c10::ScalarType::name;
  AT_FORALL_SCALAR_TYPES(JVPC_DTYPE_CASE)
  JVPC_DTYPE_CASE(_, Bool)
  JVPC_DTYPE_CASE(_, Half)
  JVPC_DTYPE_CASE(_, BFloat16)
  JVPC_DTYPE_CASE(_, UInt64)  // flash attention's rng_state (metadata only: constants cannot be uint64)
#undef JVPC_DTYPE_CASE
#define JVPC_DTYPE_CASE(_, name) \
  if (s == #name) throw Error("dtype '" + s + "' is not supported (jvpc handles real, integer and bool tensors)");
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(JVPC_DTYPE_CASE)
#undef JVPC_DTYPE_CASE
  throw Error("unknown dtype '" + s + "'");
}

namespace {

std::string layout_name(c10::Layout l) {
  std::ostringstream os;
  os << l;
  return os.str();
}
std::string memory_format_name(c10::MemoryFormat m) {
  std::ostringstream os;
  os << m;
  return os.str();
}
c10::Layout parse_layout(const std::string& s) {
  for (auto l : {c10::kStrided, c10::kSparse, c10::kSparseCsr, c10::kMkldnn})
    if (layout_name(l) == s) return l;
  throw Error("unknown layout '" + s + "'");
}
c10::MemoryFormat parse_memory_format(const std::string& s) {
  for (auto m : {c10::MemoryFormat::Contiguous, c10::MemoryFormat::Preserve, c10::MemoryFormat::ChannelsLast,
                 c10::MemoryFormat::ChannelsLast3d})
    if (memory_format_name(m) == s) return m;
  throw Error("unknown memory format '" + s + "'");
}
c10::Device parse_device(const std::string& s) {
  c10::Device d(c10::kCPU);
  try {
    d = c10::Device(s);
  } catch (const std::exception&) {
    throw Error("unknown device '" + s + "'");
  }
  if (d.is_cpu()) return c10::Device(c10::kCPU);  // "cpu:0" is the CPU
  if (!d.is_cuda()) throw Error("device '" + s + "' is not supported (cpu or cuda)");
  return d;
}

json float_json(double d) { return std::isfinite(d) ? json(d) : json(format_double(d)); }

// --- writing --------------------------------------------------------------------------------

json meta_json(const TensorMeta& m) {
  try {  // what the loader refuses is not written: a graph that saves must load back
    parse_dtype(c10::toString(m.dtype));
  } catch (const Error&) {
    throw Error(std::string("dtype ") + c10::toString(m.dtype) +
                " cannot be saved (jvpc's files hold real, integer and bool tensors)");
  }
  return {{"sizes", m.sizes}, {"strides", m.strides}, {"dtype", c10::toString(m.dtype)}, {"device", m.device.str()}};
}

json arg_json(const Node& n, const Arg& a) {
  auto id = [&](int o) { return o < 0 ? json(nullptr) : json(n.input(static_cast<size_t>(o))->id()); };
  switch (a.kind) {
    case ArgKind::None:
      return {{"none", nullptr}};
    case ArgKind::Bool:
      return {{"bool", a.value.toBool()}};
    case ArgKind::Int:
      return {{"int", a.value.toInt()}};
    case ArgKind::Float:
      return {{"float", float_json(a.value.toDouble())}};
    case ArgKind::Str:
      return {{"str", a.value.toStringRef()}};
    case ArgKind::Ints:
      return {{"ints", a.value.toIntVector()}};
    case ArgKind::Floats: {
      json l = json::array();
      for (double d : a.value.toDoubleVector()) l.push_back(float_json(d));
      return {{"floats", l}};
    }
    case ArgKind::Bools:
      return {{"bools", a.value.toBoolList().vec()}};
    case ArgKind::ScalarType:
      return {{"scalar_type", c10::toString(static_cast<c10::ScalarType>(a.value.toInt()))}};
    case ArgKind::Layout:
      return {{"layout", layout_name(static_cast<c10::Layout>(a.value.toInt()))}};
    case ArgKind::MemoryFormat:
      return {{"memory_format", memory_format_name(static_cast<c10::MemoryFormat>(a.value.toInt()))}};
    case ArgKind::Device:
      return {{"device", a.value.toDevice().str()}};
    case ArgKind::Tensor:
      return {{"tensor", id(a.operands.at(0))}};
    case ArgKind::TensorList:
    case ArgKind::OptTensorList: {
      json l = json::array();
      for (int o : a.operands) l.push_back(id(o));
      return {{arg_kind_name(a.kind), l}};
    }
  }
  return {};
}

}  // namespace

json to_json(const Graph& g, const std::string& constants_file) {
  json j;
  j["format"] = "jvpc-graph";
  j["schema_version"] = kSchemaVersion;
  if (!constants_file.empty()) j["constants_file"] = constants_file;
  json inputs = json::array();
  for (const Input& in : g.inputs()) {
    json ji = {
        {"name", in.name}, {"id", in.value->id()}, {"role", role_name(in.role)}, {"meta", meta_json(in.value->meta())}};
    if (in.role == Role::Primal) ji["differentiable"] = in.differentiable;
    if (in.role == Role::Constant) ji["stored"] = in.data.defined();
    if (!in.aliases.empty()) ji["aliases"] = in.aliases;
    if (!in.tangent_of.empty()) ji["tangent_of"] = in.tangent_of;
    inputs.push_back(std::move(ji));
  }
  j["inputs"] = std::move(inputs);
  json nodes = json::array();
  for (const Node* n : g.nodes()) {
    json jn = {{"op", n->op()}};
    json args = json::array();
    for (const Arg& a : n->args()) args.push_back(arg_json(*n, a));
    jn["args"] = std::move(args);
    json outs = json::array();
    for (const Value* v : n->outputs()) outs.push_back({{"id", v->id()}, {"meta", meta_json(v->meta())}});
    jn["outputs"] = std::move(outs);
    if (n->return_counts() != std::vector<int>(n->outputs().size(), 1)) jn["returns"] = n->return_counts();
    if (n->impure()) jn["impure"] = true;
    nodes.push_back(std::move(jn));
  }
  j["nodes"] = std::move(nodes);
  json outs = json::array();
  for (size_t i = 0; i < g.outputs().size(); ++i)
    outs.push_back({{"name", g.output_names()[i]}, {"id", g.outputs()[i]->id()}});
  j["outputs"] = std::move(outs);
  return j;
}

// --- reading --------------------------------------------------------------------------------

namespace {

// A JSON value with the path that led to it, for error messages.
struct At {
  const json& j;
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
  const json& array() const {
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
    const json& a = array();
    for (size_t i = 0; i < a.size(); ++i) out.push_back((*this)[i].integer());
    return out;
  }
};

template <class F>
auto wrap(const At& at, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    // Errors from helpers that do not know the JSON path get it prefixed here.
    std::string msg = e.what();
    if (msg.rfind(at.path, 0) == 0) throw;
    at.fail(msg);
  }
}

TensorMeta read_meta(const At& m) {
  TensorMeta t;
  t.sizes = m["sizes"].ints();
  t.strides = m["strides"].ints();
  t.dtype = wrap(m, [&] { return parse_dtype(m["dtype"].str()); });
  t.device = wrap(m, [&] { return parse_device(m["device"].str()); });
  if (t.strides.size() != t.sizes.size()) m.fail("sizes and strides differ in length");
  wrap(m, [&] { return t.numel(); });
  return t;
}

Role parse_role(const At& a) {
  const std::string& s = a.str();
  if (s == "primal") return Role::Primal;
  if (s == "tangent") return Role::Tangent;
  if (s == "constant") return Role::Constant;
  a.fail("unknown role '" + s + "'");
}

// Reads one argument. Tensor ids are mapped to operand indices through `operand`.
Arg read_arg(const At& a, const std::function<int(const At&)>& operand) {
  if (!a.j.is_object() || a.j.size() != 1) a.fail("expected an object with one key (the argument's kind)");
  const std::string& key = a.j.begin().key();
  At v{a.j.begin().value(), a.path + "." + key};
  if (key == "none") return Arg::none();
  if (key == "bool") return Arg::of_bool(v.boolean());
  if (key == "int") return Arg::of_int(v.integer());
  if (key == "float") return Arg::of_float(v.number());
  if (key == "str") return Arg::of_str(v.str());
  if (key == "ints") return Arg::of_ints(v.ints());
  if (key == "floats") {
    std::vector<double> ds;
    for (size_t i = 0; i < v.array().size(); ++i) ds.push_back(v[i].number());
    return Arg{ArgKind::Floats, ds, {}};
  }
  if (key == "bools") {
    c10::List<bool> bs;
    for (size_t i = 0; i < v.array().size(); ++i) bs.push_back(v[i].boolean());
    return Arg{ArgKind::Bools, bs, {}};
  }
  if (key == "scalar_type") return Arg::of_scalar_type(wrap(v, [&] { return parse_dtype(v.str()); }));
  if (key == "layout")
    return Arg{ArgKind::Layout, static_cast<int64_t>(wrap(v, [&] { return parse_layout(v.str()); })), {}};
  if (key == "memory_format")
    return Arg{ArgKind::MemoryFormat, static_cast<int64_t>(wrap(v, [&] { return parse_memory_format(v.str()); })), {}};
  if (key == "device") return Arg::of_device(wrap(v, [&] { return parse_device(v.str()); }));
  if (key == "tensor") return Arg::tensor(operand(v));
  if (key == "tensors" || key == "opt_tensors") {
    Arg out{key == "tensors" ? ArgKind::TensorList : ArgKind::OptTensorList, {}, {}};
    for (size_t i = 0; i < v.array().size(); ++i) {
      if (v[i].j.is_null() && out.kind == ArgKind::OptTensorList)
        out.operands.push_back(-1);
      else
        out.operands.push_back(operand(v[i]));
    }
    return out;
  }
  a.fail("unknown argument kind '" + key + "'");
}

}  // namespace

std::unique_ptr<Graph> from_json(const json& j, bool trusted) {
  At root{j, "$"};
  if (!j.is_object()) root.fail("expected a JSON object");
  if (!root.has("schema_version")) root.fail("missing \"schema_version\" (not a jvpc graph?)");
  int64_t version = root["schema_version"].integer();
  if (version != kSchemaVersion)
    root.fail("schema_version " + std::to_string(version) + " is not supported (this jvpc reads version " +
              std::to_string(kSchemaVersion) + ")");
  if (root.has("format") && root["format"].str() != "jvpc-graph") root.fail("format is not \"jvpc-graph\"");

  auto g = std::make_unique<Graph>();
  std::unordered_map<int, Value*> by_id;         // ids defined so far
  std::unordered_map<int, std::string> all_ids;  // every id the file defines, and where
  // First pass: where is each id defined? (To tell "dangling" from "used before defined".)
  {
    At ins = root["inputs"];
    for (size_t i = 0; i < ins.array().size(); ++i) {
      int id = ins[i]["id"].id();
      if (!all_ids.emplace(id, ins[i].path).second)
        ins[i]["id"].fail("value id %" + std::to_string(id) + " is defined twice");
    }
    At nodes = root["nodes"];
    for (size_t i = 0; i < nodes.array().size(); ++i) {
      At outs = nodes[i]["outputs"];
      for (size_t k = 0; k < outs.array().size(); ++k) {
        int id = outs[k]["id"].id();
        if (!all_ids.emplace(id, outs[k].path).second)
          outs[k]["id"].fail("value id %" + std::to_string(id) + " is defined twice (also at " + all_ids[id] + ")");
      }
    }
  }
  auto lookup = [&](const At& a) -> Value* {
    int id = a.id();
    auto it = by_id.find(id);
    if (it != by_id.end()) return it->second;
    if (all_ids.count(id))
      a.fail("value %" + std::to_string(id) + " is used before it is defined at " + all_ids[id] +
             " (nodes must be in topological order; a cycle cannot be)");
    a.fail("value %" + std::to_string(id) + " is not defined anywhere (dangling reference)");
  };

  At ins = root["inputs"];
  for (size_t i = 0; i < ins.size(); ++i) {
    At in = ins[i];
    Role role = parse_role(in["role"]);
    bool diff = in.has("differentiable") ? in["differentiable"].boolean() : false;
    if (in.has("stored") && in["stored"].boolean() && role != Role::Constant)
      in["stored"].fail("only constants are stored");
    if (in.has("view_of")) {
      if (!in.has("stored") || !in["stored"].boolean()) in["view_of"].fail("only a stored constant can be a view");
      in["view_of"]["tensor"].name();
      if (in["view_of"]["offset"].integer() < 0) in["view_of"]["offset"].fail("expected an offset of 0 or more");
    }
    Value* v = g->add_input(in["name"].name(), read_meta(in["meta"]), role, diff);
    if (in.has("aliases")) g->inputs().back().aliases = in["aliases"].name();
    if (in.has("tangent_of")) g->inputs().back().tangent_of = in["tangent_of"].name();
    by_id[in["id"].id()] = v;
  }

  At nodes = root["nodes"];
  for (size_t i = 0; i < nodes.size(); ++i) {
    At jn = nodes[i];
    const std::string& op = jn["op"].name();
    const OpInfo& info = wrap(jn["op"], [&]() -> const OpInfo& { return op_info(op); });
    if (!trusted && !is_loadable_op(op)) jn["op"].fail(not_loadable(op));
    At jargs = jn["args"];
    const auto& schema = info.schema().arguments();
    if (jargs.array().size() != schema.size())
      jargs.fail(op + " takes " + std::to_string(schema.size()) + " arguments, got " + std::to_string(jargs.size()));
    std::vector<Value*> inputs;
    std::vector<Arg> args;
    for (size_t k = 0; k < jargs.size(); ++k) {
      Arg a = read_arg(jargs[k], [&](const At& ref) {
        inputs.push_back(lookup(ref));
        return static_cast<int>(inputs.size() - 1);
      });
      if (!kind_matches(a.kind, schema[k]))
        jargs[k].fail("argument '" + schema[k].name() + "' of " + op + " has type " + schema[k].real_type()->str() +
                      " and cannot take a " + arg_kind_name(a.kind));
      args.push_back(std::move(a));
    }
    At jouts = jn["outputs"];
    std::vector<TensorMeta> metas;
    for (size_t k = 0; k < jouts.array().size(); ++k) metas.push_back(read_meta(jouts[k]["meta"]));
    std::vector<int> counts;
    if (jn.has("returns")) {
      for (int64_t c : jn["returns"].ints()) {
        if (c < 0 || c > 1 << 20) jn["returns"].fail("bad return count");
        counts.push_back(static_cast<int>(c));
      }
    } else {
      counts.assign(metas.size(), 1);
    }
    if (counts.size() != info.schema().returns().size())
      jn.fail(op + " has " + std::to_string(info.schema().returns().size()) + " returns, the node declares " +
              std::to_string(counts.size()));
    int64_t total = 0;
    for (int c : counts) total += c;
    if (total != static_cast<int64_t>(metas.size())) jn.fail("\"returns\" does not add up to the number of outputs");
    bool impure = jn.has("impure") ? jn["impure"].boolean() : false;
    Node* n = g->create(op, std::move(args), std::move(inputs), std::move(metas), std::move(counts), impure);
    std::string written = hidden_write(*n);
    if (!written.empty()) jn.fail(written);
    for (size_t k = 0; k < n->outputs().size(); ++k) by_id[jouts[k]["id"].id()] = n->output(k);
  }

  At outs = root["outputs"];
  for (size_t i = 0; i < outs.array().size(); ++i) g->add_output(lookup(outs[i]["id"]), outs[i]["name"].name());

  // The graph takes the ids the file gives its values: every error, here and when it runs,
  // names them as the file does.
  std::unordered_map<const Value*, int> file_id;
  for (const auto& [id, v] : by_id) file_id[v] = id;
  g->renumber([&](const Value* v) { return file_id.at(v); });
  VerifyOptions options = trusted ? VerifyOptions{} : VerifyOptions::untrusted();
  try {
    verify(*g, options);
    check_initialized(*g);
  } catch (const Error& e) {
    throw Error(std::string("$.nodes: ") + e.what());
  }
  return g;
}

namespace {

// nlohmann's message without its "[json.exception.<kind>.<id>] " prefix.
std::string json_message(const json::exception& e) {
  std::string msg = e.what();
  auto p = msg.find("] ");
  return p == std::string::npos ? msg : msg.substr(p + 2);
}

// A string from a file as errors show it: escaped (no control characters reach the terminal),
// quoted, and cut short.
std::string shown(const std::string& s) {
  return json(s.size() > 60 ? s.substr(0, 60) + "..." : s).dump(-1, ' ', false, json::error_handler_t::replace);
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

// Builds the DOM from nlohmann's SAX events, in time linear in the text (nlohmann's callback
// parser scans the enclosing array at the end of every object, which is quadratic in an array
// of objects). It limits nesting to kMaxJsonDepth arrays and objects, and refuses a key that
// appears twice in one object (nlohmann's own parser keeps the last).
class DomBuilder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  DomBuilder(json& root, const char* begin, const char* const* read, bool quote)
      : root_(root), begin_(begin), read_(read), quote_(quote) {}

  bool null() { return put(nullptr); }
  bool boolean(bool b) { return put(b); }
  bool number_integer(number_integer_t i) { return put(i); }
  bool number_unsigned(number_unsigned_t u) { return put(u); }
  bool number_float(number_float_t d, const string_t&) { return put(d); }
  bool string(string_t& s) { return put(std::move(s)); }
  bool binary(binary_t& b) { return put(std::move(b)); }  // not in JSON text
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& k) {
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
  std::vector<json*> stack_;  // the arrays and objects being read, outermost first
  json* element_ = nullptr;   // the value of the key just read
};

}  // namespace

json parse_json(const std::string& text, bool quote) {
  json j;
  const char* read = text.data();
  try {
    DomBuilder builder(j, text.data(), &read, quote);
    CountingIterator first{text.data(), &read}, last{text.data() + text.size(), &read};
    json::sax_parse(first, last, &builder);
  } catch (const json::parse_error& e) {
    throw Error("invalid JSON at byte " + std::to_string(e.byte) + (quote ? ": " + json_message(e) : ""));
  } catch (const json::exception& e) {  // e.g. out_of_range 406: a number past double's range
    if (!quote) throw Error("invalid JSON: a number out of range");
    std::string msg = json_message(e);
    throw Error("invalid JSON: " + (msg.size() > 120 ? msg.substr(0, 120) + "..." : msg));
  }
  return j;
}

namespace {

std::unique_ptr<Graph> checked_from_json(const json& j, bool trusted) {
  try {
    return from_json(j, trusted);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a check this loader lacks: still one line, never an abort
    throw Error("invalid graph: " + one_line(e));
  }
}

}  // namespace

std::unique_ptr<Graph> parse_graph(const std::string& text, bool trusted) {
  return checked_from_json(parse_json(text), trusted);
}

// --- files --------------------------------------------------------------------------------

namespace {

std::string basename_of(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}

const char* safetensors_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble:
      return "F64";
    case c10::kFloat:
      return "F32";
    case c10::kHalf:
      return "F16";
    case c10::kBFloat16:
      return "BF16";
    case c10::kLong:
      return "I64";
    case c10::kInt:
      return "I32";
    case c10::kShort:
      return "I16";
    case c10::kChar:
      return "I8";
    case c10::kByte:
      return "U8";
    case c10::kBool:
      return "BOOL";
    default:
      throw Error(std::string("dtype ") + c10::toString(t) + " cannot be stored");
  }
}
c10::ScalarType from_safetensors_dtype(const std::string& s) {
  for (auto t : {c10::kDouble, c10::kFloat, c10::kHalf, c10::kBFloat16, c10::kLong, c10::kInt, c10::kShort, c10::kChar,
                 c10::kByte, c10::kBool})
    if (s == safetensors_dtype(t)) return t;
  throw Error("unknown safetensors dtype " + shown(s));
}

}  // namespace

std::string constants_path_for(const std::string& graph_path) {
  const std::string ext = ".json";
  if (graph_path.size() > ext.size() && graph_path.compare(graph_path.size() - ext.size(), ext.size(), ext) == 0)
    return graph_path.substr(0, graph_path.size() - ext.size()) + ".safetensors";
  return graph_path + ".safetensors";
}

namespace {

// A safetensors file's bytes: the header's length (8 bytes, little-endian), the header, then the
// tensors' data, contiguous and in order, from an 8-byte-aligned start.
std::string safetensors_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  json header = json::object();
  std::vector<at::Tensor> blobs;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw Error("safetensors: the name '__metadata__' is reserved");
    if (header.contains(name)) throw Error("safetensors: tensor '" + name + "' is given twice");  // one would be lost
    at::Tensor c = t.to(at::kCPU).contiguous();
    int64_t nbytes = static_cast<int64_t>(c.nbytes());
    header[name] = {{"dtype", safetensors_dtype(c.scalar_type())},
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

// The safetensors format's own limit on the header (the reference implementation's).
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// The tensors of a safetensors file, from its bytes. The header is checked whole, by the
// format's rules, before any tensor is made: its length bounded and within the file, a JSON
// object with unique names, each entry's data_offsets the size of its shape and dtype, and the
// entries, in the order of their offsets, covering the data exactly (from 0, without gaps or
// overlaps, to the end of the file). Errors never quote the file's bytes, only tensor names.
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
      c10::ScalarType dtype = wrap(e, [&] { return from_safetensors_dtype(e["dtype"].str()); });
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

}  // namespace

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

namespace {

// SHA-1 of bytes, in hex (c10::sha1 leaves the empty string's state unset).
std::string sha1_hex(const std::string& bytes) {
  return bytes.empty() ? "da39a3ee5e6b4b0d3255bfef95601890afd80709" : c10::sha1(bytes).str();
}

// The constants file of a graph file `j`, checked to be the one saved with it: its size (which
// also bounds the read), then its SHA-1, over the bytes as read. A graph file written before
// jvpc recorded them has neither, and its constants file is read unchecked.
std::unordered_map<std::string, at::Tensor> read_constants(const json& j, const std::string& file,
                                                           const std::string& graph_path) {
  const char* what = "constants file";
  bool has_size = j.contains("constants_size"), has_sha1 = j.contains("constants_sha1");
  if (!has_size && !has_sha1) return read_safetensors(file, what);
  int64_t size = 0;
  std::string sha1;
  try {
    At root{j, "$"};
    if (!has_size || !has_sha1) root.fail("constants_size and constants_sha1 come together");
    size = root["constants_size"].integer();
    if (size < 0) root["constants_size"].fail("expected a size of 0 or more");
    sha1 = root["constants_sha1"].str();
    if (sha1.size() != 40 || sha1.find_first_not_of("0123456789abcdef") != std::string::npos)
      root["constants_sha1"].fail("expected 40 lowercase hex digits");
  } catch (const Error& e) {
    throw Error(printable_path(graph_path) + ": " + e.what());
  }
  std::string bytes = read_regular_file(file, what, size);
  if (static_cast<int64_t>(bytes.size()) != size)
    throw Error(std::string(what) + " " + quoted_path(file) + " has " + std::to_string(bytes.size()) +
                " bytes but the graph file records " + std::to_string(size) + ": the two are not from the same save");
  if (sha1_hex(bytes) != sha1)
    throw Error(std::string(what) + " " + quoted_path(file) +
                " is not the one saved with the graph file (its SHA-1 differs from the one the graph file records)");
  return parse_safetensors(bytes, file, what);
}

/// A stored constant that is a view into a shared 1-D entry of the constants file.
at::Tensor view_of_entry(const TensorMeta& m, const json& view,
                         const std::unordered_map<std::string, at::Tensor>& tensors, const std::string& file,
                         const std::string& name) {
  const std::string& entry = view["tensor"].get_ref<const std::string&>();
  int64_t offset = view["offset"].get<int64_t>();
  auto bad = [&](const std::string& why) {
    return Error(printable_path(file) + ": constant '" + name + "' is a view of '" + entry + "' " + why);
  };
  auto it = tensors.find(entry);
  if (it == tensors.end()) throw bad("but that tensor is missing");
  const at::Tensor& base = it->second;
  if (base.dim() != 1 || base.scalar_type() != m.dtype)
    throw bad("but that tensor is " + TensorMeta::of(base).str() + ", not " + c10::toString(m.dtype) + "[n]");
  // The elements the view reaches (LibTorch's own bound, overflow-checked; the verifier has
  // already refused negative strides).
  size_t needed = 0;
  try {
    needed = at::detail::computeStorageNbytes(m.sizes, m.strides, 1, static_cast<size_t>(offset));
  } catch (const c10::Error&) {
    throw bad("past its end");
  }
  if (offset > base.numel() || needed > static_cast<size_t>(base.numel())) throw bad("past its end");
  return base.as_strided(m.sizes, m.strides, offset);
}

// Refuses a graph over its memory limit before any constant is read: constants by their
// declared sizes, those stored as views into one entry of the constants file counted once, as
// the span of it they reach. The limit is that of the device the graph loads onto and runs on:
// LoadOptions::device, else the one the Executable's check uses (execution_device: that of the
// first non-constant input).
void check_memory_before_loading(const Graph& g, const json& j, const LoadOptions& options) {
  c10::Device target = options.device ? *options.device : execution_device(g);
  if (target.is_cuda() && !at::hasCUDA()) return;  // refused below, before anything runs
  MemoryNeed need = memory_needed(g);
  need.constants = 0;
  auto add = [&](int64_t bytes) {
    need.constants = need.constants > kNoMemoryLimit - bytes ? kNoMemoryLimit : need.constants + bytes;
  };
  std::unordered_map<std::string, int64_t> entries;  // view_of tensor -> bytes its views reach
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Input& in = g.inputs()[i];
    if (in.role != Role::Constant) continue;
    const TensorMeta& m = in.value->meta();
    const json& ji = j["inputs"][i];
    bool view = ji.contains("view_of");
    int64_t bytes = kNoMemoryLimit;
    try {
      size_t n = at::detail::computeStorageNbytes(m.sizes, m.strides, c10::elementSize(m.dtype),
                                                  view ? ji["view_of"]["offset"].get<size_t>() : 0);
      if (n < static_cast<size_t>(kNoMemoryLimit)) bytes = static_cast<int64_t>(n);
    } catch (const c10::Error&) {  // past size_t: over any limit
    }
    if (view) {
      int64_t& e = entries[ji["view_of"]["tensor"].get<std::string>()];
      e = std::max(e, bytes);
    } else {
      add(bytes);
    }
  }
  for (const auto& [name, bytes] : entries) add(bytes);
  check_memory_limit(need, options.max_memory, target, "LoadOptions::max_memory, --max-memory");
}

}  // namespace

namespace {

// A graph's constants as safetensors entries: one per storage. A constant alone in its storage is
// stored as itself. Constants that share a storage (the probabilities as [B,H,S,S] and as
// [B·H,S,S]) become views into one 1-D entry that spans them, named after the first of them, so
// that loading shares the memory again.
struct StoredConstants {
  std::vector<std::pair<std::string, at::Tensor>> entries;
  std::unordered_map<std::string, json> view_of;  // constant name -> {"tensor", "offset"}

  /// Adds "view_of" to the inputs of `graph_json` (to_json's) that are such views.
  void annotate(json& graph_json) const {
    for (json& ji : graph_json["inputs"]) {
      auto it = view_of.find(ji["name"].get<std::string>());
      if (it != view_of.end()) ji["view_of"] = it->second;
    }
  }
};

// What load() refuses is not written: a graph that saves loads back.
void check_savable(const Graph& g, const std::string& path, const SaveOptions& options) {
  if (!options.trusted) check_loadable_ops(g, "cannot save '" + path + "'");
  try {
    check_initialized(g);
  } catch (const Error& e) {
    throw Error("cannot save '" + path + "': " + e.what());
  }
}

StoredConstants stored_constants(const Graph& g) {
  std::vector<std::vector<const Input*>> groups;
  std::unordered_map<const void*, size_t> group_of;
  for (const Input& in : g.inputs()) {
    if (in.role != Role::Constant || !in.data.defined()) continue;
    in.check_unwritten();  // its bytes would not match the other constants'
    const at::Tensor& t = in.data;
    if (in.name == "__metadata__") throw Error("a constant may not be named '__metadata__' (safetensors reserves it)");
    bool shareable = t.has_storage() && t.strides() == c10::IntArrayRef(in.value->meta().strides);
    const void* key = shareable ? static_cast<const void*>(t.storage().unsafeGetStorageImpl()) : &in;
    auto [it, fresh] = group_of.emplace(key, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(&in);
  }
  StoredConstants c;
  for (const auto& group : groups) {
    const at::Tensor& first = group[0]->data;
    bool one_dtype = std::all_of(group.begin(), group.end(),
                                 [&](const Input* in) { return in->data.scalar_type() == first.scalar_type(); });
    // A constant alone in its storage is stored as itself, unless it has gaps or repeats
    // (a step slice, an expand): then, like a group, as the span of storage it reaches.
    bool dense =
        first.is_non_overlapping_and_dense() && first.strides() == c10::IntArrayRef(group[0]->value->meta().strides);
    if ((group.size() == 1 && dense) || !one_dtype) {
      for (const Input* in : group) c.entries.emplace_back(in->name, in->data);
      continue;
    }
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const Input* in : group) {  // the elements [lo, hi) of the storage the group reaches
      const at::Tensor& t = in->data;
      size_t end = t.numel() ? at::detail::computeStorageNbytes(t.sizes(), t.strides(), 1, t.storage_offset())
                             : static_cast<size_t>(t.storage_offset());
      lo = std::min(lo, t.storage_offset());
      hi = std::max(hi, static_cast<int64_t>(end));
    }
    c.entries.emplace_back(group[0]->name, first.as_strided({hi - lo}, {1}, lo));
    for (const Input* in : group)
      c.view_of[in->name] = {{"tensor", group[0]->name}, {"offset", in->data.storage_offset() - lo}};
  }
  return c;
}

// Writes the JSON file `path` that `make_json` gives (from the constants file's name beside it,
// "" when there are no entries) and the constants file. Both are written in full before either
// replaces its destination, the constants first: a failure leaves the previous pair as it was.
void write_with_constants(const std::string& path, const StoredConstants& c,
                          const std::function<json(const std::string&)>& make_json) {
  std::string cpath = c.entries.empty() ? "" : constants_path_for(path);
  if (!cpath.empty()) check_destination(cpath);  // before the graph's temporary file is made
  AtomicFile graph_file(path);
  std::optional<AtomicFile> constants_file;
  std::string constants;
  if (!c.entries.empty()) {
    constants = safetensors_bytes(c.entries);
    constants_file.emplace(cpath);
    constants_file->write(constants);
    constants_file->finish();
  }
  json j = make_json(cpath.empty() ? "" : basename_of(cpath));
  if (!cpath.empty()) {  // load() takes this constants file, and no other, with this graph
    j["constants_size"] = constants.size();
    j["constants_sha1"] = sha1_hex(constants);
  }
  graph_file.write(j.dump(1) + "\n");
  graph_file.finish();
  if (constants_file) constants_file->commit();
  graph_file.commit();
}

// A graph from its JSON `j` in the file `path`, under `options`; its stored constants come from
// the constants file that `top` (the file's top-level object) names and checks.
std::unique_ptr<Graph> graph_from_file_json(const json& j, const json& top, const std::string& path,
                                            const LoadOptions& options, const std::string& which = "") {
  const std::optional<c10::Device>& device = options.device;
  std::unique_ptr<Graph> g;
  std::string constants_file;
  try {
    g = checked_from_json(j, options.trusted);  // also checks every "stored" flag and name read below
    check_memory_before_loading(*g, j, options);
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + which + e.what());
  }
  bool stores = false;
  for (const auto& in : j["inputs"])
    if (in.value("stored", false)) {
      stores = true;
      if (!top.contains("constants_file"))
        throw Error(printable_path(path) + ": " + which + "constant '" + in["name"].get<std::string>() +
                    "' is stored but no constants_file is named");
    }
  if (stores) {
    if (!top["constants_file"].is_string()) throw Error(printable_path(path) + ": constants_file must be a string");
    const std::string& named = top["constants_file"].get_ref<const std::string&>();
    constants_file = confined_file_beside(path, named, "constants file");
  }
  std::unordered_map<std::string, at::Tensor> tensors;
  if (!constants_file.empty()) tensors = read_constants(top, constants_file, path);
  std::unordered_map<std::string, Input*> by_name;
  for (Input& x : g->inputs()) by_name[x.name] = &x;
  for (const auto& jin : j["inputs"]) {
    if (!jin.value("stored", false)) continue;
    const std::string& name = jin["name"].get_ref<const std::string&>();
    Input* in = by_name.at(name);
    const TensorMeta& m = in->value->meta();
    in->aliases.clear();  // the graph now holds its own copy, not a view of the caller's input
    if (jin.contains("view_of")) {
      in->bind(view_of_entry(m, jin["view_of"], tensors, constants_file, name));
      continue;
    }
    auto it = tensors.find(name);
    if (it == tensors.end()) throw Error(printable_path(constants_file) + ": constant '" + name + "' is missing");
    TensorMeta got = TensorMeta::of(it->second);
    if (got.sizes != m.sizes || got.dtype != m.dtype)
      throw Error(printable_path(constants_file) + ": constant '" + name + "' is " + got.str() +
                  " but the graph declares " + TensorMeta::contiguous(m.sizes, m.dtype, c10::kCPU).str());
    at::Tensor t = it->second;
    if (!m.is_contiguous()) {
      if (!on_meta(m).is_non_overlapping_and_dense())
        throw Error(printable_path(path) + ": " + which + "constant '" + name + "' declares overlapping strides");
      t = at::empty_strided(m.sizes, m.strides, t.options()).copy_(t);
    }
    in->bind(t);
  }
  try {  // before anything runs, on the CPU: a bad index on CUDA is a device-side assert
    check_index_constants(*g);
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + which + e.what());
  }
  c10::Device target = device ? *device : c10::Device(c10::kCPU);
  if (!device)
    for (const Input& in : g->inputs()) target = in.value->meta().device;  // the graph's own device
  if (!device && target.is_cuda() && !at::hasCUDA())
    throw Error(printable_path(path) + ": the graph is on " + target.str() +
                " but CUDA is not available (load it for the CPU)");
  retarget(*g, target);
  return g;
}

}  // namespace

void save(const Graph& g, const std::string& path, const SaveOptions& options) {
  check_savable(g, path, options);
  StoredConstants c = stored_constants(g);
  write_with_constants(path, c, [&](const std::string& constants_file) {
    json j = to_json(g, constants_file);
    c.annotate(j);
    return j;
  });
}

void save_program(const Graph& primal, const Graph& tangent, size_t primal_outputs, bool exact_strides,
                  const std::string& path, const SaveOptions& options) {
  check_savable(primal, path, options);
  check_savable(tangent, path, options);
  for (const Input& in : tangent.inputs())
    if (in.role == Role::Constant && in.data.defined())
      throw Error("cannot save '" + path + "': the tangent graph's constant '" + in.name +
                  "' is bound (a program's residuals are made at each point)");
  if (primal_outputs > primal.outputs().size()) throw Error("cannot save '" + path + "': too many primal outputs");
  StoredConstants c = stored_constants(primal);
  write_with_constants(path, c, [&](const std::string& constants_file) {
    json j = {{"format", "jvpc-program"}, {"schema_version", kSchemaVersion}};
    if (!constants_file.empty()) j["constants_file"] = constants_file;
    j["primal_outputs"] = primal_outputs;
    j["exact_strides"] = exact_strides;
    j["primal"] = to_json(primal);
    c.annotate(j["primal"]);
    j["tangent"] = to_json(tangent);
    return j;
  });
}

std::unique_ptr<Graph> load(const std::string& path, std::optional<c10::Device> device) {
  LoadOptions o;
  o.device = device;
  return load(path, o);
}

std::unique_ptr<Graph> load(const std::string& path, const LoadOptions& options) {
  std::string text = read_regular_file(path, "graph file", int64_t{1} << 30);
  json j;
  try {
    j = parse_json(text);
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + e.what());
  }
  if (j.is_object() && j.contains("format") && j["format"] == "jvpc-program")
    throw Error(printable_path(path) + ": is a compiled program, not a graph (load it with load_program)");
  return graph_from_file_json(j, j, path, options);
}

ProgramGraphs load_program(const std::string& path, const LoadOptions& options) {
  std::string text = read_regular_file(path, "program file", int64_t{1} << 30);
  json j;
  ProgramGraphs p;
  try {
    j = parse_json(text);
    At root{j, "$"};
    if (!j.is_object()) root.fail("expected a JSON object");
    if (!root.has("format") || root["format"].str() != "jvpc-program")
      root.fail("format is not \"jvpc-program\" (not a compiled program?)");
    int64_t version = root["schema_version"].integer();
    if (version != kSchemaVersion)
      root.fail("schema_version " + std::to_string(version) + " is not supported (this jvpc reads version " +
                std::to_string(kSchemaVersion) + ")");
    int64_t outputs = root["primal_outputs"].integer();
    if (outputs < 1) root["primal_outputs"].fail("expected 1 or more");
    p.primal_outputs = static_cast<size_t>(outputs);
    p.exact_strides = root["exact_strides"].boolean();
    for (const char* graph : {"primal", "tangent"})
      if (!root[graph].j.is_object()) root[graph].fail("expected an object (a graph)");
  } catch (const Error& e) {
    throw Error(printable_path(path) + ": " + e.what());
  }
  p.primal = graph_from_file_json(j["primal"], j, path, options, "primal graph: ");
  p.tangent = graph_from_file_json(j["tangent"], j, path, options, "tangent graph: ");
  if (p.primal_outputs > p.primal->outputs().size())
    throw Error(printable_path(path) + ": primal_outputs is " + std::to_string(p.primal_outputs) +
                " but the primal graph returns " + std::to_string(p.primal->outputs().size()) + " values");
  return p;
}

namespace {

// After arguments changed: each node's outputs re-derived where a Meta kernel or shape rule
// exists (kernels may differ by device: native_layer_norm's float16 statistics are float32 on
// CUDA only), else changed by `fallback`.
void rederive_outputs(Graph& g, const std::function<void(TensorMeta&)>& fallback) {
  for (Node* n : g.nodes()) {
    try {
      std::vector<int> counts;
      std::vector<TensorMeta> out = infer_outputs(*n, &counts);
      if (counts == n->return_counts() && out.size() == n->outputs().size()) {
        for (size_t i = 0; i < out.size(); ++i) {
          if (value_dependent_shape(*n, i)) {  // the declared shape, moved or retyped
            out[i] = n->outputs()[i]->meta();
            fallback(out[i]);
          }
          n->outputs()[i]->set_meta(out[i]);
        }
        continue;
      }
    } catch (const NoShapeRule&) {}
    for (Value* o : n->outputs()) {
      TensorMeta m = o->meta();
      fallback(m);
      o->set_meta(std::move(m));
    }
  }
}

}  // namespace

void retarget(Graph& g, c10::Device device) {
  if (device.is_cuda() && !at::hasCUDA())
    throw Error("device " + device.str() + ": CUDA is not available on this machine");
  // The constants first, so that a failure (out of memory) leaves the graph as it was.
  std::vector<at::Tensor> moved;
  for (const Input& in : g.inputs()) {
    at::Tensor t = in.data;
    if (t.defined() && t.device() != device) {
      in.check_unwritten();
      try {
        t = t.to(device);
      } catch (const c10::Error& e) {
        throw Error("constant '" + in.name + "' cannot move to " + device.str() + ": " + one_line(e));
      }
    }
    moved.push_back(t);
  }
  auto move = [&](TensorMeta& m) { m.device = device; };
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    Input& in = g.inputs()[i];
    TensorMeta m = in.value->meta();
    move(m);
    in.value->set_meta(std::move(m));
    if (moved[i].defined() && !moved[i].is_same(in.data)) in.bind(moved[i]);
  }
  for (Node* n : g.nodes())
    for (size_t i = 0; i < n->args().size(); ++i)
      if (n->arg(i).kind == ArgKind::Device) n->set_constant_arg(i, Arg::of_device(device));
  rederive_outputs(g, move);
}

void retype_floating(Graph& g, c10::ScalarType dtype) {
  auto retype = [&](TensorMeta& m) {
    if (c10::isFloatingType(m.dtype)) m.dtype = dtype;
  };
  for (Input& in : g.inputs()) {
    TensorMeta m = in.value->meta();
    retype(m);
    in.value->set_meta(std::move(m));
    if (in.data.defined() && c10::isFloatingType(in.data.scalar_type())) {
      in.check_unwritten();
      in.bind(in.data.to(dtype));
    }
  }
  for (Node* n : g.nodes())
    for (size_t i = 0; i < n->args().size(); ++i)
      if (n->arg(i).kind == ArgKind::ScalarType &&
          c10::isFloatingType(static_cast<c10::ScalarType>(n->arg(i).value.toInt())))
        n->set_constant_arg(i, Arg::of_scalar_type(dtype));
  rederive_outputs(g, retype);
}

}  // namespace jvpc
