#include "runtime/executable.h"

#include "compiler/ir/limits.h"
#include "compiler/ir/liveness.h"
#include "compiler/ir/loadable_ops.h"
#include "compiler/ir/ops.h"
#include "compiler/ir/verifier.h"

#include <ATen/ATen.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#ifdef JVPC_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

struct Executable::Step {
  const OpInfo* info = nullptr;    // may be the in-place form of the node's op (see reuses_operand)
  std::string where;               // for error messages
  std::vector<c10::IValue> stack;  // boxed arguments; tensor positions are filled per call
  struct TensorArg {
    size_t pos;
    int slot;
  };
  std::vector<TensorArg> tensors;
  struct ListArg {
    size_t pos;
    std::vector<int> slots;  // -1: absent (optional lists)
    bool optional;
  };
  std::vector<ListArg> lists;
  std::vector<int> return_counts;
  std::vector<int> out_slots;
  std::vector<const Value*> outs;  // the node's outputs, for checking the first call's results
  std::vector<int> release;        // slots whose last use is this step
  // Where `info` is an in-place form: the op itself, run instead when the first operand's buffer
  // turns out to be shared at run time (an op that returned an alias without saying so).
  const OpInfo* functional = nullptr;
};

struct Executable::CudaGraphState {
#ifdef JVPC_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::vector<at::Tensor> static_inputs;
  std::vector<at::Tensor> static_outputs;
  at::cuda::CUDAEvent done;  // recorded after each replay's outputs are copied out
#endif
};

namespace {

// Ops whose in-place form (op_) the runtime may call when their first operand dies at the node:
// the result then reuses that operand's buffer instead of allocating (baddbmm would otherwise
// copy its `self` into a fresh output first).
bool has_safe_inplace_form(const std::string& op) {
  static const std::unordered_set<std::string> ops = {
      "aten::baddbmm",    "aten::addmm",      "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor",
      "aten::div.Tensor", "aten::mul.Scalar", "aten::div.Scalar", "aten::add.Scalar", "aten::sub.Scalar"};
  return ops.count(op) > 0;
}

// The in-place form of `n`, if its first operand can be overwritten: an intermediate with its own
// storage (no view shares it), read for the last time here, not a graph output, and laid out as
// the result.
const OpInfo* inplace_form(const Graph& g, const Node* n, const Liveness& live, int position,
                           const std::unordered_map<const Value*, int>& storage_users) {
  if (!has_safe_inplace_form(n->op()) || n->inputs().empty() || n->outputs().size() != 1) return nullptr;
  if (n->arg(0).kind != ArgKind::Tensor || n->arg(0).operands[0] != 0) return nullptr;
  const Value* self = n->input(0);
  const Value* out = n->output();
  if (g.is_input(self) || live.storage_root.at(self) != self || storage_users.at(self) != 1) return nullptr;
  if (live.last_use.at(self) != position) return nullptr;
  for (size_t i = 1; i < n->inputs().size(); ++i)
    if (n->input(i) == self) return nullptr;
  if (self->meta().sizes != out->meta().sizes || self->meta().strides != out->meta().strides ||
      self->meta().dtype != out->meta().dtype)
    return nullptr;
  auto [name, overload] = split_op_name(n->op());
  try {
    return &op_info(name + "_" + (overload.empty() ? "" : "." + overload));
  } catch (const Error&) {
    return nullptr;
  }
}

// The allocator ATen's empty() uses on `d`: buffers from it are the only ones run in place.
c10::Allocator* device_allocator(const c10::Device& d) {
#ifdef JVPC_WITH_CUDA
  if (d.is_cuda()) return c10::cuda::CUDACachingAllocator::get();
#endif
  return c10::GetAllocator(d.type());
}

bool device_matches(const c10::Device& declared, const c10::Device& actual) {
  return declared.type() == actual.type() && (!declared.has_index() || declared.index() == actual.index());
}

std::string meta_of(const at::Tensor& t) { return TensorMeta::of(t).str(); }

// A result must have the shape and dtype the graph declares for it: the graph's metadata may
// come from a file (for kernels without a Meta implementation the loader cannot re-derive it).
void check_result(const std::string& where, const Value* v, const at::Tensor& t) {
  const TensorMeta& m = v->meta();
  if (!t.defined() || t.sizes().vec() != m.sizes || t.scalar_type() != m.dtype)
    throw Error(where + ": result %" + std::to_string(v->id()) + " is " +
                (t.defined() ? meta_of(t) : std::string("an undefined tensor")) + " where the graph declares " +
                m.str());
}

}  // namespace

