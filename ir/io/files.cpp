// Checked reads and atomic writes of whole files, on POSIX calls: open(2) without blocking and
// fstat(2) of the open descriptor before reading; a temporary file, fsync(2), close(2) and
// rename(2) for writing.
#include "ir/io/files.h"

#include "ir/graph.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <system_error>

namespace jvpc {

namespace {

std::string reason(int err) { return std::system_category().message(err); }

std::string folder_of(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? "" : path.substr(0, p + 1);
}
std::string base_of(const std::string& path) {
  auto p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}

// What a file that is not a regular one is, for errors.
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

// The message for a file that is not regular: "graph file 'x' is a directory" keeps the wording
// older jvpc gave for directories; anything else "is not a regular file (a FIFO)".
[[noreturn]] void refuse_not_regular(const std::string& named, mode_t mode) {
  if (S_ISDIR(mode)) throw Error(named + " is a directory");
  throw Error(named + " is not a regular file (" + kind_of(mode) + ")");
}

struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// A file-size limit (RLIMIT_FSIZE) kills the process with SIGXFSZ unless it is ignored; ignored,
// write(2) fails with EFBIG, which the writer reports. A handler the process installed itself is
// left alone.
void ignore_sigxfsz_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGXFSZ, nullptr, &old) != 0) return;
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGXFSZ, &ignore, nullptr);
  });
}

// The temporary files being written, for a signal handler to remove: fixed slots of paths, each
// claimed, filled and then marked live, so that the handler reads only whole paths and calls only
// unlink(2), which is async-signal-safe.
constexpr int kLiveSlots = 64;
constexpr size_t kLivePathMax = 4096;
char g_live_path[kLiveSlots][kLivePathMax];
std::atomic<int> g_live_state[kLiveSlots];  // 0 free, 1 being filled, 2 live

int track_temporary(const std::string& path) {
  if (path.size() >= kLivePathMax) return -1;
  for (int i = 0; i < kLiveSlots; ++i) {
    int free = 0;
    if (!g_live_state[i].compare_exchange_strong(free, 1)) continue;
    std::copy(path.begin(), path.end(), g_live_path[i]);
    g_live_path[i][path.size()] = '\0';
    g_live_state[i].store(2);
    return i;
  }
  return -1;  // more files at once than slots: that one is not removed on a signal
}

void untrack_temporary(int slot) {
  if (slot >= 0) g_live_state[slot].store(0);
}

extern "C" void remove_temporaries_and_die(int sig) {
  for (int i = 0; i < kLiveSlots; ++i)
    if (g_live_state[i].load() == 2) ::unlink(g_live_path[i]);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Six characters that make a temporary file's name unlikely to exist already (O_EXCL retries
// if it does).
std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  uint64_t x = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (counter.fetch_add(1) << 40);
  x ^= x >> 31;  // splitmix64's finalizer
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string s;
  for (int i = 0; i < 6; ++i, x /= 36) s += digits[x % 36];
  return s;
}

}  // namespace

