// A fuzzer over the list of loadable ops (ir/loadable_ops.h): for every op, graphs of
// that one op with adversarial arguments, built from its schema, saved and loaded as a
// stranger's file, then run under limits (256 MiB, 1e9 FLOPs by the cost model). Arguments:
// extreme, negative and out-of-range integers and int lists; index tensors out of range,
// stored as constants and computed at run time (a float input cast to Long); empty and
// zero-size tensors, stride-0 expands and transposes; inputs that are views at an offset into a
// larger buffer; huge windows; NaN and infinite floats.
//
// Each case must end in one of: refused by shape inference (as the loader would), refused by
// the loader, refused by a limit, a one-line jvpc::Error from the run, or a result. Anything
// else is a finding: another exception type, a multi-line error, a case slower than --slow; a
// crash or a sanitizer report ends the process (scripts/sanitize.sh runs it under ASan+UBSan).
// The op is printed before each of its cases run, so a crash names it.
//
//   fuzz_loadable_ops [--cases N] [--seed S] [--slow SECONDS] [--op NAME | --from NAME] [--quiet | --verbose]
//
// --cases: bases per op (default 24); --slow: the seconds a case may take (default 2; more under
// the sanitizers, which slow kernels several times).
#include "ir/cost/cost_model.h"
#include "ir/builder.h"
#include "ir/io/limits.h"
#include "ir/loadable_ops.h"
#include "ir/op_contracts.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/io/graph_files.h"
#include "ir/io/safetensors.h"
#include "runtime/executable.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <random>

namespace jvpc {
namespace {

constexpr int64_t kMemoryLimit = 256 << 20;
constexpr double kFlopLimit = 1e9;
double slow_seconds = 2.0;  // --slow: a case that takes longer is a finding

struct Counts {
  int64_t ops_reached = 0, bases = 0, cases = 0, shape_refused = 0, load_refused = 0, limit_refused = 0, errors = 0,
          ran = 0, findings = 0;
};

// Whether argument `name` of `op` holds indices, by the op's contract; and the dtype they have.
bool is_index_name(const std::string& op, const std::string& name) {
  const OpContract* c = op_contract(op);
  if (c)
    for (const IndexArg& a : c->indices)
      if (name == a.index) return true;
  return false;
}
c10::ScalarType index_dtype(const std::string& name) {
  return name == "pivots" || name == "LU_pivots" ? at::kInt : at::kLong;
}

// Int and int[] argument names that are dims.
bool is_dim_name(const std::string& n) {
  return n == "dim" || n == "dim0" || n == "dim1" || n == "dim2" || n == "dimension" || n == "axis" ||
         n == "start_dim" || n == "end_dim" || n == "offset";
}

// One graph of one op. Its base arguments come from `seed`, each from a stream of its own, and
// are coherent enough for most ops to accept them: most tensors share one shape, dims lie within
// its rank, windows are small, indices in range. Argument `mutated` (none: -1) is replaced by an
// adversarial value drawn from `mutation`.
class Case {
 public:
  Case(const std::string& op, uint64_t seed, int mutated, uint64_t mutation)
      : op_(op), seed_(seed), mutated_(mutated), adversary_(mutation) {
    std::mt19937_64 ctx(seed);
    rank_ = static_cast<int>(pick(ctx, {1, 2, 2, 3, 3, 4, 4, 5}));
    for (int i = 0; i < rank_; ++i) base_.push_back(pick(ctx, {1, 2, 2, 3, 4}));
    offset_inputs_ = chance(ctx, 25);
  }

