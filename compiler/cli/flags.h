// Validators for numeric and file flags, shared by the jvpc command and the functions it traces. Each rejects a bad
// value with a short message naming it (CLI11's own range validators print DBL_MAX in full).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace jvpc::flags {

/// The whole number `s` spells, all of it, or nothing ("12x", "1e3" and "" are not numbers).
std::optional<int64_t> parse_whole_number(const std::string& s);
/// A whole number from lo to hi.
CLI::Validator whole_number(int64_t lo, int64_t hi);
/// Whole numbers above 0 (sizes).
extern const CLI::Validator kPositive;
/// Seeds: 0 to 2^32 - 1 (the CPU generator keeps 32 bits of its seed).
extern const CLI::Validator kSeed;
/// A finite real number.
extern const CLI::Validator kFinite;
/// A finite real number, 0 or more.
extern const CLI::Validator kNonNegative;
/// A file name to write: not empty, in a directory that exists and is writable (checked when the
/// flags are read, before any work).
extern const CLI::Validator kFileName;

}  // namespace jvpc::flags
