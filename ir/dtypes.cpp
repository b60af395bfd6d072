// The names of dtypes (dtypes.h).
#include "ir/dtypes.h"

#include "ir/graph.h"
#include "ir/io/json_text.h"

#include <vector>

namespace jvpc {

namespace {

struct Names {
  c10::ScalarType type;
  const char* text;         // the text form's short name ("" : ATen's name)
  const char* safetensors;  // ("" : not storable)
  const char* python;       // torch.<python>
};

// Every dtype a graph may hold (flash attention's rng_state is UInt64: metadata only).
const std::vector<Names>& names() {
  static const std::vector<Names> table = {
      {c10::kDouble, "f64", "F64", "float64"}, {c10::kFloat, "f32", "F32", "float32"},
      {c10::kHalf, "f16", "F16", "float16"},   {c10::kBFloat16, "bf16", "BF16", "bfloat16"},
      {c10::kLong, "i64", "I64", "int64"},     {c10::kInt, "i32", "I32", "int32"},
      {c10::kShort, "", "I16", "int16"},       {c10::kChar, "", "I8", "int8"},
      {c10::kByte, "", "U8", "uint8"},         {c10::kBool, "bool", "BOOL", "bool"},
      {c10::kUInt64, "", "", "uint64"},
  };
  return table;
}

const Names* row(c10::ScalarType t) {
  for (const Names& n : names())
    if (n.type == t) return &n;
  return nullptr;
}

}  // namespace

std::string short_dtype_name(c10::ScalarType t) {
  const Names* n = row(t);
  return n && *n->text ? n->text : c10::toString(t);
}

c10::ScalarType dtype_from_text(const std::string& name) {
  for (const Names& n : names())
    if (name == n.text) return n.type;
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    auto t = static_cast<c10::ScalarType>(i);
    if (c10::toString(t) == name) return t;
  }
  throw Error("unknown dtype '" + name + "'");
}

c10::ScalarType dtype_from_aten_name(const std::string& name) {
  for (const Names& n : names())
    if (name == c10::toString(n.type)) return n.type;
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i)
    if (c10::toString(static_cast<c10::ScalarType>(i)) == name)
      throw Error("dtype '" + name + "' is not supported (jvpc handles real, integer and bool tensors)");
  throw Error("unknown dtype '" + name + "'");
}

const char* safetensors_dtype_name(c10::ScalarType t) {
  const Names* n = row(t);
  if (!n || !*n->safetensors) throw Error(std::string("dtype ") + c10::toString(t) + " cannot be stored");
  return n->safetensors;
}

c10::ScalarType dtype_from_safetensors_name(const std::string& name) {
  for (const Names& n : names())
    if (*n.safetensors && name == n.safetensors) return n.type;
  throw Error("unknown safetensors dtype " + shown(name));
}

c10::ScalarType dtype_from_python_name(const std::string& name) {
  for (const Names& n : names())
    if (name == n.python) return n.type;
  throw Error("unknown dtype '" + name + "'");
}

std::vector<std::pair<std::string, std::string>> python_dtype_names() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Names& n : names()) out.emplace_back(c10::toString(n.type), n.python);
  return out;
}

}  // namespace jvpc
