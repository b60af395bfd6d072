// Graph transforms that change every value's metadata (retarget.h).
#include "ir/retarget.h"

#include "ir/ops.h"

#include <ATen/ATen.h>

#include <functional>

namespace jvpc {

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
