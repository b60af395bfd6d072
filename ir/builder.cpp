#include "ir/builder.h"
#include "ir/op.h"

#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>

namespace jvpc {

BArg BArg::of_arg(const Arg& a, const Node* from) {
  switch (a.kind) {
    case ArgKind::Tensor:
      return BArg(from->input(static_cast<size_t>(a.operands.at(0))));
    case ArgKind::TensorList:
    case ArgKind::OptTensorList: {  // an absent entry (-1) of an optional list is nullptr
      std::vector<Value*> vs;
      for (int o : a.operands) vs.push_back(o < 0 ? nullptr : from->input(static_cast<size_t>(o)));
      return BArg(std::move(vs));
    }
    default: {
      BArg b(std::nullopt);
      b.c_ = a.value;
      return b;
    }
  }
}

std::vector<Value*> Builder::emit(const std::string& op, std::vector<BArg> bargs, const Node* shaped_like) {
  const OpInfo& info = op_info(op);
  const auto& schema = info.schema().arguments();
  if (bargs.size() > schema.size())
    throw Error(op + " takes " + std::to_string(schema.size()) + " arguments, got " + std::to_string(bargs.size()));
  std::vector<Arg> args;
  std::vector<Value*> inputs;
  args.reserve(schema.size());
  inputs.reserve(bargs.size());
  for (size_t i = 0; i < schema.size(); ++i) {
    if (i >= bargs.size()) {
      if (!schema[i].default_value())
        throw Error(op + ": argument '" + schema[i].name() + "' has no default and was not given");
      args.push_back(arg_from_ivalue(schema[i], *schema[i].default_value(),
                                     [](const at::Tensor&) -> int { throw Error("tensor default"); }));
      continue;
    }
    BArg& b = bargs[i];
    Arg a;
    if (b.kind_ == BArg::K::Value) {
      a = Arg::tensor(static_cast<int>(inputs.size()));
      inputs.push_back(b.v_);
    } else if (b.kind_ == BArg::K::Values) {
      a.kind = kind_matches(ArgKind::OptTensorList, schema[i]) ? ArgKind::OptTensorList : ArgKind::TensorList;
      for (Value* v : b.vs_) {
        if (!v && a.kind == ArgKind::OptTensorList) {
          a.operands.push_back(-1);
          continue;
        }
        if (!v) throw Error(op + ": argument '" + schema[i].name() + "' cannot hold an absent tensor");
        a.operands.push_back(static_cast<int>(inputs.size()));
        inputs.push_back(v);
      }
    } else {
      a = arg_from_ivalue(schema[i], b.c_, [](const at::Tensor&) -> int { throw Error("tensor constant"); });
    }
    if (!kind_matches(a.kind, schema[i]))
      throw Error(op + ": argument '" + schema[i].name() + "' of type " + schema[i].real_type()->str() +
                  " cannot take a " + arg_kind_name(a.kind));
    args.push_back(std::move(a));
  }
  std::vector<int> counts;
  std::vector<TensorMeta> outs;
  auto same_operands = [&] {
    if (!shaped_like || shaped_like->op() != op || shaped_like->inputs().size() != inputs.size()) return false;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const TensorMeta &a = inputs[i]->meta(), &b = shaped_like->input(i)->meta();
      if (a.sizes != b.sizes || a.dtype != b.dtype || a.device != b.device) return false;
    }
    return true;
  };
  bool inferred = true;  // the outputs are what shape inference gives
  try {
    outs = infer_outputs(info, args, inputs, &counts);
    // Where the shape depends on values, the shape rule gives a bound (masked_select, index with a
    // mask): `shaped_like` has the real one.
    if (same_operands() && counts == shaped_like->return_counts() && outs.size() == shaped_like->outputs().size())
      for (size_t i = 0; i < outs.size(); ++i)
        if (value_dependent_shape(op, i)) {
          outs[i] = shaped_like->outputs()[i]->meta();
          inferred = false;
        }
  } catch (const NoShapeRule&) {
    if (!same_operands()) throw;
    for (const Value* o : shaped_like->outputs()) outs.push_back(o->meta());
    counts = shaped_like->return_counts();
    inferred = false;
  }
  bool impure = is_impure(info, args);
  Node* n = g_.create(op, std::move(args), std::move(inputs), std::move(outs), std::move(counts), impure);
  if (inferred) n->mark_shapes_inferred();
  return n->outputs();
}

Value* Builder::call(const std::string& op, std::vector<BArg> args) {
  auto outs = emit(op, std::move(args));
  if (outs.empty()) throw Error(op + " produced no tensor");
  return outs[0];
}

std::optional<std::vector<int64_t>> view_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                                                 const std::vector<int64_t>& new_sizes) {
  auto st = at::detail::computeStride(sizes, strides, new_sizes);
  if (!st) return std::nullopt;
  return std::vector<int64_t>(st->begin(), st->end());
}

bool viewable(const Value* v, const std::vector<int64_t>& sizes) {
  const TensorMeta& m = v->meta();
  return view_strides(m.sizes, m.strides, at::infer_size(sizes, m.numel())).has_value();
}

Value* reshape(Builder& b, Value* v, const std::vector<int64_t>& sizes) {
  if (v->meta().sizes == sizes) return v;
  if (!viewable(v, sizes)) v = b.call(ops::clone, {v, c10::MemoryFormat::Contiguous});
  return b.call(ops::view, {v, sizes});
}

}  // namespace jvpc
