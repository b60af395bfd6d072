// jvpc._C: the compiler API for Python callers (the package python/jvpc/ wraps it with
// torch.func's pytree conventions).
//
// A Python callable is traced as any C++ callable is: the tracer's dispatch key is per thread
// and Python's torch functions call the same ATen entry points. linearize runs with the GIL
// released, and the callable takes it back for its call; Python code that runs in between (the
// aten Meta kernels that `import torch` registers in Python, a TorchDispatchMode) takes it
// itself. A Python exception raised inside the callable is kept and raised again, with its own
// type, once linearize has unwound; jvpc::Error becomes jvpc.Error (a RuntimeError).
//
// Tangent outputs are computed without autograd (a stop-gradient); primal outputs are the
// tracing run's results, whose kernels ran through Autograd as eager's do, or a program's primal
// graph run, which autograd records where a tensor requires grad.
#include "compiler/api/inputs_file.h"
#include "compiler/api/linearize.h"
#include "compiler/api/linearize_cache.h"
#include "compiler/api/program.h"
#include "compiler/api/report.h"
#include "ir/dtypes.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/io/graph_files.h"
#include "ir/io/graph_json.h"
#include "ir/io/safetensors.h"
#include "passes/cost_table.h"
#include "python/weight_stamp.h"
#include "runtime/attention_tangent.h"

#include <torch/csrc/utils/pybind.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_strided.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <sstream>

namespace py = pybind11;

