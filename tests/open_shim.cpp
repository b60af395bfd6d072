// An LD_PRELOAD library for tests/open_test.sh: appends the path of every open, open64, openat,
// openat64 (and their _FORTIFY_SOURCE forms __open_2, ...), fopen and fopen64 call to the file
// named by $JVPC_OPEN_LOG, one per line, then forwards the call to the next definition
// (dlsym(RTLD_NEXT)). A path relative to a directory descriptor other than AT_FDCWD is logged
// as "<fd N>/path". The dynamic loader's own opens (shared libraries) do not go through these
// functions and are not logged.
#undef _FORTIFY_SOURCE  // glibc's fortified open() is an inline wrapper that could not be defined here
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

void log_open(int dirfd, const char* path) {
  const char* log = getenv("JVPC_OPEN_LOG");
  if (!log || !path) return;
  // The log is opened by a raw system call: it is not logged itself, and nothing here re-enters
  // the functions this library defines.
  int fd = static_cast<int>(syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (fd < 0) return;
  char line[8192];
  int n = dirfd == AT_FDCWD || path[0] == '/' ? snprintf(line, sizeof line, "%s\n", path)
                                              : snprintf(line, sizeof line, "<fd %d>/%s\n", dirfd, path);
  if (n > 0) {
    // One write(2) with O_APPEND: lines from several threads do not interleave.
    ssize_t ignored =
        syscall(SYS_write, fd, line, static_cast<size_t>(n < static_cast<int>(sizeof line) ? n : sizeof line - 1));
    (void)ignored;
  }
  syscall(SYS_close, fd);
}

template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

bool takes_mode(int flags) { return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE; }

}  // namespace

#define JVPC_MODE_ARG(flags)   \
  mode_t mode = 0;             \
  if (takes_mode(flags)) {     \
    va_list ap;                \
    va_start(ap, flags);       \
    mode = va_arg(ap, mode_t); \
    va_end(ap);                \
  }

extern "C" {

int open(const char* path, int flags, ...) {
  JVPC_MODE_ARG(flags)
  log_open(AT_FDCWD, path);
  static auto real = next<int (*)(const char*, int, ...)>("open");
  return real(path, flags, mode);
}
int open64(const char* path, int flags, ...) {
  JVPC_MODE_ARG(flags)
  log_open(AT_FDCWD, path);
  static auto real = next<int (*)(const char*, int, ...)>("open64");
  return real(path, flags, mode);
}
int openat(int dirfd, const char* path, int flags, ...) {
  JVPC_MODE_ARG(flags)
  log_open(dirfd, path);
  static auto real = next<int (*)(int, const char*, int, ...)>("openat");
  return real(dirfd, path, flags, mode);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  JVPC_MODE_ARG(flags)
  log_open(dirfd, path);
  static auto real = next<int (*)(int, const char*, int, ...)>("openat64");
  return real(dirfd, path, flags, mode);
}
int __open_2(const char* path, int flags) {
  log_open(AT_FDCWD, path);
  static auto real = next<int (*)(const char*, int)>("__open_2");
  return real(path, flags);
}
int __open64_2(const char* path, int flags) {
  log_open(AT_FDCWD, path);
  static auto real = next<int (*)(const char*, int)>("__open64_2");
  return real(path, flags);
}
int __openat_2(int dirfd, const char* path, int flags) {
  log_open(dirfd, path);
  static auto real = next<int (*)(int, const char*, int)>("__openat_2");
  return real(dirfd, path, flags);
}
int __openat64_2(int dirfd, const char* path, int flags) {
  log_open(dirfd, path);
  static auto real = next<int (*)(int, const char*, int)>("__openat64_2");
  return real(dirfd, path, flags);
}
FILE* fopen(const char* path, const char* mode) {
  log_open(AT_FDCWD, path);
  static auto real = next<FILE* (*)(const char*, const char*)>("fopen");
  return real(path, mode);
}
FILE* fopen64(const char* path, const char* mode) {
  log_open(AT_FDCWD, path);
  static auto real = next<FILE* (*)(const char*, const char*)>("fopen64");
  return real(path, mode);
}

}  // extern "C"
