// Memory limits: the machine's and the cgroup's memory, sizes from flags, and the check that a
// graph fits.
#include "ir/io/limits.h"
#include "ir/checked_math.h"

#include "ir/liveness.h"

#include <ATen/ATen.h>

#ifdef JVPC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_set>

namespace jvpc {

namespace {

// The first line of a small kernel file; none if it cannot be read.
std::optional<std::string> first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  return line;
}

// A cgroup limit file's value: bytes, or none for "max" or anything that is not a number.
// cgroup v1 writes "no limit" as LONG_MAX rounded down to a page; anything from 2^62 up is
// taken as that.
std::optional<int64_t> limit_in(const std::string& path) {
  auto line = first_line(path);
  if (!line || line->empty()) return std::nullopt;
  int64_t v = 0;
  for (char ch : *line) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) return std::nullopt;  // "max"
    if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return std::nullopt;
    v = v * 10 + (ch - '0');
  }
  if (v >= (int64_t{1} << 62)) return std::nullopt;
  return v;
}

// The smallest limit in `file` from the cgroup `dir` (below `mount`) up to the mount itself.
std::optional<int64_t> smallest_limit_up(const std::string& mount, std::string cgroup, const std::string& file) {
  std::optional<int64_t> best;
  while (true) {
    if (auto v = limit_in(mount + cgroup + (cgroup.empty() || cgroup.back() != '/' ? "/" : "") + file))
      best = best ? std::min(*best, *v) : *v;
    if (cgroup.empty() || cgroup == "/") break;
    size_t slash = cgroup.find_last_of('/');
    cgroup = slash == std::string::npos ? "" : cgroup.substr(0, slash);
  }
  return best;
}

}  // namespace

std::optional<int64_t> physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::nullopt;
  int64_t r = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(pages), static_cast<int64_t>(page), &r)) return kNoMemoryLimit;
  return r;
}

std::optional<int64_t> cgroup_memory_limit(const std::string& cgroup_root, const std::string& proc_self_cgroup) {
  // /proc/self/cgroup: "0::/path" for cgroup v2, "4:memory:/path" (controllers may be a
  // comma-separated list) for v1. Without it, the root of each hierarchy is read.
  std::string v2_path = "/", v1_path = "/";
  std::ifstream f(proc_self_cgroup);
  for (std::string line; std::getline(f, line);) {
    size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) v2_path = path;
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory") v1_path = path;
  }
  // A path that does not exist under the mount (a container that sees the host's path) falls
  // back to the levels above it, down to the mount, which is then the container's own cgroup.
  std::optional<int64_t> v2 = smallest_limit_up(cgroup_root, v2_path, "memory.max");
  std::optional<int64_t> v1 = smallest_limit_up(cgroup_root + "/memory", v1_path, "memory.limit_in_bytes");
  if (v2 && v1) return std::min(*v2, *v1);
  return v2 ? v2 : v1;
}

int64_t device_memory_bytes(c10::Device device) {
  if (device.is_cuda()) {
    if (!at::hasCUDA()) throw Error("device " + device.str() + ": CUDA is not available on this machine");
#ifdef JVPC_WITH_CUDA
    int index = device.has_index() ? device.index() : c10::cuda::current_device();
    return static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
#else
    throw Error("device " + device.str() + ": this jvpc was built without CUDA");
#endif
  }
  if (!device.is_cpu()) throw Error("device " + device.str() + ": no memory limit is known for it (cpu or cuda)");
  // Read once per process: the cgroup's files cost a dozen system calls, and every Executable asks.
  static const std::optional<int64_t> cpu = [] {
    std::optional<int64_t> ram = physical_memory_bytes(), cgroup = cgroup_memory_limit();
    return ram && cgroup ? std::min(*ram, *cgroup) : ram ? ram : cgroup;
  }();
  if (!cpu) throw Error("the machine's memory is unknown (sysconf gives no page count): set a memory limit");
  return *cpu;
}

int64_t default_memory_limit(c10::Device device) {
  int64_t bytes = device_memory_bytes(device);
  return bytes / kDefaultMemoryFractionDenominator * kDefaultMemoryFractionNumerator;
}