namespace jvpc {
namespace {

// A Python callable (list[Tensor] -> list[Tensor]) as a TensorFn. It captures raw pointers only,
// so that copying it needs no GIL; the caller keeps both alive for the whole trace.
struct PyCallable {
  PyObject* fn;
  std::optional<py::error_already_set> raised;  // what the callable raised, if it did
};

const char* const kRaised = "the traced Python function raised an exception";

TensorFn tensor_fn(PyCallable& c) {
  PyCallable* call = &c;
  return [call](const std::vector<at::Tensor>& args) -> std::vector<at::Tensor> {
    py::gil_scoped_acquire gil;
    try {
      py::object out = py::reinterpret_borrow<py::object>(call->fn)(py::cast(args));
      return py::cast<std::vector<at::Tensor>>(out);
    } catch (py::error_already_set& e) {
      call->raised = std::move(e);
      throw Error(kRaised);
    }
  };
}

// Runs `f` (a call into the compiler) with the GIL released; a Python exception the traced
// callable raised is raised again as it was, unless it passed on an error of jvpc's own tracer
// (which the trace reports instead, as jvpc.Error).
template <typename F>
auto without_gil(PyCallable& c, F&& f) {
  try {
    py::gil_scoped_release release;
    return f();
  } catch (const Error& e) {
    if (c.raised && std::string(e.what()) == kRaised) throw *c.raised;
    throw;
  }
}

std::vector<TraceInput> trace_inputs(const std::vector<at::Tensor>& values, const std::vector<std::string>& names,
                                     const std::vector<bool>& differentiable) {
  if (values.size() != names.size() || values.size() != differentiable.size())
    throw Error("inputs, names and differentiable flags differ in number");
  std::vector<TraceInput> in;
  for (size_t i = 0; i < values.size(); ++i) in.push_back({names[i], values[i], differentiable[i]});
  return in;
}

std::string cost_json(const GraphCost& c) { return to_json(c).dump(); }

std::string report_text(const CompileReport& r) {
  std::ostringstream os;
  print_cost_rows(r.passes, os);
  return os.str();
}

// Runs a compiled graph without autograd (tangents are a stop-gradient) and without the GIL.
std::vector<at::Tensor> run_graph(Executable& e, const std::vector<at::Tensor>& inputs) {
  py::gil_scoped_release release;
  at::NoGradGuard no_grad;
  return e.run(inputs);
}

std::vector<std::string> argument_names(const Executable& e) {
  std::vector<std::string> names;
  for (const Input* in : e.arguments()) names.push_back(in->name);
  return names;
}

void bind_graph(py::module_& m) {
  py::class_<Graph, std::shared_ptr<Graph>>(m, "Graph", "A jvpc graph: kernel-level SSA over ATen ops.")
      .def("__str__", [](const Graph& g) { return to_text(g); })
      .def(
          "to_text", [](const Graph& g) { return to_text(g); }, "One line per node.")
      .def(
          "to_json", [](const Graph& g) { return to_json(g).dump(1); },
          "The graph as JSON (constants named, not stored).")
      .def(
          "to_dot", [](const Graph& g, const std::string& title) { return to_dot(g, title); },
          py::arg("title") = "jvpc", "Graphviz source.")
      .def("_cost_json", [](const Graph& g) { return cost_json(graph_cost(g)); })
      .def(
          "save",
          [](const Graph& g, const std::string& path, bool trusted) {
            SaveOptions o;
            o.trusted = trusted;
            save(g, path, o);
          },
          py::arg("path"), py::arg("trusted") = false,
          "Writes the graph as JSON, and its constants to the safetensors file beside it.")
      .def_property_readonly("input_names",
                             [](const Graph& g) {
                               std::vector<std::string> names;
                               for (const Input& in : g.inputs()) names.push_back(in.name);
                               return names;
                             })
      .def_property_readonly("num_nodes", [](const Graph& g) { return g.nodes().size(); })
      .def_property_readonly(
          "constants",
          [](const Graph& g) {
            std::vector<at::Tensor> out;
            for (const Input& in : g.inputs())
              if (in.role == Role::Constant) out.push_back(in.data);
            return out;
          },
          "the tensors bound to its constant inputs, in graph order (undefined where unbound)");
}

void bind_options(py::module_& m) {
  py::class_<ExecutableOptions>(m, "ExecutableOptions", "How a compiled graph runs (runtime/executable.h).")
      .def(py::init<>())
      .def_readwrite("cuda_graph", &ExecutableOptions::cuda_graph)
      .def_readwrite("static_outputs", &ExecutableOptions::static_outputs)
      .def_readwrite("reuse_buffers", &ExecutableOptions::reuse_buffers)
      .def_readwrite("functional_under_dispatch_mode", &ExecutableOptions::functional_under_dispatch_mode)
      .def_readwrite("max_memory", &ExecutableOptions::max_memory);
  py::class_<LinearizeOptions>(m, "LinearizeOptions", "Options of linearize (compiler/api/linearize.h).")
      .def(py::init<>())
      .def_readwrite("disabled_passes", &LinearizeOptions::disabled_passes,
                     "optional passes to leave out (jvpc.optional_passes())")
      .def_readwrite("verify_each", &LinearizeOptions::verify_each)
      .def_readwrite("residual_budget", &LinearizeOptions::residual_budget,
                     "bytes of residuals each attention may hold (None: the device's default; 0: the O(L) form, "
                     "jvpc::attention_tangent, everywhere)")
      .def_readwrite("pass_costs", &LinearizeOptions::pass_costs,
                     "count the graph after every pass: report()['passes'] holds a row per pass (default: the "
                     "traced graph and the tangent graph only)")
      .def_readwrite("runtime", &LinearizeOptions::runtime);
  m.def("optional_passes", &optional_linearize_passes, "The passes LinearizeOptions.disabled_passes may name.");
  m.def("matmul_ops", &matmul_ops, "The ops whose FLOPs count as matmul FLOPs (the cost model's list).");
  m.def("dtype_names", &python_dtype_names, "ATen's name of each dtype a graph may hold (a graph's JSON) -> Python's.");
  m.def("_tracing", &tracing, "Whether a jvpc trace runs on this thread.");
  m.def(
      "_trace_value_origin",
      [](const at::Tensor& t) -> std::optional<std::pair<bool, std::vector<at::Tensor>>> {
        auto o = traced_value_origin(t);
        if (!o) return std::nullopt;
        return std::make_pair(o->from_inputs, std::move(o->captured));
      },
      py::arg("tensor"),
      "While a trace runs on this thread: (computed from the inputs, the captured tensors it was computed from); "
      "None otherwise.");
}

void bind_compiled(py::module_& m) {
  py::class_<Linearized, std::shared_ptr<Linearized>>(m, "_Linearized")
      .def("run",
           [](Linearized& l, const std::vector<at::Tensor>& t) {
             l.check_captured();
             return run_graph(*l.jvp_fn, t);
           })
      // --- batched tangents: K tangents stacked on a leading dim, one call ---------
      .def(
          "run_batched",
          [](Linearized& l, int64_t K, const std::vector<at::Tensor>& t) {
            py::gil_scoped_release release;
            at::NoGradGuard no_grad;
            return l.jvp_batched(K, t);
          },
          "K tangents per argument, stacked on a leading dim, in one call of the batched tangent graph")
      .def("batched_cost_json",
           [](Linearized& l, int64_t K) {
             py::gil_scoped_release release;
             return to_json(graph_cost(l.batched(K).fn->graph())).dump();
           })
      .def("batched_unrolled", [](Linearized& l, int64_t K) { return l.batched(K).unrolled; })
      .def(
          "batched_graph",
          [](Linearized& l, int64_t K) {
            std::shared_ptr<Executable> e = l.batched(K).fn;  // the Graph object keeps it alive
            return std::shared_ptr<Graph>(e, const_cast<Graph*>(&e->graph()));
          },
          "the batched tangent graph for K tangents (compiled once per K)")
      .def_property_readonly("tangent_names", &Linearized::tangent_names)
      .def_property_readonly(
          "constants", [](const Linearized& l) { return l.jvp_fn->constants(); },
          "the tangent graph's constants (residuals), one per constant input, in graph order")
      .def(
          "checked",
          [](const Linearized& l, const std::vector<at::Tensor>& t) {
            l.check_captured();
            return l.jvp_fn->checked(t);
          },
          "the tangents run() would use, checked as run() checks them, and the constants and captured tensors "
          "against writes")
      .def_property_readonly("graph",
                             [](const Linearized& l) { return std::const_pointer_cast<Graph>(l.tangent_graph); })
      .def_property_readonly("report_text", [](const Linearized& l) { return report_text(l.report); })
      .def_property_readonly("report_json", [](const Linearized& l) { return report_json(l).dump(); });
  py::class_<Executable, std::shared_ptr<Executable>>(m, "_Executable")
      .def("run", &run_graph)
      .def_property_readonly("argument_names", &argument_names)
      .def_property_readonly("graph", [](const std::shared_ptr<Executable>& e) {
        // The executable holds its graph: the Graph object keeps the executable alive.
        return std::shared_ptr<Graph>(e, const_cast<Graph*>(&e->graph()));
      });
}

// How jvpc.load and jvpc.load_program read a file: the loader's op list unless trusted, moved to
// `device` where one is given.
LoadOptions load_options(bool trusted, const std::optional<std::string>& device) {
  LoadOptions o;
  o.trusted = trusted;
  if (device) o.device = c10::Device(*device);
  return o;
}

// --- compiled programs (compiler/api/program.h): jvpc.compile ------------------------------
void bind_program(py::module_& m) {
  py::class_<Program, std::shared_ptr<Program>>(m, "_Program")
      .def(
          "linearize",
          [](const Program& p, const std::vector<at::Tensor>& primals) {
            std::shared_ptr<Linearized> lin;
            {
              py::gil_scoped_release release;
              lin = std::make_shared<Linearized>(p.linearize(primals));
            }
            std::vector<at::Tensor> outputs = lin->primal_outputs;
            lin->primal_outputs.clear();  // the caller holds them; the linear map does not
            return py::make_tuple(outputs, lin);
          },
          py::arg("primals"))
      .def(
          "linearize_from",
          [](const Program& p, const std::vector<at::Tensor>& primals, std::vector<at::Tensor> primal_graph_outputs) {
            auto lin = std::make_shared<Linearized>(p.linearize_from(primals, std::move(primal_graph_outputs)));
            std::vector<at::Tensor> outputs = lin->primal_outputs;
            lin->primal_outputs.clear();
            return py::make_tuple(outputs, lin);
          },
          py::arg("primals"), py::arg("primal_graph_outputs"),
          "as linearize, from the primal graph's outputs at primals, computed by another backend")
      .def(
          "primal_graph_inputs",
          [](const Program& p, const std::vector<at::Tensor>& primals) {
            return p.executable().primal_graph_inputs(primals);
          },
          py::arg("primals"),
          "the primal graph's inputs at primals, in graph order: the primals checked (and laid out) as "
          "linearize checks them, and the captured tensors as they are now; what another backend runs")
      .def_property_readonly("primal_graph",
                             [](const std::shared_ptr<Program>& p) {
                               return std::shared_ptr<Graph>(p, const_cast<Graph*>(&p->primal_graph()));
                             })
      .def_property_readonly("tangent_graph",
                             [](const Program& p) { return std::const_pointer_cast<Graph>(p.tangent_graph()); })
      .def_property_readonly("primal_cost_json", [](const Program& p) { return cost_json(p.primal_cost()); })
      // A loaded program keeps no compile report: its graphs' costs instead, as `jvpc cost` shows them.
      .def_property_readonly(
          "report_text",
          [](const Program& p) {
            if (!p.report().passes.empty()) return report_text(p.report());
            std::ostringstream os;
            print_cost_rows({{"primal graph", p.primal_cost()}, {"tangent graph", p.report().tangent}}, os);
            return os.str();
          })
      .def(
          "save",
          [](const Program& p, const std::string& path, bool trusted) {
            SaveOptions o;
            o.trusted = trusted;
            p.save(path, o);
          },
          py::arg("path"), py::arg("trusted") = false)
      // Per primal input, in order: (name, whether a tangent goes with it, a meta tensor of its
      // sizes, strides and dtype), which is all a loaded program knows of its arguments.
      .def_property_readonly(
          "primal_inputs",
          [](const Program& p) {
            py::list out;
            for (const Input* in : p.executable().primal_inputs()) {
              bool tangent = false;
              for (const Input& t : p.tangent_graph()->inputs())
                tangent |= t.role == Role::Tangent && t.tangent_of == in->name;
              const TensorMeta& m = in->value->meta();
              out.append(py::make_tuple(in->name, tangent,
                                        at::empty_strided(m.sizes, m.strides, at::dtype(m.dtype).device(at::kMeta))));
            }
            return out;
          })
      .def_property_readonly("num_primal_outputs",
                             [](const Program& p) { return p.executable().num_primal_outputs(); });
  m.def(
      "_load_program",
      [](const std::string& path, bool trusted, std::optional<std::string> device, ExecutableOptions runtime) {
        LoadOptions o = load_options(trusted, device);
        py::gil_scoped_release release;
        return std::make_shared<Program>(Program::load(path, o, runtime));
      },
      py::arg("path"), py::arg("trusted"), py::arg("device"), py::arg("runtime"));
  m.def("primal_package_path_for", &primal_package_path_for, py::arg("program_path"),
        "The AOTInductor package of a program's primal graph: p.json -> p.primal.pt2.");
  m.def("tangent_package_path_for", &tangent_package_path_for, py::arg("program_path"),
        "The AOTInductor package of a program's tangent graph: p.json -> p.tangent.pt2.");
  m.def(
      "_compile",
      [](py::object fn, const std::vector<at::Tensor>& primals, const std::vector<std::string>& names,
         const std::vector<bool>& differentiable, const std::vector<std::string>& wrt, LinearizeOptions options,
         bool exact_strides, const std::vector<bool>& state) {
        ProgramOptions po;
        po.linearize = std::move(options);
        po.linearize.wrt = wrt;
        po.exact_strides = exact_strides;
        std::vector<TraceInput> in = trace_inputs(primals, names, differentiable);
        if (state.size() > in.size()) throw Error("more state flags than inputs");
        for (size_t i = 0; i < state.size(); ++i) in[i].state = state[i];
        PyCallable call{fn.ptr(), std::nullopt};
        TensorFn f = tensor_fn(call);
        return std::make_shared<Program>(without_gil(call, [&] { return compile(f, in, po); }));
      },
      py::arg("fn"), py::arg("primals"), py::arg("names"), py::arg("differentiable"), py::arg("wrt"),
      py::arg("options"), py::arg("exact_strides"), py::arg("state"));
}

}  // namespace
}  // namespace jvpc