Executable::Executable(std::shared_ptr<const Graph> graph, ExecutableOptions options)
    : graph_(std::move(graph)), options_(options), cuda_(std::make_unique<CudaGraphState>()) {
  if (!graph_) throw Error("Executable: null graph");
  if (!at::hasCUDA())
    for (const Input& in : graph_->inputs())
      if (in.value->meta().device.is_cuda())
        throw Error("input '" + in.name + "' is on " + in.value->meta().device.str() +
                    ", and CUDA is not available on this machine");
  VerifyOptions schemas_only;
  schemas_only.check_shapes = false;  // checked on the first call, against the real results
  verify(*graph_, schemas_only);
  // Before anything is allocated: against the memory of the device the graph runs on (its
  // first non-constant input's, else its first result's).
  std::optional<c10::Device> where;
  for (const Input& in : graph_->inputs())
    if (!where && in.role != Role::Constant) where = in.value->meta().device;
  for (const Node* n : graph_->nodes())
    if (!where && !n->outputs().empty()) where = n->output(0)->meta().device;
  check_memory_limit(memory_needed(*graph_), options_.max_memory, where.value_or(c10::Device(c10::kCPU)),
                     "ExecutableOptions::max_memory, --max-memory");
  std::unordered_map<const Value*, int> slot;
  auto slot_of = [&](const Value* v) {
    auto [it, added] = slot.emplace(v, num_slots_);
    if (added) ++num_slots_;
    return it->second;
  };
  for (const Input& in : graph_->inputs()) {
    int s = slot_of(in.value);
    if (in.role == Role::Constant) {
      in.check_unwritten();  // since the graph was compiled (or loaded)
      constants_.emplace_back(s, in.data.defined() ? in.data.to(in.value->meta().device) : at::Tensor());
      constant_inputs_.push_back(&in);
      versions_.push_back(version_counter(constants_.back().second));  // to notice writes by others holding it
    } else {
      arguments_.push_back(&in);
      argument_slots_.push_back(s);
    }
  }
  Liveness live = analyze_liveness(*graph_);
  std::unordered_map<const Value*, int> storage_users;  // storage root -> values living in it
  for (const auto& [v, root] : live.storage_root) storage_users[root]++;
  auto nodes = graph_->nodes();
  bool impure = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i];
    impure |= n->impure();
    std::string written = hidden_write(*n);  // it would write a constant or an input
    if (!written.empty()) throw Error("node " + describe(n) + ": " + written);
    Step st;
    const OpInfo* inplace =
        options_.reuse_buffers ? inplace_form(*graph_, n, live, static_cast<int>(i), storage_users) : nullptr;
    st.info = inplace ? inplace : &op_info(n->op());
    if (inplace) st.functional = &op_info(n->op());
    st.where = "node " + describe(n);
    st.return_counts = n->return_counts();
    for (size_t a = 0; a < n->args().size(); ++a) {
      const Arg& arg = n->arg(a);
      if (arg.kind == ArgKind::Tensor) {
        st.tensors.push_back({a, slot_of(n->input(static_cast<size_t>(arg.operands[0])))});
        st.stack.emplace_back();
      } else if (arg.kind == ArgKind::TensorList || arg.kind == ArgKind::OptTensorList) {
        Step::ListArg l{a, {}, arg.kind == ArgKind::OptTensorList};
        for (int o : arg.operands) l.slots.push_back(o < 0 ? -1 : slot_of(n->input(static_cast<size_t>(o))));
        st.lists.push_back(std::move(l));
        st.stack.emplace_back();
      } else {
        st.stack.push_back(arg.value);
      }
    }
    for (const Value* o : n->outputs()) st.out_slots.push_back(slot_of(o));
    st.outs.assign(n->outputs().begin(), n->outputs().end());
    // Release what dies here: operands read for the last time, and outputs nobody reads.
    auto dies = [&](const Value* v) { return !graph_->is_input(v) && live.last_use.at(v) <= static_cast<int>(i); };
    for (const Value* v : n->inputs())
      if (dies(v) && std::find(st.release.begin(), st.release.end(), slot.at(v)) == st.release.end())
        st.release.push_back(slot.at(v));
    for (const Value* o : n->outputs())
      if (dies(o)) st.release.push_back(slot.at(o));
    steps_.push_back(std::move(st));
  }
  for (const Value* o : graph_->outputs()) output_slots_.push_back(slot_of(o));
  // A value returned twice (cse merges equal results) is returned as two tensors, as eager code
  // would; results that share a constant's storage are copied at run time (run_eager).
  std::unordered_set<const Value*> returned;
  for (const Value* o : graph_->outputs()) copied_outputs_.push_back(!returned.insert(o).second);

  // A CUDA graph replays only GPU work: every argument and every node result must be on one
  // CUDA device (constants may be anywhere, e.g. CPU scalars).
  bool one_cuda_device = true;
  auto on_device = [&](const Value* v) {
    c10::Device d = v->meta().device;
#ifdef JVPC_WITH_CUDA
    if (d.is_cuda() && !d.has_index()) d = c10::Device(c10::kCUDA, c10::cuda::current_device());  // "cuda"
#endif
    if (!d.is_cuda() || (device_.is_cuda() && d != device_)) one_cuda_device = false;
    device_ = d;
  };
  for (const Input* in : arguments_) on_device(in->value);
  for (const Node* n : nodes)
    for (const Value* o : n->outputs()) on_device(o);
