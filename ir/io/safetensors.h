// Safetensors files: the constants beside a graph file, and inputs files.
//
// A file's bytes are the header's length (8 bytes, little-endian), the header (a JSON object:
// per tensor its dtype, shape and data_offsets), then the tensors' data, contiguous and in
// order, from an 8-byte-aligned start. Reading checks the header whole, by the format's rules,
// before any tensor is made: its length bounded (100,000,000 bytes, the reference
// implementation's limit) and within the file, a JSON object with unique names, each entry's
// data_offsets the size of its shape and dtype, and the entries, in the order of their
// offsets, covering the data exactly (from 0, without gaps or overlaps, to the end of the
// file). Errors never quote the file's bytes, only tensor names.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace jvpc {

class AtomicFile;  // ir/io/files.h

/// The bytes of a safetensors file holding `tensors` (moved to the CPU, made contiguous), in order.
std::string safetensors_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors);
/// The tensors of a safetensors file, from its bytes; `path` and `what` ("constants file")
/// name the file in errors.
std::unordered_map<std::string, at::Tensor> parse_safetensors(const std::string& bytes, const std::string& path,
                                                              const std::string& what);

/// Writes the file atomically (see AtomicFile): a failure leaves the previous file as it was.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
/// Writes the safetensors file into `f` without committing it, to replace several files together.
void write_safetensors(AtomicFile& f, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
/// `what` names the file in errors ("constants file", "inputs file").
std::unordered_map<std::string, at::Tensor> read_safetensors(const std::string& path,
                                                             const std::string& what = "constants file");

}  // namespace jvpc