  /// Builds the graph; false where shape inference refuses the arguments (as the loader would).
  bool build() {
    const OpInfo& info = op_info(op_);
    std::vector<Arg> args;
    std::vector<Value*> operands;
    const auto& schema = info.schema().arguments();
    for (size_t i = 0; i < schema.size(); ++i) {
      std::mt19937_64 rng(seed_ * 7919 + i);
      bool adversarial = static_cast<int>(i) == mutated_;
      args.push_back(argument(schema[i], adversarial ? adversary_ : rng, adversarial, operands));
    }
    std::vector<TensorMeta> in;
    for (const Value* v : operands) in.push_back(v->meta());
    std::vector<int> counts;
    std::vector<TensorMeta> metas;
    try {
      metas = infer_outputs(info, args, in, &counts);
    } catch (const Error&) {
      return false;
    } catch (const c10::Error&) {
      return false;
    }
    Node* n = g_.create(op_, args, operands, metas, counts, is_impure(info, args));
    for (size_t i = 0; i < n->outputs().size(); ++i) g_.add_output(n->output(i), "y" + std::to_string(i));
    return !n->outputs().empty();
  }
  Graph& graph() { return g_; }
  /// The run's inputs, one per non-constant graph input.
  std::vector<at::Tensor> inputs() {
    std::vector<at::Tensor> out;
    for (const Input& in : g_.inputs())
      if (in.role != Role::Constant) out.push_back(fill(in.value->meta(), fills_[in.name]));
    return out;
  }

 private:
  static int64_t pick(std::mt19937_64& r, std::initializer_list<int64_t> xs) { return *(xs.begin() + r() % xs.size()); }
  static bool chance(std::mt19937_64& r, int percent) { return static_cast<int>(r() % 100) < percent; }

  // Integers at and past every edge.
  static int64_t extreme(std::mt19937_64& r) {
    return pick(r, {-1, -2, -7, 5, 64, 512, 1 << 20, int64_t{1} << 31, -(int64_t{1} << 31), int64_t{1} << 40,
                    std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()});
  }

  // How a run fills an input: in-range small integers (indices), normal values, huge, negative,
  // a NaN, integers to 20.
  enum Fill { Small, Normal, Huge, Negative, NonFinite, Ints };

  at::Tensor fill(const TensorMeta& m, int how) {
    at::TensorOptions o = at::TensorOptions().dtype(m.dtype);
    at::Tensor t;
    if (m.dtype == at::kBool) {
      t = at::rand(m.sizes) > 0.5;
    } else if (how == Small) {
      t = at::randint(0, 2, m.sizes, o);
    } else if (how == Huge) {
      t = at::full(m.sizes, 1e8, o);
    } else if (how == Negative) {
      t = at::full(m.sizes, -3, o);
    } else if (how == Ints || c10::isIntegralType(m.dtype, false)) {
      t = at::randint(-2, 20, m.sizes, o);
    } else {
      t = at::randn(m.sizes, o);
      if (how == NonFinite && t.numel()) t.view(-1)[0] = std::numeric_limits<double>::quiet_NaN();
    }
    at::Tensor x = at::empty_strided(m.sizes, m.strides, o);
    if (!offset_inputs_) return x.copy_(t);
    // A view into a larger buffer, 4 elements past its start and 4 before its end (a
    // storage-relative op must stay inside the tensor passed).
    int64_t span = static_cast<int64_t>(x.storage().nbytes() / x.itemsize());
    return at::empty({span + 8}, o).fill_(7).as_strided(m.sizes, m.strides, 4).copy_(t);
  }

  Value* input(const TensorMeta& m, Fill how) {
    std::string name = "x" + std::to_string(next_++);
    Value* v = g_.add_input(name, m, Role::Primal);
    fills_[name] = how;
    return v;
  }

  std::vector<int64_t> shape(std::mt19937_64& r) {
    switch (r() % 10) {
      case 0:
        return base_.size() > 1 ? std::vector<int64_t>(base_.begin() + 1, base_.end()) : base_;
      case 1:
        return {base_.back()};
      case 2: {
        std::vector<int64_t> s = base_;
        s[r() % s.size()] = 1;
        return s;
      }
      case 3: {
        std::vector<int64_t> s;
        for (int i = 0; i < rank_; ++i) s.push_back(pick(r, {1, 2, 3, 4}));
        return s;
      }
      default:
        return base_;
    }
  }