#ifdef JVPC_WITH_CUDA
  use_cuda_graph_ =
      options_.cuda_graph && one_cuda_device && device_.is_cuda() && !impure && !std::getenv("JVPC_NO_CUDA_GRAPH");
#else
  (void)impure;
#endif
}

Executable::~Executable() = default;

void Executable::bind(const std::string& name, const at::Tensor& value) {
  for (size_t i = 0; i < constant_inputs_.size(); ++i) {
    const Input& in = *constant_inputs_[i];
    if (in.name != name) continue;
    const Value* v = in.value;
    if (!value.defined()) throw Error("constant '" + name + "': undefined tensor");
    if (value.sizes().vec() != v->meta().sizes || value.scalar_type() != v->meta().dtype)
      throw Error("constant '" + name + "': expected " + v->meta().str() + " but got " + meta_of(value));
    at::Tensor bound;
    try {
      bound = value.to(v->meta().device);
      // A layout the graph was not compiled for (its views may need the declared one).
      if (v->meta().is_contiguous() && !bound.is_contiguous()) bound = bound.contiguous();
    } catch (const c10::Error& e) {
      throw Error("constant '" + name + "': " + one_line(e));
    }
    constants_[i].second = bound;
    versions_[i] = version_counter(bound);
    std::lock_guard<std::mutex> lock(mu_);
    cuda_ = std::make_unique<CudaGraphState>();  // a captured graph read the old tensor
    return;
  }
  throw Error("the graph has no constant named '" + name + "'");
}

std::vector<at::Tensor> Executable::checked(const std::vector<at::Tensor>& inputs) const {
  if (inputs.size() != arguments_.size())
    throw Error("expected " + std::to_string(arguments_.size()) + " input tensors, got " +
                std::to_string(inputs.size()));
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& in = *arguments_[i];
    const TensorMeta& m = in.value->meta();
    const at::Tensor& t = inputs[i];
    std::string who = std::string(role_name(in.role)) + " '" + in.name + "'";
    if (!t.defined()) throw Error(who + " is an undefined tensor");
    if (t.sizes().vec() != m.sizes) throw Error(who + ": expected shape " + m.str() + " but got " + meta_of(t));
    if (t.scalar_type() != m.dtype) throw Error(who + ": expected dtype " + m.str() + " but got " + meta_of(t));
    if (!device_matches(m.device, t.device()))
      throw Error(who + ": expected device " + m.device.str() + " but got " + t.device().str());
    if (t.layout() != c10::kStrided) throw Error(who + ": only strided tensors are supported");
    if (t.is_neg() || t.is_conj()) throw Error(who + ": lazily negated or conjugated tensors are not supported");
    // Views with a layout the graph was not compiled for are made contiguous (a copy);
    // contiguous inputs are used as they are.
    out.push_back(m.is_contiguous() && !t.is_contiguous() ? t.contiguous() : t);
  }
  for (size_t i = 0; i < constants_.size(); ++i) {
    const at::Tensor& c = constants_[i].second;
    const Input& in = *constant_inputs_[i];
    if (!c.defined()) throw Error("constant '" + in.name + "' is not bound");
    if (versions_[i] && c._version() != *versions_[i]) throw Error(in.written_error());
  }
  return out;
}