std::string printable_path(const std::string& path) {
  std::string out;
  out.reserve(path.size());
  for (unsigned char ch : path) {
    if (ch < 0x20 || ch == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[ch >> 4];
      out += hex[ch & 15];
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

std::string quoted_path(const std::string& path) { return "'" + printable_path(path) + "'"; }

// --- reading --------------------------------------------------------------------------------

RegularFile::RegularFile(const std::string& path, const std::string& what) : named_(what + " " + quoted_path(path)) {
  struct stat st {};
  // Checked by name before opening as well: opening some devices does something by itself.
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) refuse_not_regular(named_, st.st_mode);
  // O_NONBLOCK: a FIFO put there after the check opens at once instead of waiting for a writer,
  // and is refused by fstat below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) throw Error("cannot read " + named_ + ": " + reason(errno));
  Descriptor guard{fd_};
  if (::fstat(fd_, &st) != 0) throw Error("cannot read " + named_ + ": " + reason(errno));
  if (!S_ISREG(st.st_mode)) refuse_not_regular(named_, st.st_mode);
  size_ = static_cast<int64_t>(st.st_size);
  guard.fd = -1;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t RegularFile::read(int64_t offset, void* out, size_t n) {
  char* p = static_cast<char*>(out);
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::pread(fd_, p + got, std::min<size_t>(n - got, size_t{1} << 30),
                        static_cast<off_t>(offset) + static_cast<off_t>(got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw Error("error reading " + named_ + ": " + reason(errno));
    if (k == 0) break;  // the end of the file
    got += static_cast<size_t>(k);
  }
  return got;
}

std::string read_regular_file(const std::string& path, const std::string& what, int64_t limit) {
  RegularFile f(path, what);
  if (f.size() > limit) throw Error(f.named() + " is larger than " + std::to_string(limit) + " bytes");
  std::string out(static_cast<size_t>(f.size()), '\0');
  out.resize(f.read(0, out.data(), out.size()));  // shorter if the file shrank since it was opened
  return out;
}

std::string confined_file_beside(const std::string& path, const std::string& name, const std::string& what) {
  const std::string folder = folder_of(path);
  bool plain = !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
               std::none_of(name.begin(), name.end(),
                            [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; });
  if (!plain)
    throw Error(what + " " + quoted_path(name) + " must be a plain file name in the folder of " + quoted_path(path) +
                " (no '/', not '.' or '..', no control characters)");
  std::string file = folder + name;
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return file;  // reading reports what is wrong
  // A symlink: it must lead to a file in the same folder.
  char resolved[PATH_MAX], resolved_folder[PATH_MAX];
  if (!::realpath(file.c_str(), resolved))
    throw Error("cannot read " + what + " " + quoted_path(file) + ": " + reason(errno));
  if (!::realpath(folder.empty() ? "." : folder.c_str(), resolved_folder))
    throw Error("cannot read " + what + " " + quoted_path(file) + ": " + reason(errno));
  std::string target = resolved, home = resolved_folder;
  if (home.back() != '/') home += '/';
  if (folder_of(target) != home)
    throw Error(what + " " + quoted_path(file) + " is a symlink that leads out of the folder of " + quoted_path(path));
  return file;
}

// --- writing --------------------------------------------------------------------------------

void check_destination(const std::string& path) {
  const std::string named = "cannot write " + quoted_path(path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) throw Error(named + ": " + reason(errno));
    std::string folder = folder_of(path);
    if (folder.empty()) folder = ".";
    if (::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw Error(named + ": no directory " +
                  quoted_path(folder.size() > 1 ? folder.substr(0, folder.size() - 1) : folder));
    return;
  }
  if (S_ISREG(st.st_mode)) return;
  if (!S_ISLNK(st.st_mode)) throw Error(named + ": it is " + kind_of(st.st_mode) + ", not a regular file");
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;  // a symlink to nothing: renaming replaces it
    throw Error(named + ": " + reason(errno));
  }
  if (!S_ISREG(st.st_mode))
    throw Error(named + ": it is a symlink to " + kind_of(st.st_mode) + ", not to a regular file");
}

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  ignore_sigxfsz_once();
  check_destination(path);
  // A file that is replaced keeps its permissions; a new one gets 0666 less the umask, as
  // open(2) gives any new file.
  mode_t mode = 0666;
  struct stat st {};
  bool replacing = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  if (replacing) mode = st.st_mode & 07777;
  // ".x.json.tmp-abc123" beside x.json: the same file system, so that rename(2) is atomic. Built
  // like mkstemp(3)'s names, but created with open(2)'s mode, to which the umask applies.
  std::string base = base_of(path).substr(0, 200);
  for (int attempt = 0;; ++attempt) {
    temp_ = folder_of(path) + "." + base + ".tmp-" + unique_suffix();
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd_ >= 0) {
      live_slot_ = track_temporary(temp_);
      break;
    }
    int err = errno;
    if (err != EEXIST || attempt >= 100) {
      temp_.clear();
      throw Error("cannot write " + quoted_path(path_) + ": " + reason(err));
    }
  }
  if (replacing && ::fchmod(fd_, mode) != 0) fail(errno);
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty() && !committed_) ::unlink(temp_.c_str());
  untrack_temporary(live_slot_);
  live_slot_ = -1;
  temp_.clear();
}

void AtomicFile::fail(int err) {
  discard();
  throw Error("cannot write " + quoted_path(path_) + ": " + reason(err));
}

void AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) throw Error("cannot write " + quoted_path(path_) + ": the file is already closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) fail(errno);
    if (k == 0) fail(EIO);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void AtomicFile::finish() {
  if (finished_) return;
  if (fd_ < 0) throw Error("cannot write " + quoted_path(path_) + ": the file is already closed");
  if (::fsync(fd_) != 0) fail(errno);  // a full disk or a quota may show only here, or at close
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(errno);
  finished_ = true;
}

void AtomicFile::commit() {
  finish();
  if (::rename(temp_.c_str(), path_.c_str()) != 0) fail(errno);
  committed_ = true;
  untrack_temporary(live_slot_);  // after the rename: a signal in between finds no file to remove
  live_slot_ = -1;
  temp_.clear();
  // The rename itself on disk, as far as the file system offers it; the file is in place already.
  std::string folder = folder_of(path_);
  Descriptor dir{::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd >= 0) ::fsync(dir.fd);
}

void remove_temporary_files_on_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
    struct sigaction on {};
    on.sa_handler = remove_temporaries_and_die;
    sigemptyset(&on.sa_mask);
    ::sigaction(sig, &on, nullptr);
  }
}

FolderLock::FolderLock(const std::string& path, bool exclusive) {
  std::string folder = folder_of(path);
  fd_ = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) return;
  while (::flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
    if (errno == EINTR) continue;
    ::close(fd_);  // no locks here (ENOLCK, EOPNOTSUPP): as without the lock
    fd_ = -1;
    return;
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

}  // namespace jvpc
