// Op handles: one per operator that jvpc's code names (ir/op_names.def), as `ops::bmm`,
// `ops::mul_Tensor` (the overload after an underscore), `ops::jvpc_attention_tangent` (outside
// aten, the namespace first). A handle is an index into the op table: nodes compare by it
// (`n->is(ops::bmm)`), a misspelt handle does not compile, and the op's properties are read off
// it. Names stay strings where text is parsed or printed; a handle converts to its name.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace jvpc {

/// What the op table says of an op (ir/op_names.def); OpInfo and the predicates of ir/ops.h read it.
enum OpProperty : uint32_t {
  kCommutative = 1u << 0,              ///< its first two tensors commute (add.Tensor: when alpha is 1)
  kMatmul = 1u << 1,                   ///< FLOPs counted as matmul FLOPs, as FlopCounterMode counts them
  kFusedAttention = 1u << 2,           ///< a fused SDPA kernel (flash, efficient, cuDNN, CPU flash)
  kAllocatesUninitialized = 1u << 3,   ///< an allocation with no contents yet (empty and its kin)
  kReadsOnlyMetadataOfSelf = 1u << 4,  ///< takes its first operand's metadata, never its contents
  kViewScatter = 1u << 5,              ///< scatters into a view of its first operand, unread there
  kFillsSelfAtRandom = 1u << 6,        ///< overwrites its first operand with random values
  kUnmarkedView = 1u << 7,             ///< a return may be an input or its view; the schema does not say
  kSampleWise = 1u << 8,               ///< pooling by averages, resampling, padding: each sample by itself
  kNotInEveryRelease = 1u << 9,        ///< not registered in every torch release jvpc supports
};

class Op {
 public:
  constexpr Op() = default;
  constexpr explicit Op(uint16_t index) : index_(index) {}
  /// The handle named `qualified_name` ("aten::mul.Tensor"), or Op(), which no handle equals.
  static Op find(const std::string& qualified_name);
  /// Every handle, in the table's order.
  static std::vector<Op> all();
  /// "aten::mul.Tensor"; "" for Op().
  const std::string& name() const;
  operator const std::string&() const { return name(); }
  uint32_t properties() const;
  bool has(OpProperty p) const { return (properties() & p) != 0; }
  constexpr uint16_t index() const { return index_; }
  constexpr bool operator==(Op o) const { return index_ == o.index_; }
  constexpr bool operator!=(Op o) const { return index_ != o.index_; }

 private:
  uint16_t index_ = 0;
};

/// A name against a handle: the same as against the handle's name.
inline bool operator==(const std::string& name, Op op) { return name == op.name(); }
inline bool operator==(Op op, const std::string& name) { return name == op.name(); }
inline bool operator!=(const std::string& name, Op op) { return name != op.name(); }
inline bool operator!=(Op op, const std::string& name) { return name != op.name(); }

/// Writes the op's name.
std::ostream& operator<<(std::ostream& os, Op op);

namespace ops {
enum : uint16_t {
  none_index = 0,
#define JVPC_OP(handle, name, properties) handle##_index,
#include "ir/op_names.def"
#undef JVPC_OP
  count_index
};
#define JVPC_OP(handle, name, properties) inline constexpr Op handle{handle##_index};
#include "ir/op_names.def"
#undef JVPC_OP
}  // namespace ops

}  // namespace jvpc
