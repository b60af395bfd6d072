// The text form of a graph (one line per input, node and the return) and its Graphviz form.
// ir/text.cpp reads the text form back; the two must change together.
#include "ir/printer.h"

#include "ir/ops.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>
#include <unordered_map>

namespace jvpc {

std::string format_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".";
  return s;
}

std::string meta_text(const TensorMeta& m) {
  std::string s = m.str();  // "f32[2,3]" or "f32[2,3]@cuda:0"
  bool contiguous = false;
  try {
    contiguous = m.is_contiguous();
  } catch (const Error&) {  // sizes that overflow: print what is there
  }
  if (contiguous) return s;
  std::string strides = "{";
  for (size_t i = 0; i < m.strides.size(); ++i) strides += (i ? "," : "") + std::to_string(m.strides[i]);
  strides += "}";
  return s.insert(s.find(']') + 1, strides);
}

std::string name_text(const std::string& name) {
  bool bare = !name.empty();
  for (unsigned char c : name) bare &= std::isalnum(c) || c == '_' || c == '.' || c == '\'' || c == '-';
  if (bare && name != "None") return name;
  std::string out = "\"";
  for (char c : name) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

namespace {

std::string ref(const Value* v) { return "%" + std::to_string(v->id()); }

template <class T, class F>
std::string list(const std::vector<T>& xs, F f) {
  std::string s = "[";
  for (size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + f(xs[i]);
  return s + "]";
}

std::string arg_text(const Node& n, const Arg& a) {
  auto operand = [&](int o) { return o < 0 ? std::string("None") : ref(n.input(static_cast<size_t>(o))); };
  switch (a.kind) {
    case ArgKind::None:
      return "None";
    case ArgKind::Bool:
      return a.value.toBool() ? "true" : "false";
    case ArgKind::Int:
      return std::to_string(a.value.toInt());
    case ArgKind::Float:
      return format_double(a.value.toDouble());
    case ArgKind::Str: {
      std::string out = "'";
      for (char c : a.value.toStringRef()) {
        if (c == '\'' || c == '\\') out += '\\';
        out += c;
      }
      return out + "'";
    }
    case ArgKind::Ints:
      return list(a.value.toIntVector(), [](int64_t i) { return std::to_string(i); });
    case ArgKind::Floats:
      return list(a.value.toDoubleVector(), format_double);
    case ArgKind::Bools:
      return list(a.value.toBoolList().vec(), [](bool b) { return std::string(b ? "true" : "false"); });
    case ArgKind::ScalarType:
      return c10::toString(static_cast<c10::ScalarType>(a.value.toInt()));
    case ArgKind::Layout: {
      std::ostringstream os;
      os << static_cast<c10::Layout>(a.value.toInt());
      return os.str();
    }
    case ArgKind::MemoryFormat: {
      std::ostringstream os;
      os << static_cast<c10::MemoryFormat>(a.value.toInt());
      return os.str();
    }
    case ArgKind::Device:
      return a.value.toDevice().str();
    case ArgKind::Tensor:
      return operand(a.operands.at(0));
    case ArgKind::TensorList:
    case ArgKind::OptTensorList:
      return list(a.operands, operand);
  }
  return "?";
}

std::string outputs_text(const Node& n) {
  std::string s;
  for (size_t i = 0; i < n.outputs().size(); ++i)
    s += (i ? ", " : "") + ref(n.output(i)) + " : " + meta_text(n.output(i)->meta());
  return s.empty() ? "()" : s;
}

}  // namespace

std::string to_text(const Node& n) {
  std::string s = outputs_text(n) + " = " + n.op() + "(";
  for (size_t i = 0; i < n.args().size(); ++i) s += (i ? ", " : "") + arg_text(n, n.arg(i));
  s += ")";
  std::vector<std::string> flags;
  if (n.impure()) flags.push_back("impure");
  if (n.return_counts() != std::vector<int>(n.outputs().size(), 1))
    flags.push_back("returns " + list(n.return_counts(), [](int c) { return std::to_string(c); }));
  for (size_t i = 0; i < flags.size(); ++i) s += (i ? ", " : "  # ") + flags[i];
  return s;
}

std::string to_text(const Graph& g) {
  std::ostringstream os;
  os << "graph(";
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Input& in = g.inputs()[i];
    os << (i ? ",\n      " : "") << ref(in.value) << " : " << meta_text(in.value->meta()) << " " << name_text(in.name);
    bool plain = in.role == Role::Primal && in.differentiable && in.aliases.empty() && in.tangent_of.empty();
    if (!plain) {  // a differentiable primal input says so only when it has other flags
      os << " [" << role_name(in.role);
      if (in.role == Role::Primal && in.differentiable) os << ", differentiable";
      if (in.role == Role::Constant && in.data.defined()) os << ", stored";
      if (!in.aliases.empty()) os << ", aliases " << name_text(in.aliases);
      if (!in.tangent_of.empty()) os << ", tangent_of " << name_text(in.tangent_of);
      os << "]";
    }
  }
  os << "):\n";
  for (const Node* n : g.nodes()) os << "  " << to_text(*n) << "\n";
  os << "  return (";
  for (size_t i = 0; i < g.outputs().size(); ++i)
    os << (i ? ", " : "") << ref(g.outputs()[i]) << " " << name_text(g.output_names()[i]);
  os << ")\n";
  return os.str();
}

namespace {
// A DOT string's contents: quotes and backslashes escaped.
std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
}  // namespace

std::string to_dot(const Graph& g, const std::string& title) {
  std::ostringstream os;
  os << "digraph \"" << dot_escape(title) << "\" {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n"
     << "  edge [fontname=\"Helvetica\", fontsize=8];\n";
  auto vname = [](const Value* v) { return "v" + std::to_string(v->id()); };
  // A value is drawn at its producer (a node, named by its position) or as an input box.
  std::unordered_map<const Node*, std::string> node_id;
  auto src = [&](const Value* v) { return v->producer() ? node_id.at(v->producer()) : vname(v); };
  for (const Input& in : g.inputs()) {
    const char* color = in.role == Role::Tangent ? "lightblue" : in.role == Role::Constant ? "lightgrey" : "palegreen";
    os << "  " << vname(in.value) << " [shape=box, style=filled, fillcolor=" << color << ", label=\""
       << dot_escape(in.name) << "\\n"
       << in.value->meta().str() << "\"];\n";
  }
  for (const Node* n : g.nodes()) {
    std::string id = "n" + std::to_string(node_id.size());
    node_id[n] = id;
    bool heavy = is_matmul(n->op());
    os << "  " << id << " [label=\"" << n->op() << "\"" << (heavy ? ", style=filled, fillcolor=orange" : "") << "];\n";
    for (const Value* v : n->inputs()) {
      os << "  " << src(v) << " -> " << id << " [label=\"" << v->meta().str() << "\"];\n";
    }
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* v = g.outputs()[i];
    os << "  out" << i << " [shape=box, style=filled, fillcolor=gold, label=\"" << dot_escape(g.output_names()[i])
       << "\"];\n";
    os << "  " << src(v) << " -> out" << i << " [label=\"" << v->meta().str() << "\"];\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace jvpc
