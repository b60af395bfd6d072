// ProgramExecutable: the guards, the primal graph's run, and the residuals bound to a copy of the
// tangent graph's Executable. See runtime/program.h.
#include "runtime/program.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace jvpc {

namespace {

std::string ints(at::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Whether two layouts of `sizes` agree where it matters (a dim of size 1 has no stride to speak of).
bool same_strides(at::IntArrayRef sizes, at::IntArrayRef a, at::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != 1 && a[i] != b[i]) return false;
  return true;
}

// `t` in the layout `m` declares: as it is, or copied into it.
at::Tensor laid_out(const at::Tensor& t, const TensorMeta& m) {
  if (same_strides(m.sizes, t.strides(), m.strides)) return t;
  return at::empty_strided(m.sizes, m.strides, t.options()).copy_(t);
}

bool device_matches(const c10::Device& declared, const c10::Device& actual) {
  return declared.type() == actual.type() && (!declared.has_index() || declared.index() == actual.index());
}

}  // namespace

ProgramExecutable::ProgramExecutable(ProgramGraphs graphs, ExecutableOptions options)
    : num_outputs_(graphs.primal_outputs), exact_strides_(graphs.exact_strides), state_inputs_(graphs.state_inputs) {
  Graph* primal = graphs.primal.get();
  Graph* tangent = graphs.tangent.get();
  if (!primal || !tangent) throw Error("program: null graph");
  for (const Input& in : primal->inputs())
    if (in.role == Role::Tangent) throw Error("program: the primal graph has a tangent input '" + in.name + "'");
  for (const Input& in : tangent->inputs())
    if (in.role == Role::Primal) throw Error("program: the tangent graph has a primal input '" + in.name + "'");
  const size_t first_residual = num_outputs_ + state_inputs_.size();
  if (primal->outputs().size() < first_residual)
    throw Error("program: the primal graph returns " + std::to_string(primal->outputs().size()) +
                " values, fewer than its " + std::to_string(num_outputs_) + " primal outputs and " +
                std::to_string(state_inputs_.size()) + " state outputs");
  // Each state output is written into a primal input of its kind.
  for (size_t k = 0; k < state_inputs_.size(); ++k) {
    const Input* in = primal->find_input(state_inputs_[k]);
    if (!in || in->role != Role::Primal)
      throw Error("program: state '" + state_inputs_[k] + "' is no primal input of the primal graph");
    const TensorMeta& m = primal->outputs()[num_outputs_ + k]->meta();
    if (!m.same_signature(in->value->meta()))
      throw Error("program: state '" + state_inputs_[k] + "' is " + in->value->meta().str() +
                  " but the primal graph's new value for it is " + m.str());
  }
  std::unordered_map<std::string, size_t> residual_at;
  for (size_t i = first_residual; i < primal->outputs().size(); ++i) residual_at[primal->output_names()[i]] = i;
  for (Input& in : tangent->inputs()) {
    if (in.role != Role::Constant) continue;
    auto it = residual_at.find(in.name);
    if (it == residual_at.end())
      throw Error("program: the tangent graph's constant '" + in.name + "' is not a residual the primal graph returns");
    const TensorMeta& m = primal->outputs()[it->second]->meta();
    if (!m.same_signature(in.value->meta()))
      throw Error("program: residual '" + in.name + "' is " + m.str() + " in the primal graph and " +
                  in.value->meta().str() + " in the tangent graph");
    residual_output_.push_back(it->second);
    in.data = at::Tensor();  // each point binds its own
    in.data_version.reset();
  }
  primal_ = std::shared_ptr<const Graph>(std::move(graphs.primal));
  tangent_ = std::shared_ptr<const Graph>(std::move(graphs.tangent));
  ExecutableOptions primal_options = options;
  primal_options.static_outputs = false;  // residuals outlive the next call
  primal_fn_ = std::make_unique<Executable>(primal_, primal_options);
  tangent_fn_ = std::make_unique<Executable>(tangent_, options);
  for (const std::string& name : state_inputs_) {
    const auto& a = primal_fn_->arguments();
    state_argument_.push_back(static_cast<size_t>(
        std::find_if(a.begin(), a.end(), [&](const Input* in) { return in->name == name; }) - a.begin()));
  }
  size_t i = 0;
  for (const Input& in : primal_->inputs())
    if (in.role == Role::Constant) {
      const at::Tensor& bound = primal_fn_->constants()[i++];
      if (!bound.defined()) throw Error("program: constant '" + in.name + "' of the primal graph is not bound");
      captured_.push_back({in.name, bound, version_counter(bound)});
    }
}

bool ProgramExecutable::needs_grad(const std::vector<at::Tensor>& primals) const {
  for (const at::Tensor& t : primals)
    if (t.requires_grad()) return true;
  for (const Captured& c : captured_)
    if (c.tensor.requires_grad()) return true;
  return false;
}

