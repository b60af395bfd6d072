// The JSON form of a graph (graph_json.h). Every read is checked: this code faces files
// written by hand, by other versions and by fuzzers.
#include "ir/io/graph_json.h"

#include "ir/dtypes.h"
#include "ir/io/json_text.h"
#include "ir/loadable_ops.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/verifier.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

namespace jvpc {

using nlohmann::json;

// --- names of enums -------------------------------------------------------------------------

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
    dtype_from_aten_name(c10::toString(m.dtype));
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

TensorMeta read_meta(const At& m) {
  TensorMeta t;
  t.sizes = m["sizes"].ints();
  t.strides = m["strides"].ints();
  t.dtype = wrap(m, [&] { return dtype_from_aten_name(m["dtype"].str()); });
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
  if (key == "scalar_type") return Arg::of_scalar_type(wrap(v, [&] { return dtype_from_aten_name(v.str()); }));
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

std::unique_ptr<Graph> checked_from_json(const json& j, bool trusted) {
  try {
    return from_json(j, trusted);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a check this loader lacks: still one line, never an abort
    throw Error("invalid graph: " + one_line(e));
  }
}

std::unique_ptr<Graph> parse_graph(const std::string& text, bool trusted) {
  json j = parse_json(text);
  ReleaseOnExit free_j{j};
  return checked_from_json(j, trusted);
}

}  // namespace jvpc