  // A tensor argument. Indices: in range (a constant or an input); adversarial, a constant with
  // one extreme value, or a value cast at run time from a float input filled with huge or
  // negative numbers. Others: an input of a coherent shape; adversarial, a zero-size one, a
  // stride-0 expand, a transpose, a scalar, or a large one.
  Value* tensor(const std::string& name, std::mt19937_64& r, bool adversarial) {
    Builder b(g_);
    if (is_index_name(op_, name) || name == "list_index") {
      c10::ScalarType it = index_dtype(name);
      std::vector<int64_t> s = chance(r, 50) ? base_ : std::vector<int64_t>{base_.back()};
      if (!adversarial) {
        if (chance(r, 30)) return g_.add_constant("c" + std::to_string(next_++), at::randint(0, 2, s, it));
        return input(TensorMeta::contiguous(s, it, c10::kCPU), Small);
      }
      if (chance(r, 40)) {
        at::Tensor c = at::randint(0, 2, s, it);
        int64_t v = extreme(r);
        if (it == at::kInt)
          v = std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
        if (c.numel()) c.view(-1)[static_cast<int64_t>(r() % static_cast<uint64_t>(c.numel()))] = v;
        return g_.add_constant("c" + std::to_string(next_++), c);
      }
      Value* f = input(TensorMeta::contiguous(s, at::kFloat, c10::kCPU), chance(r, 50) ? Huge : Negative);
      return b.call("aten::_to_copy", {f, it});
    }
    c10::ScalarType dtype = name == "mask" ? at::kBool : chance(r, 10) ? at::kDouble : at::kFloat;
    std::vector<int64_t> s = shape(r);
    if (!adversarial) return input(TensorMeta::contiguous(s, dtype, c10::kCPU), Normal);
    switch (r() % 6) {
      case 0:
        if (!s.empty()) s[r() % s.size()] = 0;
        return input(TensorMeta::contiguous(s, dtype, c10::kCPU), Normal);
      case 1:
        if (!s.empty()) {
          std::vector<int64_t> ones(s.size(), 1);
          return b.call("aten::expand", {input(TensorMeta::contiguous(ones, dtype, c10::kCPU), Normal), s});
        }
        return input(TensorMeta::contiguous(s, dtype, c10::kCPU), NonFinite);
      case 2:
        if (s.size() >= 2)
          return b.call("aten::transpose.int",
                        {input(TensorMeta::contiguous(s, dtype, c10::kCPU), Normal), int64_t{0}, int64_t{1}});
        return input(TensorMeta::contiguous(s, dtype, c10::kCPU), NonFinite);
      case 3:
        return input(TensorMeta::contiguous({}, dtype, c10::kCPU), Normal);
      case 4: {
        std::vector<int64_t> big = s;
        if (!big.empty()) big.back() = 1 << 16;
        return input(TensorMeta::contiguous(big, dtype, c10::kCPU), Normal);
      }
      default:
        return input(TensorMeta::contiguous(s, dtype, c10::kCPU), NonFinite);
    }
  }

  std::vector<int64_t> ints(const std::string& name, std::mt19937_64& r, bool adversarial) {
    int64_t spatial = std::max(1, std::min(3, rank_ - 2));
    std::vector<int64_t> v;
    if (name == "dim" || name == "dims") {
      v = chance(r, 50) ? std::vector<int64_t>{-1} : std::vector<int64_t>{0};
    } else if (name == "kernel_size") {
      v.assign(static_cast<size_t>(spatial), pick(r, {1, 2}));
    } else if (name == "stride" || name == "dilation") {
      v = chance(r, 30) ? std::vector<int64_t>{} : std::vector<int64_t>(static_cast<size_t>(spatial), 1);
    } else if (name == "padding" || name == "pad") {
      int64_t n = name == "pad" || chance(r, 50) ? pick(r, {2, 4, 6}) : spatial;
      v.assign(static_cast<size_t>(n), pick(r, {0, 1}));
    } else if (name == "output_size" || name == "size" || name == "shape" || name == "sizes") {
      v = name == "output_size" ? std::vector<int64_t>(static_cast<size_t>(spatial), pick(r, {1, 2})) : base_;
    } else {
      for (int64_t i = 0, n = pick(r, {1, 2, spatial}); i < n; ++i) v.push_back(pick(r, {0, 1, 2}));
    }
    if (!adversarial) return v;
    switch (r() % 4) {
      case 0:
        return {};
      case 1:
        return std::vector<int64_t>(7, extreme(r));
      default:
        if (v.empty()) v.push_back(0);
        v[r() % v.size()] = extreme(r);
        return v;
    }
  }

