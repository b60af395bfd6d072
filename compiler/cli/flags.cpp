// Validators for numeric and file flags, shared by the jvpc command and the functions it traces.
#include "compiler/cli/flags.h"

#include "ir/graph.h"
#include "ir/io/files.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <unistd.h>

namespace jvpc::flags {

std::optional<int64_t> parse_whole_number(const std::string& s) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != s.size()) return std::nullopt;
  return v;
}

CLI::Validator whole_number(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        std::optional<int64_t> v = parse_whole_number(s);
        if (!v || *v < lo || *v > hi)
          return "must be a whole number from " + std::to_string(lo) +
                 (hi == std::numeric_limits<int64_t>::max() ? " up" : " to " + std::to_string(hi)) + ", not '" + s +
                 "'";
        return "";
      },
      hi == std::numeric_limits<int64_t>::max() && lo == 1 ? "POSITIVE" : "INT");
}

namespace {
CLI::Validator real_number(bool non_negative) {
  return CLI::Validator(
      [non_negative](std::string& s) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::out_of_range&) {  // underflow (1e-320) is a number; overflow is not finite
          v = std::strtod(s.c_str(), nullptr);
          used = s.size();
        } catch (const std::exception&) {
          used = std::string::npos;
        }
        if (used != s.size() || !std::isfinite(v)) return "must be a finite number, not '" + s + "'";
        if (non_negative && v < 0) return "must be 0 or more, not '" + s + "'";
        return "";
      },
      non_negative ? "NONNEGATIVE" : "");
}
}  // namespace

const CLI::Validator kPositive = whole_number(1, std::numeric_limits<int64_t>::max());
const CLI::Validator kSeed = whole_number(0, 4294967295LL);
const CLI::Validator kFinite = real_number(false);
const CLI::Validator kNonNegative = real_number(true);
const CLI::Validator kFileName(
    [](std::string& s) -> std::string {
      if (s.empty()) return "expects a file name, not ''";
      // Checked before any work: a file that cannot be written fails now, not after the run.
      try {
        check_destination(s);  // a folder that exists, and no directory, FIFO or device in the way
      } catch (const Error& e) {
        return e.what();
      }
      std::filesystem::path dir = std::filesystem::path(s).parent_path();
      if (dir.empty()) dir = ".";
      if (access(dir.c_str(), W_OK) != 0)
        return "cannot write " + quoted_path(s) + ": directory " + quoted_path(dir.string()) + " is not writable";
      return "";
    },
    "FILE");

}  // namespace jvpc::flags
