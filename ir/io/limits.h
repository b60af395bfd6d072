// Memory limits: the default limit of a device, sizes as a user writes them ("64MiB", "inf"),
// and the check that a graph fits a limit. Shared by the loader (before it allocates anything)
// and the runtime (at construction), which depends on the IR only.
//
// The default limit is 3/4 (kDefaultMemoryFractionNumerator / ...Denominator) of the memory the process may use: on the
// CPU, the smaller of the physical RAM and the memory limit of the process's cgroup (v2
// memory.max, v1 memory.limit_in_bytes); on a CUDA device, its total memory. A graph is counted
// as its constants (each storage once), its other inputs (declared sizes) and the peak of its
// intermediates and outputs (peak_intermediate_bytes in liveness.h).
#pragma once

#include "ir/graph.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace jvpc {

struct Liveness;

/// A limit of this many bytes is no limit: nothing can need more ("inf" parses to it).
constexpr int64_t kNoMemoryLimit = std::numeric_limits<int64_t>::max();

/// The share of a device's memory that default_memory_limit() gives: 3/4, leaving a quarter to
/// the rest of the process (LibTorch's allocator caches, the program itself) and the system.
constexpr int64_t kDefaultMemoryFractionNumerator = 3;
constexpr int64_t kDefaultMemoryFractionDenominator = 4;

/// Physical RAM in bytes (sysconf); none if the system does not say.
std::optional<int64_t> physical_memory_bytes();

/// The memory limit of this process's cgroup in bytes, none where there is none ("max", an
/// unlimited v1 value, no cgroup file). Reads `proc_self_cgroup` for the process's cgroup and
/// walks from it up to the root of the hierarchy mounted at `cgroup_root`, taking the smallest
/// limit on the way: cgroup v2 `memory.max`, else cgroup v1 `memory/.../memory.limit_in_bytes`.
/// The paths are parameters for tests.
std::optional<int64_t> cgroup_memory_limit(const std::string& cgroup_root = "/sys/fs/cgroup",
                                           const std::string& proc_self_cgroup = "/proc/self/cgroup");

/// The memory a process on this machine may use on `device`: for the CPU, the smaller of
/// physical_memory_bytes() and cgroup_memory_limit(); for a CUDA device, its total memory
/// (an error if CUDA is not available). Before any fraction is taken. The CPU's is read once per
/// process.
int64_t device_memory_bytes(c10::Device device);

/// The default memory limit for graphs on `device`: 3/4 (kDefaultMemoryFraction*) of
/// device_memory_bytes(device). What LoadOptions::max_memory, ExecutableOptions::max_memory and
/// `--max-memory` mean when they are not set. Later budgets (residuals) are fractions of it too.
int64_t default_memory_limit(c10::Device device);

/// Parses a size as a user writes it: a whole number of bytes ("1048576"), a number with a unit
/// ("64MiB", "1.5G", "10GB", "512k"), or "inf" (kNoMemoryLimit). Units: B; K, M, G, T, P and
/// KiB ... PiB are powers of 1024; KB ... PB are powers of 1000; case is ignored. A fraction of a
/// byte is rounded down. Anything else, negative, or past 2^63 is a one-line error naming
/// `what` (the flag or option: "--max-memory").
int64_t parse_size(const std::string& text, const std::string& what);

/// "4.00 TiB (4398046511104 bytes)": bytes for a message, with the exact number.
std::string describe_bytes(int64_t bytes);

/// What one execution of a graph holds at its peak, in bytes.
struct MemoryNeed {
  int64_t constants = 0;      ///< bound: their storages, each once; unbound: declared sizes
  int64_t inputs = 0;         ///< the non-constant inputs, declared sizes
  int64_t intermediates = 0;  ///< peak of intermediates, outputs and kernel workspace alive at once
  /// The sum; kNoMemoryLimit if it passes 2^63.
  int64_t total() const;
};

/// The memory `g` needs, from its metadata and its constants' storages. Sizes whose bytes pass
/// 2^63 give kNoMemoryLimit in that field.
MemoryNeed memory_needed(const Graph& g);
/// The same, given the liveness of `g` (analyze_liveness), which the caller also needs.
MemoryNeed memory_needed(const Graph& g, const Liveness& live);

/// The device whose memory one execution of `g` uses, and whose limit applies to it: its first
/// non-constant input's, else its first node result's, else the CPU (constants may live
/// elsewhere, e.g. CPU scalars).
c10::Device execution_device(const Graph& g);

/// The limit a setting gives: `limit` itself, or default_memory_limit(device) where it is none.
int64_t memory_limit_or_default(std::optional<int64_t> limit, c10::Device device);

/// Throws a one-line jvpc::Error when `need` is over the limit (`limit`, or by default
/// default_memory_limit(device); kNoMemoryLimit: never): "graph needs 4.00 TiB (4398046511104
/// bytes) at its peak (constants ..., inputs ..., intermediates ...) but the memory limit on cpu
/// is ... (`setting`)". `setting` names what sets the limit ("LoadOptions::max_memory, --max-memory").
void check_memory_limit(const MemoryNeed& need, std::optional<int64_t> limit, c10::Device device,
                        const std::string& setting);

}  // namespace jvpc