std::vector<at::Tensor> Executable::run_eager(const std::vector<at::Tensor>& inputs, bool functional) const {
  std::vector<at::Tensor> slots(static_cast<size_t>(num_slots_));
  for (size_t i = 0; i < inputs.size(); ++i) slots[static_cast<size_t>(argument_slots_[i])] = inputs[i];
  for (const auto& [s, t] : constants_) slots[static_cast<size_t>(s)] = t;
  torch::jit::Stack stack;
  const bool check = !results_checked_.load();  // the first call checks results against the graph
  for (const Step& st : steps_) {
    stack = st.stack;
    for (const auto& ta : st.tensors) stack[ta.pos] = slots[static_cast<size_t>(ta.slot)];
    for (const auto& la : st.lists) {
      if (la.optional) {
        c10::List<std::optional<at::Tensor>> l;
        for (int s : la.slots)
          l.push_back(s < 0 ? std::optional<at::Tensor>() : std::optional<at::Tensor>(slots[static_cast<size_t>(s)]));
        stack[la.pos] = std::move(l);
      } else {
        c10::List<at::Tensor> l;
        for (int s : la.slots) l.push_back(slots[static_cast<size_t>(s)]);
        stack[la.pos] = std::move(l);
      }
    }
    // The in-place form only on a buffer this call allocated and nothing else holds: not another
    // tensor on its storage, not the same tensor under another name (an op that returned its
    // input as it is: the slot and the stack hold it, nobody else), and not memory an op mapped
    // or wrapped from elsewhere (a file, a blob): its storage must come from the device's allocator.
    const OpInfo* info = st.info;
    if (st.functional && functional) {
      info = st.functional;
    } else if (st.functional) {
      const at::Tensor& self = stack[0].toTensor();
      if (self.storage().use_count() != 1 || self.use_count() > 2 ||
          self.storage().allocator() != device_allocator(self.device()))
        info = st.functional;
    }
    try {
      info->handle.callBoxed(stack);
    } catch (const std::exception& e) {
      throw Error(st.where + ": " + one_line(e));
    }
    size_t out = 0;
    for (size_t r = 0; r < st.return_counts.size(); ++r) {
      int c = st.return_counts[r];
      if (c == 0) continue;
      const c10::IValue& v = stack[r];
      if (c == 1 && v.isTensor()) {
        slots[static_cast<size_t>(st.out_slots[out++])] = v.toTensor();
      } else if (v.isTensorList() && static_cast<int>(v.toTensorList().size()) == c) {
        for (const at::Tensor& t : v.toTensorVector()) slots[static_cast<size_t>(st.out_slots[out++])] = t;
      } else {
        throw Error(st.where + ": return " + std::to_string(r) + " does not have the traced form");
      }
    }
    if (check)
      for (size_t k = 0; k < st.outs.size(); ++k)
        check_result(st.where, st.outs[k], slots[static_cast<size_t>(st.out_slots[k])]);
    for (int s : st.release) slots[static_cast<size_t>(s)] = at::Tensor();
  }
  std::vector<at::Tensor> outs;
  outs.reserve(output_slots_.size());
  // Results that share a constant's storage (the constant, a view of it, or an op that returned
  // it as it is) are copies: a caller writing into a result must not change later calls.
  auto aliases_a_constant = [&](const at::Tensor& t) {
    const c10::StorageImpl* s = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    for (const auto& c : constants_)
      if (s && c.second.defined() && c.second.storage().unsafeGetStorageImpl() == s) return true;
    return false;
  };
  for (size_t i = 0; i < output_slots_.size(); ++i) {
    const at::Tensor& t = slots[static_cast<size_t>(output_slots_[i])];
    outs.push_back(copied_outputs_[i] || aliases_a_constant(t) ? t.clone() : t);
  }
  results_checked_ = true;
  return outs;
}