int64_t parse_size(const std::string& text, const std::string& what) {
  auto bad = [&]() {
    return Error(what + ": '" + text +
                 "' is not a size (bytes, a number with a unit such as 64MiB, 1.5G or 10GB, or inf)");
  };
  std::string lower;
  for (char ch : text) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) throw Error(what + ": contains a control character");
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  if (lower == "inf") return kNoMemoryLimit;
  // The number: digits with at most one decimal point, nothing else (no sign, no exponent).
  size_t i = 0;
  bool digits = false, point = false;
  for (; i < lower.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(lower[i])))
      digits = true;
    else if (lower[i] == '.' && !point)
      point = true;
    else
      break;
  }
  if (!digits) throw bad();
  std::string number = lower.substr(0, i), unit = lower.substr(i);
  static const std::pair<const char*, double> units[] = {
      {"", 1},         {"b", 1},     {"k", 0x1p10}, {"kib", 0x1p10}, {"kb", 1e3}, {"m", 0x1p20},
      {"mib", 0x1p20}, {"mb", 1e6},  {"g", 0x1p30}, {"gib", 0x1p30}, {"gb", 1e9}, {"t", 0x1p40},
      {"tib", 0x1p40}, {"tb", 1e12}, {"p", 0x1p50}, {"pib", 0x1p50}, {"pb", 1e15}};
  const double* scale = nullptr;
  for (const auto& [name, s] : units)
    if (unit == name) scale = &s;
  if (!scale) throw bad();
  if (!point) {  // whole numbers exactly, past double's 53 bits
    int64_t v = 0;
    for (char ch : number)
      if (__builtin_mul_overflow(v, int64_t{10}, &v) || __builtin_add_overflow(v, int64_t{ch - '0'}, &v))
        throw Error(what + ": '" + text + "' is more than 2^63 bytes (write inf for no limit)");
    int64_t r = 0;
    if (__builtin_mul_overflow(v, static_cast<int64_t>(*scale), &r))
      throw Error(what + ": '" + text + "' is more than 2^63 bytes (write inf for no limit)");
    return r;
  }
  double bytes = std::floor(std::strtod(number.c_str(), nullptr) * *scale);
  if (!(bytes < 0x1p63)) throw Error(what + ": '" + text + "' is more than 2^63 bytes (write inf for no limit)");
  return static_cast<int64_t>(bytes);
}

std::string describe_bytes(int64_t bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  char buf[96];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
    return buf;
  }
  double d = static_cast<double>(bytes);
  int u = -1;
  while (d >= 1024 && u < 5) {
    d /= 1024;
    ++u;
  }
  std::snprintf(buf, sizeof buf, "%.2f %s (%lld bytes)", d, units[u], static_cast<long long>(bytes));
  return buf;
}

int64_t MemoryNeed::total() const {
  return checked::add_saturating(checked::add_saturating(constants, inputs), intermediates);
}

namespace {

// Constants and inputs; the caller adds the intermediates.
MemoryNeed inputs_needed(const Graph& g) {
  MemoryNeed need;
  auto declared = [](const Value* v) {
    try {
      return v->meta().nbytes();
    } catch (const Error&) {
      return kNoMemoryLimit;
    }
  };
  std::unordered_set<const void*> storages;
  for (const Input& in : g.inputs()) {
    if (in.role != Role::Constant) {
      need.inputs = checked::add_saturating(need.inputs, declared(in.value));
    } else if (in.data.defined() && in.data.has_storage()) {
      if (storages.insert(in.data.storage().unsafeGetStorageImpl()).second)
        need.constants = checked::add_saturating(need.constants, static_cast<int64_t>(in.data.storage().nbytes()));
    } else {
      need.constants = checked::add_saturating(need.constants, declared(in.value));
    }
  }
  return need;
}

}  // namespace

MemoryNeed memory_needed(const Graph& g) {
  MemoryNeed need = inputs_needed(g);
  try {
    need.intermediates = peak_intermediate_bytes(g, analyze_liveness(g), /*workspace=*/true);
  } catch (const Error&) {  // bytes past 2^63
    need.intermediates = kNoMemoryLimit;
  }
  return need;
}

MemoryNeed memory_needed(const Graph& g, const Liveness& live) {
  MemoryNeed need = inputs_needed(g);
  try {
    need.intermediates = peak_intermediate_bytes(g, live, /*workspace=*/true);
  } catch (const Error&) {  // bytes past 2^63
    need.intermediates = kNoMemoryLimit;
  }
  return need;
}

c10::Device execution_device(const Graph& g) {
  for (const Input& in : g.inputs())
    if (in.role != Role::Constant) return in.value->meta().device;
  for (const Node* n : g.nodes())
    if (!n->outputs().empty()) return n->output(0)->meta().device;
  return c10::Device(c10::kCPU);
}

int64_t memory_limit_or_default(std::optional<int64_t> limit, c10::Device device) {
  return limit ? *limit : default_memory_limit(device);
}

void check_memory_limit(const MemoryNeed& need, std::optional<int64_t> limit, c10::Device device,
                        const std::string& setting) {
  if (limit == kNoMemoryLimit) return;
  int64_t bound = memory_limit_or_default(limit, device);
  if (need.total() <= bound) return;
  auto bytes = [](int64_t b) { return b == kNoMemoryLimit ? std::string("more than 2^63 bytes") : describe_bytes(b); };
  auto part = [&](int64_t b) {  // without the exact count, which the total and the limit give
    std::string s = bytes(b);
    return s.substr(0, s.find(" ("));
  };
  std::string by_default = limit ? ""
                                 : ", " + std::to_string(kDefaultMemoryFractionNumerator) + "/" +
                                       std::to_string(kDefaultMemoryFractionDenominator) + " of its memory by default";
  throw Error("graph needs " + bytes(need.total()) + " at its peak (constants " + part(need.constants) + ", inputs " +
              part(need.inputs) + ", intermediates " + part(need.intermediates) + ") but the memory limit on " +
              device.str() + " is " + describe_bytes(bound) + by_default + " (" + setting + ")");
}

}  // namespace jvpc