  Arg argument(const c10::Argument& a, std::mt19937_64& r, bool adversarial, std::vector<Value*>& operands) {
    auto operand = [&](Value* v) {
      operands.push_back(v);
      return static_cast<int>(operands.size() - 1);
    };
    const std::string& name = a.name();
    if (kind_matches(ArgKind::None, a) && (adversarial ? chance(r, 10) : chance(r, 30))) return Arg::none();
    if (kind_matches(ArgKind::Tensor, a)) return Arg::tensor(operand(tensor(name, r, adversarial)));
    if (kind_matches(ArgKind::OptTensorList, a)) {  // index.Tensor, index_put: index tensors
      Arg l{ArgKind::OptTensorList, {}, {}};
      for (int64_t i = 0, n = adversarial ? pick(r, {0, 1, 2, 6}) : pick(r, {1, 2}); i < n; ++i)
        l.operands.push_back(chance(r, 25) ? -1 : operand(tensor("list_index", r, adversarial)));
      return l;
    }
    if (kind_matches(ArgKind::TensorList, a)) {
      Arg l{ArgKind::TensorList, {}, {}};
      for (int64_t i = 0, n = adversarial ? pick(r, {0, 1, 3}) : pick(r, {1, 2, 3}); i < n; ++i)
        l.operands.push_back(operand(tensor(name, r, adversarial && i == 0)));
      return l;
    }
    if (kind_matches(ArgKind::Ints, a)) return Arg::of_ints(ints(name, r, adversarial));
    if (kind_matches(ArgKind::Int, a) && !kind_matches(ArgKind::Float, a)) {
      if (adversarial) return Arg::of_int(extreme(r));
      if (is_dim_name(name)) return Arg::of_int(pick(r, {0, 1, -1}) % std::max(rank_, 1));
      if (name == "ignore_index") return Arg::of_int(-100);
      return Arg::of_int(pick(r, {0, 1, 1, 2}));
    }
    if (kind_matches(ArgKind::Float, a) && !kind_matches(ArgKind::Int, a)) {
      if (!adversarial) return Arg::of_float(static_cast<double>(pick(r, {1, 2, 1})) * 0.5);
      return Arg::of_float(*(std::initializer_list<double>{std::numeric_limits<double>::infinity(),
                                                           -std::numeric_limits<double>::infinity(),
                                                           std::numeric_limits<double>::quiet_NaN(), 1e300, -1e300, 0.0}
                                 .begin() +
                             r() % 6));
    }
    if (kind_matches(ArgKind::Int, a)) {  // a Scalar
      if (!adversarial) return chance(r, 50) ? Arg::of_int(pick(r, {1, 2})) : Arg::of_float(0.5);
      return chance(r, 50) ? Arg::of_int(extreme(r)) : Arg::of_float(chance(r, 50) ? 1e300 : std::nan(""));
    }
    if (kind_matches(ArgKind::Bool, a)) return Arg::of_bool(chance(r, 50));
    if (kind_matches(ArgKind::Floats, a)) {
      std::vector<double> v(static_cast<size_t>(std::max(1, std::min(3, rank_ - 2))), adversarial ? 1e300 : 2.0);
      return Arg{ArgKind::Floats, v, {}};
    }
    if (kind_matches(ArgKind::Bools, a)) {
      c10::List<bool> v;
      for (int64_t i = 0, n = pick(r, {1, 2, 3}); i < n; ++i) v.push_back(chance(r, 50));
      return Arg{ArgKind::Bools, v, {}};
    }
    if (kind_matches(ArgKind::Str, a)) {
      static const char* strs[] = {"none", "mean", "sum", "tanh", "floor", "trunc", "reflect", "L", "reduced", "amax"};
      return Arg::of_str(adversarial ? std::string(200, '\x7f') : strs[r() % (sizeof strs / sizeof *strs)]);
    }
    if (kind_matches(ArgKind::ScalarType, a))
      return Arg::of_scalar_type(adversarial ? static_cast<c10::ScalarType>(pick(
                                                   r, {static_cast<int64_t>(at::kBool), static_cast<int64_t>(at::kHalf),
                                                       static_cast<int64_t>(at::kLong)}))
                                             : at::kFloat);
    if (kind_matches(ArgKind::Device, a)) return Arg::of_device(c10::Device(c10::kCPU));
    if (kind_matches(ArgKind::MemoryFormat, a))
      return Arg{ArgKind::MemoryFormat,
                 static_cast<int64_t>(chance(r, 50) ? c10::MemoryFormat::Contiguous : c10::MemoryFormat::Preserve),
                 {}};
    if (kind_matches(ArgKind::Layout, a)) return Arg{ArgKind::Layout, static_cast<int64_t>(c10::kStrided), {}};
    return Arg::none();
  }

