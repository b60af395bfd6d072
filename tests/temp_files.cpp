// The files test::temp_path names (TempDir()/jvpc_<pid>_<test>_<suffix>, and directories made
// from such a name) are this process's alone; they are removed when the test program ends, so
// that runs do not accumulate them.
#include "tests/temp_files.h"

#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace jvpc::test {

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  std::remove(path);
  return 0;
}
}  // namespace

void remove_tree(const std::string& path) { nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

}  // namespace jvpc::test

namespace {

class RemoveTempFiles : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string dir = ::testing::TempDir();
    const std::string prefix = "jvpc_" + std::to_string(getpid()) + "_";
    std::vector<std::string> ours;
    if (DIR* d = opendir(dir.c_str())) {
      while (const dirent* e = readdir(d))
        if (std::string(e->d_name).rfind(prefix, 0) == 0) ours.push_back(dir + e->d_name);
      closedir(d);
    }
    for (const std::string& path : ours) jvpc::test::remove_tree(path);
  }
};

::testing::Environment* const kRemoveTempFiles = ::testing::AddGlobalTestEnvironment(new RemoveTempFiles);

}  // namespace
