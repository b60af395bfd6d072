// The example functions jvpc traces: sdpa (the seed's attention), mlp and a transformer block.
// Each is a plain C++ callable on tensors, built from flags:
//
//   auto ex = jvpc::examples::make("sdpa", {"--seq-len", "256", "--causal"});
//   auto trace = jvpc::trace(ex.fn(), ex.inputs);
//
// Every example says which inputs are differentiable (TraceInput::differentiable): q, k, v for
// sdpa (never the mask); the activations and all weights for mlp and block.
#pragma once

#include "compiler/trace/tracer.h"

#include <string>
#include <vector>

namespace jvpc::examples {

/// Which scaled-dot-product-attention kernels LibTorch may choose.
enum class Backend { Math, Flash, Efficient, CuDNN, Auto };
Backend parse_backend(const std::string& s);

/// Enables exactly the chosen SDPA backends for its lifetime (process-wide LibTorch flags).
class BackendScope {
 public:
  explicit BackendScope(Backend b);
  ~BackendScope();
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;

 private:
  bool flash_, efficient_, math_, cudnn_;
};

struct Instance {
  std::string name;
  std::string description;  ///< one line: sizes, dtype, device, backend
  std::vector<TraceInput> inputs;
  Backend backend = Backend::Math;
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  /// The callable with a given SDPA backend in force while it runs.
  std::function<TensorFn(Backend)> make_fn;
  TensorFn fn() const { return make_fn(backend); }
};

/// Example names, in the order `jvpc trace --help` lists them.
std::vector<std::string> names();
/// Builds an example from its flags. Throws jvpc::Error for an unknown name or bad flags.
Instance make(const std::string& name, const std::vector<std::string>& args = {});
/// The example's flags, as help text.
std::string help(const std::string& name);
/// One line: what the example computes, on which inputs.
std::string summary(const std::string& name);

}  // namespace jvpc::examples