  std::string op_;
  uint64_t seed_;
  int mutated_;
  std::mt19937_64 adversary_;
  int rank_ = 0;
  std::vector<int64_t> base_;
  bool offset_inputs_ = false;  // the run's inputs are views at an offset into larger buffers
  Graph g_;
  int next_ = 0;
  std::map<std::string, int> fills_;  // input name -> Fill
};

bool verbose = false;  // --verbose: each graph and its inputs before it runs

bool one_line(const std::string& s) { return s.find('\n') == std::string::npos && !s.empty(); }

void finding(Counts& c, const std::string& op, int k, const std::string& what) {
  ++c.findings;
  std::cerr << "FINDING " << op << " case " << k << ": " << what << "\n";
}

// Runs one case from its arguments to its result.
void run_case(const std::string& op, int k, Case& fc, const std::string& dir, Counts& c) {
  ++c.cases;
  try {
    if (!fc.build()) {
      ++c.shape_refused;
      return;
    }
  } catch (const std::exception& e) {
    finding(c, op, k, std::string("shape inference threw another exception: ") + e.what());
    return;
  }
  std::string path = dir + "/g.json";
  std::unique_ptr<Graph> g;
  LoadOptions lo;
  lo.max_memory = kMemoryLimit;
  try {
    save(fc.graph(), path);
    g = load(path, lo);
  } catch (const Error& e) {
    if (!one_line(e.what())) finding(c, op, k, std::string("a multi-line load error: ") + e.what());
    ++c.load_refused;
    return;
  } catch (const std::exception& e) {
    finding(c, op, k, std::string("load threw another exception: ") + e.what());
    return;
  }
  try {
    GraphCost cost = graph_cost(*g);
    if (static_cast<double>(cost.matmul_flops) + static_cast<double>(cost.other_flops) > kFlopLimit) {
      ++c.limit_refused;
      return;
    }
  } catch (const Error&) {
    ++c.limit_refused;  // counts past 2^63
    return;
  }
  std::vector<at::Tensor> inputs = fc.inputs();
  if (verbose) {
    std::cerr << to_text(*g);
    for (const at::Tensor& t : inputs) std::cerr << "  input " << t.sizes() << " " << t.view(-1).slice(0, 0, 8) << "\n";
  }
  auto start = std::chrono::steady_clock::now();
  try {
    ExecutableOptions o = ExecutableOptions::eager();
    o.max_memory = kMemoryLimit;
    Executable f(std::move(g), o);
    f.run(inputs);
    ++c.ran;
  } catch (const Error& e) {
    if (std::string(e.what()).find("memory limit") != std::string::npos)
      ++c.limit_refused;
    else
      ++c.errors;
    if (!one_line(e.what())) finding(c, op, k, std::string("a multi-line error: ") + e.what());
  } catch (const std::exception& e) {
    finding(c, op, k, std::string("the run threw another exception: ") + e.what());
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (seconds > slow_seconds) finding(c, op, k, "took " + std::to_string(seconds) + " s");
}

}  // namespace
}  // namespace jvpc

int main(int argc, char** argv) {
  int cases = 24;
  uint64_t seed = 1;
  std::string only, from;
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--cases" && i + 1 < argc)
      cases = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--slow" && i + 1 < argc)
      jvpc::slow_seconds = std::atof(argv[++i]);
    else if (a == "--op" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--from" && i + 1 < argc)
      from = argv[++i];
    else if (a == "--quiet")
      quiet = true;
    else if (a == "--verbose")
      jvpc::verbose = true;
    else {
      std::cerr
          << "usage: fuzz_loadable_ops [--cases N] [--seed S] [--slow SECONDS] [--op NAME | --from NAME] [--quiet | "
             "--verbose]\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  // Files in memory where there is a tmpfs: saving syncs every file to disk.
  std::string tmpl = (::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + std::string("/jvpc-fuzz-ops-XXXXXX");
  if (!::mkdtemp(tmpl.data())) return 2;
  std::string dir = tmpl;
  jvpc::Counts total;
  std::vector<std::string> unreached;  // ops for which no base was found
  std::vector<std::string> absent;     // ops this LibTorch does not have
  int ops = 0;
  auto start = std::chrono::steady_clock::now();
  for (const std::string& op : jvpc::loadable_ops()) {
    if ((!only.empty() && op != only) || (!from.empty() && op < from)) continue;
    ++ops;
    if (!quiet) std::cerr << op << "\n";
    // Bases the op accepts, found among up to 100 per base asked for; each base runs as it is, and
    // once with each of its arguments made adversarial.
    int bases = 0;
    size_t arity = 0;
    try {
      arity = jvpc::op_info(op).schema().arguments().size();
    } catch (const jvpc::Error&) {  // the list holds ops of other LibTorch releases
      absent.push_back(op);
      continue;
    }
    for (int t = 0; bases < cases && t < 100 * cases; ++t) {
      uint64_t s = seed * 1000003 + std::hash<std::string>()(op) * 31 + static_cast<uint64_t>(t);
      jvpc::Case base(op, s, -1, 0);
      try {
        if (!jvpc::Case(op, s, -1, 0).build()) continue;
      } catch (const std::exception& e) {
        jvpc::finding(total, op, t, std::string("shape inference threw another exception: ") + e.what());
        continue;
      }
      ++bases;
      jvpc::run_case(op, t, base, dir, total);
      for (size_t j = 0; j < arity; ++j) {
        jvpc::Case mutated(op, s, static_cast<int>(j), s * 31 + j);
        jvpc::run_case(op, t, mutated, dir, total);
      }
    }
    total.bases += bases;
    total.ops_reached += bases > 0;
    if (bases == 0) unreached.push_back(op);
  }
  std::remove((dir + "/g.json").c_str());
  std::remove((dir + "/g.safetensors").c_str());
  ::rmdir(dir.c_str());
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "fuzz_loadable_ops: %d ops (%lld with a base their shape inference accepts, %lld bases), %lld cases: %lld "
      "refused by shape inference, %lld by the loader, %lld by a limit, %lld one-line errors, %lld ran; %lld "
      "findings; %.0f s, peak RSS %ld MiB\n",
      ops, static_cast<long long>(total.ops_reached), static_cast<long long>(total.bases),
      static_cast<long long>(total.cases), static_cast<long long>(total.shape_refused),
      static_cast<long long>(total.load_refused), static_cast<long long>(total.limit_refused),
      static_cast<long long>(total.errors), static_cast<long long>(total.ran), static_cast<long long>(total.findings),
      seconds, ru.ru_maxrss / 1024);
  if (!absent.empty()) {
    std::printf("not in this LibTorch:");
    for (const std::string& op : absent) std::printf(" %s", op.c_str());
    std::printf("\n");
  }
  if (!unreached.empty()) {
    std::printf("no base found for:");
    for (const std::string& op : unreached) std::printf(" %s", op.c_str());
    std::printf("\n");
  }
  return total.findings ? 1 : 0;
}