std::vector<at::Tensor> ProgramExecutable::checked(const std::vector<at::Tensor>& primals) const {
  const std::vector<const Input*>& args = primal_fn_->arguments();
  if (primals.size() != args.size()) {
    std::string names;
    for (const Input* in : args) names += (names.empty() ? "" : ", ") + in->name;
    throw Error("expected " + std::to_string(args.size()) + " primals (" + names + "), got " +
                std::to_string(primals.size()));
  }
  std::vector<at::Tensor> in;
  in.reserve(primals.size());
  for (size_t i = 0; i < primals.size(); ++i) {
    const TensorMeta& m = args[i]->value->meta();
    const at::Tensor& t = primals[i];
    std::string who = "primal '" + args[i]->name + "'";
    if (!t.defined()) throw Error(who + ": expected " + m.str() + " but got an undefined tensor");
    if (t.sizes() != at::IntArrayRef(m.sizes))
      throw Error(who + ": expected shape " + ints(m.sizes) + " but got " + ints(t.sizes()));
    if (t.scalar_type() != m.dtype)
      throw Error(who + ": expected dtype " + c10::toString(m.dtype) + " but got " + c10::toString(t.scalar_type()));
    if (!device_matches(m.device, t.device()))
      throw Error(who + ": expected device " + m.device.str() + " but got " + t.device().str());
    if (t.layout() != c10::kStrided) throw Error(who + ": only strided tensors are supported");
    if (same_strides(m.sizes, t.strides(), m.strides)) {
      in.push_back(t);
    } else if (exact_strides_) {
      throw Error(who + ": expected strides " + ints(m.strides) + " but got " + ints(t.strides()) +
                  " (the program was compiled for the example's layout: pass that layout, or compile without "
                  "exact strides)");
    } else {
      in.push_back(laid_out(t, m));
    }
  }
  return in;
}

std::vector<at::Tensor> ProgramExecutable::primal_graph_inputs(const std::vector<at::Tensor>& primals) const {
  std::vector<at::Tensor> in = checked(primals), out;
  out.reserve(primal_->inputs().size());
  size_t a = 0, c = 0;
  for (const Input& i : primal_->inputs()) out.push_back(i.role == Role::Constant ? captured_[c++].tensor : in[a++]);
  return out;
}

ProgramExecutable::Point ProgramExecutable::linearize(const std::vector<at::Tensor>& primals) const {
  std::vector<at::Tensor> in = checked(primals);
  std::vector<at::Tensor> outs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Captured& c : captured_) {
      std::optional<int64_t> now = version_counter(c.tensor);
      if (now != c.version) {  // written in place since (an optimizer step): read as it is now
        primal_fn_->bind(c.name, c.tensor);
        c.version = now;
      }
    }
    // Without a tensor that requires grad (or with grad mode off) nothing is recorded, and the
    // run keeps its in-place buffer reuse; with one, the run is the step's only forward.
    at::AutoGradMode grad(at::GradMode::is_enabled() && needs_grad(in));
    outs = primal_fn_->run(in);
  }
  return point_from(primals, std::move(outs));
}

ProgramExecutable::Point ProgramExecutable::point_from(const std::vector<at::Tensor>& primals,
                                                       std::vector<at::Tensor> outs) const {
  const size_t expected = primal_->outputs().size();
  if (primals.size() != primal_fn_->arguments().size() || outs.size() != expected)
    throw Error("program: expected " + std::to_string(primal_fn_->arguments().size()) + " primals and " +
                std::to_string(expected) + " primal-graph outputs, got " + std::to_string(primals.size()) + " and " +
                std::to_string(outs.size()));
  // Another backend's outputs are what the interpreter's would be, in shape and dtype, or refused
  // (the residuals are checked as they are bound).
  for (size_t i = 0; i < num_outputs_; ++i) {
    const TensorMeta& m = primal_->outputs()[i]->meta();
    if (!outs[i].defined() || outs[i].sizes() != at::IntArrayRef(m.sizes) || outs[i].scalar_type() != m.dtype)
      throw Error("program: primal output '" + primal_->output_names()[i] + "' is " + m.str() +
                  " in the primal graph but " +
                  (outs[i].defined() ? TensorMeta::of(outs[i]).str() : std::string("undefined")) +
                  " where another backend ran it");
  }
  const bool record = at::GradMode::is_enabled();  // outputs with history: residuals are detached
  // The state the function writes, written where eager code writes it: into the caller's tensor,
  // moving no version counter, as BatchNorm's kernel writes its running statistics (autograd
  // saved them for the backward of the run just recorded, and checks their version there).
  if (!state_argument_.empty()) {
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < state_argument_.size(); ++k)
      primals[state_argument_[k]].variable_data().copy_(outs[num_outputs_ + k]);
  }
  std::vector<at::Tensor> residuals;
  residuals.reserve(residual_output_.size());
  size_t k = 0;
  for (const Input& r : tangent_->inputs())
    if (r.role == Role::Constant) {
      at::Tensor v = laid_out(outs[residual_output_[k++]], r.value->meta());
      residuals.push_back(record && v.requires_grad() ? v.detach() : v);  // residuals hold no history
    }
  Point p;
  p.jvp_fn = std::shared_ptr<Executable>(tangent_fn_->with_constants(residuals));
  // A primal output that is (in) a residual's storage goes to the caller as a copy: writing into
  // one's result is ordinary, and would change later jvp calls (exp's output is its derivative).
  std::unordered_set<const void*> residual_storages;
  for (const at::Tensor& r : residuals)
    if (r.has_storage()) residual_storages.insert(r.storage().unsafeGetStorageImpl());
  p.primal_outputs.assign(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(num_outputs_));
  for (at::Tensor& out : p.primal_outputs)
    if (out.has_storage() && residual_storages.count(out.storage().unsafeGetStorageImpl())) out = out.clone();
  return p;
}

}  // namespace jvpc