PYBIND11_MODULE(_C, m) {
  using namespace jvpc;
  m.doc() = "jvpc's compiler API (use the jvpc package, not this module)";
  // The block sizes of jvpc::attention_tangent that linearize emits (runtime/attention_tangent.h).
  m.attr("ATTENTION_BLOCK_Q") = runtime::kAttentionBlockQ;
  m.attr("ATTENTION_BLOCK_K") = runtime::kAttentionBlockK;
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    } catch (const c10::Error& e) {  // LibTorch's errors carry a stack of lines
      PyErr_SetString(error.ptr(), one_line(e).c_str());
    }
  });
  bind_graph(m);
  bind_options(m);
  bind_compiled(m);
  bind_program(m);
  bind_weight_stamp(m);

  py::class_<LinearizeCache, std::shared_ptr<LinearizeCache>>(m, "_LinearizeCache",
                                                              "linearize's optimized graphs, reused "
                                                              "(compiler/api/linearize_cache.h)")
      .def(py::init<size_t>(), py::arg("capacity") = 4)
      .def_property_readonly("hits", &LinearizeCache::hits)
      .def_property_readonly("misses", &LinearizeCache::misses)
      .def("__len__", &LinearizeCache::size);
  m.def(
      "_linearize",
      [](py::object fn, const std::vector<at::Tensor>& primals, const std::vector<std::string>& names,
         const std::vector<bool>& differentiable, const std::vector<std::string>& wrt, LinearizeOptions options,
         std::shared_ptr<LinearizeCache> cache) {
        options.wrt = wrt;
        std::vector<TraceInput> in = trace_inputs(primals, names, differentiable);
        PyCallable call{fn.ptr(), std::nullopt};
        TensorFn f = tensor_fn(call);
        auto lin = std::make_shared<Linearized>(
            without_gil(call, [&] { return cache ? cache->linearize(f, in, options) : linearize(f, in, options); }));
        std::vector<at::Tensor> outputs = lin->primal_outputs;
        lin->primal_outputs.clear();  // the caller holds them; the linear map does not
        return py::make_tuple(outputs, lin);
      },
      py::arg("fn"), py::arg("primals"), py::arg("names"), py::arg("differentiable"), py::arg("wrt"),
      py::arg("options"), py::arg("cache") = nullptr);
  m.def(
      "_trace",
      [](py::object fn, const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names) {
        std::vector<TraceInput> in = trace_inputs(inputs, names, std::vector<bool>(inputs.size(), true));
        PyCallable call{fn.ptr(), std::nullopt};
        TensorFn f = tensor_fn(call);
        Trace t = without_gil(call, [&] { return trace(f, in, TraceOptions::graph_only()); });
        return py::make_tuple(std::shared_ptr<Graph>(std::move(t.graph)), t.outputs);
      },
      py::arg("fn"), py::arg("inputs"), py::arg("names"));
  m.def(
      "_save_traced",
      [](const Graph& g, const std::string& graph_path, bool trusted, const std::vector<std::string>& names,
         const std::vector<at::Tensor>& values) {
        std::vector<std::pair<std::string, at::Tensor>> inputs;
        for (size_t i = 0; i < names.size() && i < values.size(); ++i) inputs.emplace_back(names[i], values[i]);
        py::gil_scoped_release release;
        SaveOptions options;
        options.trusted = trusted;
        save_traced(g, graph_path, options, inputs);
      },
      "Writes a traced graph, its constants and the inputs it was traced at (x.inputs.safetensors), whole or not "
      "at all, as `jvpc trace -o` does.",
      py::arg("graph"), py::arg("graph_path"), py::arg("trusted"), py::arg("names"), py::arg("values"));
  m.def(
      "_load",
      [](const std::string& path, bool trusted, std::optional<std::string> device, ExecutableOptions runtime) {
        LoadOptions o = load_options(trusted, device);
        py::gil_scoped_release release;
        return std::make_shared<Executable>(std::shared_ptr<const Graph>(load(path, o)), runtime);
      },
      py::arg("path"), py::arg("trusted"), py::arg("device"), py::arg("runtime"));
}
