// jvpc_filecheck: checks its standard input against the CHECK lines of a file, as LLVM's
// FileCheck does, with the directives tests/filecheck.h knows (CHECK, CHECK-LABEL, CHECK-NEXT,
// CHECK-SAME, CHECK-NOT). The .ir tests (tests/ir/, run by ir_test.sh) use it:
//
//   jvpc opt --passes=cse x.ir | jvpc_filecheck x.ir
//   jvpc opt --passes=dce x.ir | jvpc_filecheck --check-prefix=DCE x.ir
//
// A directive is a line of the file that starts (after "//" and spaces) with the prefix and a
// directive's suffix and a colon; with --check-prefix=P, P: P-NEXT: ... are read as CHECK: ...
#include "tests/filecheck.h"

#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

int main(int argc, char** argv) {
  std::string prefix = "CHECK", path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--check-prefix=", 0) == 0)
      prefix = a.substr(15);
    else if (path.empty() && !a.empty() && a[0] != '-')
      path = a;
    else
      path.clear(), i = argc;
  }
  if (path.empty() || prefix.empty()) {
    std::cerr << "usage: jvpc_filecheck [--check-prefix=PREFIX] FILE < input\n";
    return 2;
  }
  std::ifstream file(path);
  if (!file) {
    std::cerr << "jvpc_filecheck: cannot read " << path << "\n";
    return 2;
  }
  std::string checks;
  for (std::string line; std::getline(file, line);) {
    std::string t = jvpc::test::filecheck_detail::trim(line);
    if (t.rfind("//", 0) != 0) continue;
    t = jvpc::test::filecheck_detail::trim(t.substr(2));
    size_t colon = t.find(':');
    if (colon == std::string::npos || t.compare(0, prefix.size(), prefix) != 0) continue;
    std::string suffix = t.substr(prefix.size(), colon - prefix.size());
    if (suffix == "" || suffix == "-LABEL" || suffix == "-NEXT" || suffix == "-SAME" || suffix == "-NOT")
      checks += "CHECK" + suffix + t.substr(colon) + "\n";
  }
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  ::testing::AssertionResult r = jvpc::test::filecheck(input, checks);
  if (!r) {
    std::cerr << path << ": " << r.message() << "\n";
    return 1;
  }
  return 0;
}
