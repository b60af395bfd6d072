// Files and paths: reads that refuse what is not a regular file before reading, constants files
// confined to the graph file's folder, atomic and checked writes, and paths in errors that cannot
// reach a terminal raw.
#include "ir/io/files.h"
#include "ir/io/graph_files.h"
#include "ir/io/json_text.h"
#include "ir/io/safetensors.h"
#include "compiler/trace/tracer.h"
#include "tests/helpers.h"
#include "tests/temp_files.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

namespace jvpc {
namespace {

using nlohmann::json;
// A fresh folder of the running test alone, removed at the end.
struct Folder {
  std::string path;  // with a trailing '/'
  Folder() {
    std::string tmpl = test::temp_path("XXXXXX");
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl + "/";
  }
  ~Folder() { test::remove_tree(path); }
  std::string operator/(const std::string& name) const { return path + name; }
  /// The names in the folder, sorted (temporary files included: they start with '.').
  std::set<std::string> names() const {
    std::set<std::string> out;
    DIR* dir = ::opendir(path.c_str());
    for (struct dirent* e; dir && (e = ::readdir(dir));)
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.insert(e->d_name);
    if (dir) ::closedir(dir);
    return out;
  }
};

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
void copy_file(const std::string& from, const std::string& to) { write_text(to, bytes_of(from)); }
void make_folder(const std::string& path) { ASSERT_EQ(::mkdir(path.c_str(), 0700), 0) << path; }
void make_symlink(const std::string& target, const std::string& link) {
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << link;
}
bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// A traced x * c + 1 whose captured constant c has `n` elements (value `v` + its index).
std::unique_ptr<Graph> small_graph(int64_t n, float v = 0) {
  at::Tensor c = at::arange(n, at::kFloat) + v;
  Trace t = trace([c](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{x[0] * c + 1}; },
                  {{"x", at::ones({n})}});
  return std::move(t.graph);
}

// The graph file's JSON with "constants_file" set to `name`, saved as `path`.
void with_constants_file(const std::string& from, const std::string& path, const std::string& name) {
  std::ifstream f(from);
  json j = json::parse(f);
  j["constants_file"] = name;
  write_text(path, j.dump());
}

// Runs f in a child process whose file-size limit (RLIMIT_FSIZE) is `limit` bytes (f must not
// run parallel kernels: the thread pool of the parent is not in the child). Returns
// "error: " and the message f threw, "no error", or how the child died (SIGXFSZ kills a process
// that does not ignore it).
std::string under_file_size_limit(rlim_t limit, const std::function<void()>& f) {
  int p[2];
  if (::pipe(p) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    ::alarm(60);  // a hang in the child ends as "killed by signal 14"
    struct rlimit r {};
    ::getrlimit(RLIMIT_FSIZE, &r);
    r.rlim_cur = limit;
    ::setrlimit(RLIMIT_FSIZE, &r);
    std::string msg = "no error";
    try {
      f();
    } catch (const std::exception& e) {
      msg = std::string("error: ") + e.what();
    }
    ssize_t ignored = ::write(p[1], msg.data(), msg.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(p[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return msg;
}

void expect_one_line_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error (expected: " << fragment << ")";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// --- reading --------------------------------------------------------------------------------

// std::ifstream waited for a writer forever: `jvpc show fifo.json` hung.
TEST(Files, AFifoAsGraphFileIsRefusedAtOnce) {
  Folder d;
  ASSERT_EQ(::mkfifo((d / "g.json").c_str(), 0600), 0);
  expect_one_line_error([&] { load(d / "g.json"); },
                        "graph file '" + d.path + "g.json' is not a regular file (a FIFO)");
}

TEST(Files, AFifoAsConstantsFileIsRefusedAtOnce) {
  Folder d;
  save(*small_graph(6), d / "g.json");
  ASSERT_EQ(::unlink((d / "g.safetensors").c_str()), 0);
  ASSERT_EQ(::mkfifo((d / "g.safetensors").c_str(), 0600), 0);
  expect_one_line_error([&] { load(d / "g.json"); },
                        "constants file '" + d.path + "g.safetensors' is not a regular file (a FIFO)");
}

TEST(Files, DevicesAndDirectoriesAreRefusedBeforeReading) {
  Folder d;
  expect_one_line_error([&] { read_regular_file("/dev/zero", "inputs file", 1 << 20); },
                        "inputs file '/dev/zero' is not a regular file (a character device)");
  expect_one_line_error([&] { read_regular_file(d.path, "graph file", 1 << 20); }, "is a directory");
  expect_one_line_error([&] { read_regular_file(d / "none", "graph file", 1 << 20); },
                        "cannot read graph file '" + d.path + "none': No such file or directory");
}

// The limit is checked from the file's size, before anything is read (a sparse file of 4 GiB).
TEST(Files, AFileOverTheLimitIsRefusedByItsSize) {
  Folder d;
  int fd = ::open((d / "big").c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t{4} << 30), 0);
  ::close(fd);
  expect_one_line_error([&] { read_regular_file(d / "big", "graph file", 1000); }, "is larger than 1000 bytes");
  RegularFile f(d / "big", "graph file");
  EXPECT_EQ(f.size(), int64_t{4} << 30);
  char buf[4] = {1, 1, 1, 1};
  EXPECT_EQ(f.read((int64_t{4} << 30) - 2, buf, 4), 2u);  // fewer bytes only at the end
  EXPECT_EQ(buf[0], 0);
}

// --- constants_file -------------------------------------------------------------------------

// constants_file was opened wherever it pointed (an absolute path, ../../etc/passwd), and an
// error printed the file's first 8 bytes as a number.
TEST(Files, ConstantsFileMustBeAPlainNameInTheGraphsFolder) {
  Folder d;
  make_folder(d / "inner");
  save(*small_graph(6), d / "inner/g.json");
  write_text(d / "outside.safetensors", "SECRETS!SECRETS!");
  for (std::string name :
       {d / "outside.safetensors", std::string("../outside.safetensors"), std::string("sub/g.safetensors"),
        std::string(""), std::string(".."), std::string("."), std::string("g\n.safetensors"),
        std::string("/etc/passwd"), std::string("../../../../../../etc/passwd")}) {
    SCOPED_TRACE(name);
    with_constants_file(d / "inner/g.json", d / "inner/h.json", name);
    try {
      load(d / "inner/h.json");
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("must be a plain file name in the folder of '" + d.path + "inner/h.json'"), std::string::npos)
          << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_EQ(msg.find("SECRETS"), std::string::npos) << msg;
    }
  }
}

TEST(Files, ASymlinkOutOfTheFolderIsRefusedAndOneInsideIsAllowed) {
  Folder d;
  make_folder(d / "inner");
  save(*small_graph(6), d / "inner/g.json");
  copy_file(d / "inner/g.safetensors", d / "outside.safetensors");
  // Out of the folder: to the file above, and through a second link that stays inside first.
  make_symlink("../outside.safetensors", d / "inner/out.safetensors");
  make_symlink("out.safetensors", d / "inner/via.safetensors");
  for (std::string name : {"out.safetensors", "via.safetensors"}) {
    with_constants_file(d / "inner/g.json", d / "inner/h.json", name);
    expect_one_line_error([&] { load(d / "inner/h.json"); }, "constants file '" + d.path + "inner/" + name +
                                                                 "' is a symlink that leads out of the folder of '" +
                                                                 d.path + "inner/h.json'");
  }
  // Into a subfolder is out of the folder too.
  make_folder(d / "inner/sub");
  copy_file(d / "inner/g.safetensors", d / "inner/sub/c.safetensors");
  make_symlink("sub/c.safetensors", d / "inner/down.safetensors");
  with_constants_file(d / "inner/g.json", d / "inner/h.json", "down.safetensors");
  expect_one_line_error([&] { load(d / "inner/h.json"); }, "is a symlink that leads out of the folder");
  // Inside the folder: allowed, and the graph's folder may be named relative or through a link.
  make_symlink("g.safetensors", d / "inner/in.safetensors");
  with_constants_file(d / "inner/g.json", d / "inner/h.json", "in.safetensors");
  EXPECT_TRUE(load(d / "inner/h.json")->inputs()[1].data.equal(at::arange(6, at::kFloat)));
  make_symlink("inner", d / "alias");
  EXPECT_TRUE(load(d / "alias/h.json")->inputs()[1].data.equal(at::arange(6, at::kFloat)));
}

// --- writing --------------------------------------------------------------------------------

// A directory, FIFO or device as a destination is refused before anything is written (opening
// /dev/full or a FIFO for writing would lose the data or block).
TEST(Files, DestinationsThatAreNotRegularFilesAreRefusedBeforeWriting) {
  Folder d;
  auto g = small_graph(6);
  make_folder(d / "dir.json");
  ASSERT_EQ(::mkfifo((d / "fifo.json").c_str(), 0600), 0);
  make_symlink("dir.json", d / "link.json");
  std::set<std::string> before = d.names();
  expect_one_line_error([&] { save(*g, d / "dir.json"); },
                        "cannot write '" + d.path + "dir.json': it is a directory, not a regular file");
  expect_one_line_error([&] { save(*g, d / "fifo.json"); },
                        "cannot write '" + d.path + "fifo.json': it is a FIFO, not a regular file");
  expect_one_line_error([&] { save(*g, d / "link.json"); }, "it is a symlink to a directory, not to a regular file");
  expect_one_line_error([&] { write_file_atomically("/dev/null", "x"); },
                        "cannot write '/dev/null': it is a character device");
  expect_one_line_error([&] { write_safetensors(d / "fifo.json", {}); }, "it is a FIFO");
  // The constants file's destination is checked before the graph file's temporary is made.
  make_folder(d / "pair.safetensors");
  before = d.names();
  expect_one_line_error([&] { save(*g, d / "pair.json"); },
                        "cannot write '" + d.path + "pair.safetensors': it is a directory");
  EXPECT_EQ(d.names(), before);
  expect_one_line_error([&] { check_destination(d / "no/x.json"); }, "no directory '" + d.path + "no'");
}

// Renaming replaces a symlink; the file it pointed to is untouched.
TEST(Files, ASymlinkDestinationIsReplacedNotWrittenThrough) {
  Folder d;
  write_text(d / "target.json", "the target's own bytes");
  make_symlink("target.json", d / "g.json");
  save(*small_graph(6), d / "g.json");
  EXPECT_EQ(bytes_of(d / "target.json"), "the target's own bytes");
  EXPECT_FALSE(is_symlink(d / "g.json"));
  EXPECT_TRUE(load(d / "g.json")->inputs()[1].data.equal(at::arange(6, at::kFloat)));
  EXPECT_EQ(d.names(), (std::set<std::string>{"g.json", "g.safetensors", "target.json"}));
}

TEST(Files, AReplacedFileKeepsItsPermissions) {
  Folder d;
  write_text(d / "g.json", "old");
  ASSERT_EQ(::chmod((d / "g.json").c_str(), 0640), 0);
  write_file_atomically(d / "g.json", "new");
  struct stat st {};
  ASSERT_EQ(::stat((d / "g.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(bytes_of(d / "g.json"), "new");
}

// A file-size limit (as a full disk would) in the middle of a save: a one-line error with the
// reason (not exit 0 with the data gone, nor a process killed by SIGXFSZ), the previous files
// byte for byte, and no temporary file left.
TEST(Files, AFailedWriteLeavesThePreviousFilesAndNoTemporary) {
  Folder d;
  save(*small_graph(6), d / "g.json");
  write_safetensors(d / "t.safetensors", {{"t", at::ones({4})}});
  write_file_atomically(d / "r.json", "{}\n");
  const std::set<std::string> names = d.names();
  std::map<std::string, std::string> before;
  for (const std::string& n : names) before[n] = bytes_of(d / n);
  auto big = small_graph(100000, 7);  // 400 KB of constants
  auto expect_unchanged = [&] {
    EXPECT_EQ(d.names(), names);
    for (const auto& [n, b] : before) EXPECT_EQ(bytes_of(d / n), b) << n;
  };
  std::string msg = under_file_size_limit(64 << 10, [&] { save(*big, d / "g.json"); });
  EXPECT_EQ(msg, "error: cannot write '" + d.path + "g.safetensors': File too large");
  expect_unchanged();
  at::Tensor ones = at::ones({100000});  // made here: the child must not start LibTorch's thread pool
  msg = under_file_size_limit(64 << 10, [&] { write_safetensors(d / "t.safetensors", {{"t", ones}}); });
  EXPECT_EQ(msg, "error: cannot write '" + d.path + "t.safetensors': File too large");
  expect_unchanged();
  msg = under_file_size_limit(1 << 10, [&] { write_file_atomically(d / "r.json", std::string(5000, ' ')); });
  EXPECT_EQ(msg, "error: cannot write '" + d.path + "r.json': File too large");
  expect_unchanged();
}

// The graph file fails after its constants were written in full: the constants file must not
// have replaced the previous one, or the pair on disk would not match.
TEST(Files, AGraphFileThatFailsLeavesThePreviousConstantsFile) {
  Folder d;
  save(*small_graph(6, 1), d / "g.json");
  std::string graph = bytes_of(d / "g.json"), constants = bytes_of(d / "g.safetensors");
  ASSERT_LT(constants.size(), 400u);
  ASSERT_GT(graph.size(), 600u);
  std::string msg = under_file_size_limit(500, [&] { save(*small_graph(6, 2), d / "g.json"); });
  EXPECT_EQ(msg, "error: cannot write '" + d.path + "g.json': File too large");
  EXPECT_EQ(bytes_of(d / "g.json"), graph);
  EXPECT_EQ(bytes_of(d / "g.safetensors"), constants);
  EXPECT_EQ(d.names(), (std::set<std::string>{"g.json", "g.safetensors"}));
  EXPECT_TRUE(load(d / "g.json")->inputs()[1].data.equal(at::arange(6, at::kFloat) + 1));
}

// Four processes saving to one path at once: the graph file and constants file on disk are
// always from one save, and a process loading meanwhile always reads a pair (before the folder
// lock, one round in six left a graph file and a constants file from different saves).
TEST(Files, ProcessesSavingToOnePathLeaveAPair) {
  Folder d;
  std::vector<std::unique_ptr<Graph>> graphs;
  for (int k = 0; k < 4; ++k) graphs.push_back(small_graph(64, static_cast<float>(k)));
  save(*graphs[0], d / "g.json");
  for (int round = 0; round < 6; ++round) {
    std::vector<pid_t> writers;
    for (int k = 0; k < 4; ++k) {
      pid_t pid = ::fork();
      if (pid == 0) {
        ::alarm(60);
        try {
          for (int i = 0; i < 20; ++i) save(*graphs[static_cast<size_t>(k)], d / "g.json");
        } catch (...) {
          ::_exit(1);
        }
        ::_exit(0);
      }
      writers.push_back(pid);
    }
    for (int i = 0; i < 20; ++i) EXPECT_NO_THROW(load(d / "g.json")) << "round " << round;
    for (pid_t pid : writers) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a writer failed";
    }
    at::Tensor c = load(d / "g.json")->inputs()[1].data;
    EXPECT_TRUE(at::equal(c - c[0], at::arange(64, at::kFloat))) << "round " << round;
    EXPECT_EQ(d.names(), (std::set<std::string>{"g.json", "g.safetensors"}));  // no temporary left
  }
}

// --- paths in errors ------------------------------------------------------------------------

TEST(Files, ControlCharactersInPathsAreEscapedInErrors) {
  EXPECT_EQ(printable_path("a\x1b[31mb\n\x7f\tc"), "a\\x1b[31mb\\x0a\\x7f\\x09c");
  EXPECT_EQ(quoted_path("x.json"), "'x.json'");
  Folder d;
  std::string name = d / "a\x1b[31m\nb.json";
  for (const auto& f :
       std::vector<std::function<void()>>{[&] { load(name); }, [&] { read_safetensors(name, "inputs file"); },
                                          [&] { write_file_atomically(d / "no\n/x.json", "x"); }}) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.find_first_of("\n\x1b"), std::string::npos) << msg;
      EXPECT_NE(msg.find("\\x0a"), std::string::npos) << msg;
    }
  }
  // A graph file whose name has control characters: the loader's own messages escape it too.
  write_text(name, "{");
  expect_one_line_error([&] { load(name); }, d.path + "a\\x1b[31m\\x0ab.json: invalid JSON");
}

}  // namespace
}  // namespace jvpc
