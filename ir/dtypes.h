// The names of dtypes, in one table: the text form's short names (f32, as TensorMeta::str()
// writes them), ATen's names (Float: the JSON form, c10::toString), the safetensors format's
// (F32) and Python's (float32: torch.float32, and the examples' --dtype). The JSON and text
// forms, the safetensors reader and writer, the examples and the Python scripts
// (jvpc._C.dtype_names) read it.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <utility>
#include <vector>

namespace jvpc {

/// "f32", "f64", "f16", "bf16", "i64", "i32", "bool"; ATen's name for the others ("Byte",
/// "ComplexFloat").
std::string short_dtype_name(c10::ScalarType t);
/// A dtype by its short name or ATen's name ("f32" or "Float"). Throws jvpc::Error naming it.
c10::ScalarType dtype_from_text(const std::string& name);
/// A dtype a graph file may hold, by ATen's name ("Float"): real, integer and bool tensors.
/// Throws jvpc::Error for a complex or quantized one, and for a name that is none.
c10::ScalarType dtype_from_aten_name(const std::string& name);
/// The safetensors format's name ("F32"); throws jvpc::Error for a dtype it cannot hold.
const char* safetensors_dtype_name(c10::ScalarType t);
c10::ScalarType dtype_from_safetensors_name(const std::string& name);
/// A dtype by Python's name ("float32", as torch.float32; the examples' --dtype). Throws
/// jvpc::Error for a name that is none.
c10::ScalarType dtype_from_python_name(const std::string& name);
/// ATen's name -> Python's, for every dtype a graph may hold ({"Float", "float32"}, ...).
std::vector<std::pair<std::string, std::string>> python_dtype_names();

}  // namespace jvpc
