// Removing what the tests write under test::temp_path names (tests/temp_files.cpp).
#pragma once

#include <string>

namespace jvpc::test {

/// Removes `path` and, if it is a directory, everything below it (links not followed). POSIX
/// calls: libtorch.so exports its own copy of std::filesystem::remove_all, which the dynamic
/// linker may bind and which crashes here.
void remove_tree(const std::string& path);

}  // namespace jvpc::test
