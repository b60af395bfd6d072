// The batching rule table and the rule makers shared by the family files.
#include "passes/batch_rules/rules.h"
#include "ir/op.h"

#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>

namespace jvpc::batch_rules {

Value* Ctx::x(size_t arg) const {
  const Arg& a = n.arg(arg);
  if (a.kind != ArgKind::Tensor) throw Error(n.op() + ": argument " + std::to_string(arg) + " is not a tensor");
  return operands_.at(static_cast<size_t>(a.operands.at(0)));
}

bool Ctx::batched(size_t arg) const {
  const Arg& a = n.arg(arg);
  return a.kind == ArgKind::Tensor && batched_.at(static_cast<size_t>(a.operands.at(0)));
}

std::vector<BArg> Ctx::args() const {
  std::vector<BArg> out;
  for (const Arg& a : n.args()) {
    switch (a.kind) {
      case ArgKind::Tensor:
        out.emplace_back(operands_.at(static_cast<size_t>(a.operands.at(0))));
        break;
      case ArgKind::TensorList:
      case ArgKind::OptTensorList: {
        std::vector<Value*> vs;
        for (int o : a.operands) vs.push_back(o < 0 ? nullptr : operands_.at(static_cast<size_t>(o)));
        out.emplace_back(std::move(vs));
        break;
      }
      case ArgKind::MemoryFormat: {
        // channels_last needs a rank the K axis changes; the values do not depend on the layout
        auto f = static_cast<c10::MemoryFormat>(a.value.toInt());
        bool channels = f == c10::MemoryFormat::ChannelsLast || f == c10::MemoryFormat::ChannelsLast3d;
        out.push_back(channels ? BArg(c10::MemoryFormat::Contiguous) : BArg::of_arg(a, &n));
        break;
      }
      default:
        out.push_back(BArg::of_arg(a, &n));
    }
  }
  return out;
}

Value* Ctx::pad_to(Value* v, int64_t rank) {
  const auto& s = v->meta().sizes;
  int64_t have = static_cast<int64_t>(s.size()) - 1;
  if (have >= rank) return v;
  std::vector<int64_t> sizes = {s[0]};
  sizes.resize(static_cast<size_t>(rank - have + 1), 1);
  sizes.insert(sizes.end(), s.begin() + 1, s.end());
  return reshape(b, v, sizes);
}

Value* Ctx::fold_into_first(Value* v) {
  const auto& s = v->meta().sizes;
  std::vector<int64_t> sizes(s.begin() + 1, s.end());
  if (sizes.empty()) return v;
  sizes[0] *= s[0];
  return reshape(b, v, sizes);
}

Value* Ctx::broadcast(Value* v) {
  std::vector<int64_t> sizes = v->meta().sizes;
  sizes.insert(sizes.begin(), K);
  return call(ops::expand, {v, sizes});
}

int64_t Ctx::dim(int64_t d, int64_t rank) { return c10::maybe_wrap_dim(d, std::max<int64_t>(rank, 1)) + 1; }

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    register_elementwise(reg);
    register_views(reg);
    register_reductions(reg);
    register_linalg(reg);
    register_attention(reg);
    return reg;
  }();
  return r;
}

Rule pointwise() {
  return [](Ctx& c) -> std::vector<Value*> {
    int64_t rank = static_cast<int64_t>(c.n.output(0)->meta().sizes.size());
    std::vector<BArg> args = c.args();
    for (size_t i = 0; i < c.n.args().size(); ++i)
      if (c.batched(i)) args[i] = c.pad_to(c.x(i), rank);
    return c.emit(std::move(args));
  };
}

Rule same_op() {
  return [](Ctx& c) -> std::vector<Value*> { return c.emit(c.args()); };
}

Rule with_dims(std::vector<size_t> dim_args, std::vector<size_t> keep, int64_t extra_rank) {
  return [dim_args, keep, extra_rank](Ctx& c) -> std::vector<Value*> {
    // Every tensor operand is batched (unbatched ones broadcast to [K, ...]: a view), but those kept.
    std::vector<bool> kept(c.n.inputs().size(), false);
    for (size_t a : keep)
      if (c.n.arg(a).kind == ArgKind::Tensor) {
        if (c.batched(a)) return {};
        kept.at(static_cast<size_t>(c.n.arg(a).operands.at(0))) = true;
      }
    std::vector<Value*> ops;
    for (size_t i = 0; i < c.n.inputs().size(); ++i)
      ops.push_back(c.operand_batched(i) || kept[i] ? c.operand(i) : c.broadcast(c.operand(i)));
    std::vector<bool> flags;
    for (bool k : kept) flags.push_back(!k);
    Ctx all(c.b, c.n, c.K, ops, flags);
    std::vector<BArg> args = all.args();
    // The logical rank the dims refer to: the first tensor operand's.
    int64_t rank = 0;
    for (const Arg& a : c.n.args())
      if (a.is_tensor_kind() && !a.operands.empty() && a.operands[0] >= 0) {
        rank = static_cast<int64_t>(c.n.input(static_cast<size_t>(a.operands[0]))->meta().sizes.size());
        break;
      }
    rank += extra_rank;
    for (size_t i : dim_args) {
      const c10::IValue& v = c.c(i);
      if (v.isInt()) {
        args[i] = BArg(Ctx::dim(v.toInt(), rank));
      } else if (v.isIntList()) {
        std::vector<int64_t> dims = v.toIntVector();
        if (dims.empty()) {  // [] is every dim
          for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
        }
        for (int64_t& d : dims) d = Ctx::dim(d, rank);
        args[i] = BArg(dims);
      } else if (v.isNone()) {  // every dim
        std::vector<int64_t> dims;
        for (int64_t d = 0; d < rank; ++d) dims.push_back(d + 1);
        args[i] = BArg(dims);
      }
    }
    return all.emit(std::move(args));
  };
}

Rule fold_first() {
  return [](Ctx& c) -> std::vector<Value*> {
    std::vector<BArg> args = c.args();
    size_t which = c.n.args().size();
    for (size_t i = 0; i < c.n.args().size(); ++i)
      if (c.batched(i)) {
        if (which != c.n.args().size() || c.rank(i) == 0) return {};
        which = i;
      }
    if (which == c.n.args().size()) return {};
    args[which] = c.fold_into_first(c.x(which));
    std::vector<Value*> outs = c.emit(std::move(args));
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<int64_t> sizes = c.n.output(i)->meta().sizes;
      sizes.insert(sizes.begin(), c.K);
      outs[i] = reshape(c.b, outs[i], sizes);
    }
    return outs;
  };
}

}  // namespace jvpc::batch_rules