std::vector<at::Tensor> Executable::run(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> in = checked(inputs);
  // Under a Python dispatch mode (FlopCounterMode) the mode sees the kernels the graph names:
  // no in-place forms it may not know (baddbmm_), no CUDA-graph replay (which dispatches nothing).
  if (options_.functional_under_dispatch_mode && c10::impl::dispatch_mode_enabled()) return run_eager(in, true);
  if (!use_cuda_graph_) return run_eager(in);
  for (const at::Tensor& t : in)  // a graph declared on "cuda" accepts any GPU; its capture is on one
    if (t.device() != device_) return run_eager(in);
#ifdef JVPC_WITH_CUDA
  std::lock_guard<std::mutex> lock(mu_);
  c10::cuda::CUDAGuard device_guard(device_);
  CudaGraphState& st = *cuda_;
  auto current = c10::cuda::getCurrentCUDAStream(device_.index());
  st.done.block(current);  // a call on another stream may still be reading the static buffers
  std::vector<at::Tensor> outs;
  if (!st.graph) {
    // First call: run eagerly on a side stream (this run's results are the call's results, and
    // it creates cuBLAS handles and workspaces before capture), then capture the same work
    // without executing it. Later calls replay it: each call executes the graph once.
    st.static_inputs.clear();
    for (size_t i = 0; i < in.size(); ++i) {
      const TensorMeta& m = arguments_[i]->value->meta();
      st.static_inputs.push_back(at::empty_strided(m.sizes, m.strides, in[i].options()).copy_(in[i]));
    }
    auto side = c10::cuda::getStreamFromPool(false, device_.index());
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      outs = run_eager(st.static_inputs);
      auto g = std::make_unique<at::cuda::CUDAGraph>();
      // Thread-local capture: other threads' CUDA calls stay legal while this one captures.
      g->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        st.static_outputs = run_eager(st.static_inputs);
      } catch (...) {
        try {
          g->capture_end();
        } catch (...) {  // the capture was invalidated; the node's error is the one to report
        }
        throw;
      }
      g->capture_end();
      st.graph = std::move(g);
    }
    at::cuda::CUDAEvent captured;
    captured.record(side);
    captured.block(current);
    for (at::Tensor& t : outs) {
      for (const at::Tensor& buffer : st.static_inputs)
        if (t.is_alias_of(buffer)) t = t.clone();  // an output that is an input: the next call overwrites it
      if (t.is_cuda()) t.record_stream(current);   // made on the side stream, read on the caller's
    }
  } else {
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].data_ptr() != st.static_inputs[i].data_ptr()) st.static_inputs[i].copy_(in[i]);
    st.graph->replay();
    outs = st.static_outputs;
    if (!options_.static_outputs)
      for (at::Tensor& t : outs) t = t.clone();
  }
  st.done.record(current);
  return outs;
#else
  return run_eager(in);
#endif
}

bool Executable::replaying_cuda_graph() const {
#ifdef JVPC_WITH_CUDA
  return cuda_ && cuda_->graph != nullptr;
#else
  return false;
#endif
}

std::vector<at::Tensor> Executable::input_buffers() {
#ifdef JVPC_WITH_CUDA
  std::lock_guard<std::mutex> lock(mu_);
  if (use_cuda_graph_ && cuda_->graph) return cuda_->static_inputs;
#endif
  throw Error("input_buffers(): no CUDA graph has been captured (call run() once on a CUDA device first)");
}

std::vector<at::Tensor> execute_node(const Node& n, const std::vector<at::Tensor>& operands) {
  const OpInfo& info = op_info(n.op());
  torch::jit::Stack stack;
  for (const Arg& a : n.args())
    stack.push_back(arg_to_ivalue(a, [&](int o) { return operands.at(static_cast<size_t>(o)); }));
  try {
    info.handle.callBoxed(stack);
  } catch (const std::exception& e) {
    throw Error("node " + describe(&n) + ": " + one_line(e));
  }
  std::vector<at::Tensor> out;
  for (size_t r = 0; r < n.return_counts().size(); ++r) {
    if (n.return_counts()[r] == 0) continue;
    if (stack[r].isTensor())
      out.push_back(stack[r].toTensor());
    else
      for (const at::Tensor& t : stack[r].toTensorVector()) out.push_back(t);
  }
  if (out.size() != n.outputs().size()) throw Error("node " + describe(&n) + ": unexpected number of results");
  for (size_t i = 0; i < out.size(); ++i) check_result("node " + describe(&n), n.output(i), out[i]);
  return out;
}

}  // namespace jvpc
