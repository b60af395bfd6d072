// Reading and writing the files jvpc is given: graph files, constants and inputs files, reports.
//
// A path may come from a stranger (a graph file's "constants_file") or from a user's shell, so
// every read opens without blocking and checks the open descriptor before reading anything: a
// FIFO, a device or a directory is refused at once, and a file past its size limit is refused from
// its size alone. Every write goes to a temporary file beside the destination, is flushed to disk
// and checked at close, and is renamed into place: a failed write leaves the previous file as it
// was and no partial file behind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace jvpc {

/// `path` as it may appear in a one-line error: bytes below 0x20 and 0x7f as `\xNN`.
std::string printable_path(const std::string& path);
/// printable_path() in single quotes: `'x.json'`.
std::string quoted_path(const std::string& path);

/// A regular file open for reading. Opening refuses anything else (a directory, a FIFO, a
/// device) in one line, without blocking and before a byte is read; `what` names the file in
/// errors ("graph file 'x.json' is not a regular file (a FIFO)").
class RegularFile {
 public:
  RegularFile(const std::string& path, const std::string& what);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  /// The size fstat gave when the file was opened.
  int64_t size() const { return size_; }
  /// Reads up to `n` bytes at `offset` into `out`; fewer only at the end of the file.
  size_t read(int64_t offset, void* out, size_t n);
  /// "graph file 'x.json'", for errors.
  const std::string& named() const { return named_; }

 private:
  std::string named_;
  int fd_ = -1;
  int64_t size_ = 0;
};

/// The whole of a regular file of at most `limit` bytes: RegularFile's checks, and a file larger
/// than `limit` is refused by its size before anything is read.
std::string read_regular_file(const std::string& path, const std::string& what, int64_t limit);

/// `name`, a file beside `path` (in the folder that holds it), confined to that folder: a plain
/// file name (not empty, no '/', not "." or "..", no control characters), and if it is a symlink,
/// one that leads to a file in the same folder. Returns the path to open; `what` names the file in
/// errors ("constants file").
std::string confined_file_beside(const std::string& path, const std::string& name, const std::string& what);

/// Refuses a destination that exists and is neither a regular file nor a symlink to one (a
/// directory, a FIFO, /dev/null), and one in a folder that does not exist. Nothing is written.
void check_destination(const std::string& path);

/// A file written whole or not at all. The constructor checks the destination (check_destination)
/// and creates a temporary file in its folder; write() appends to it; commit() flushes it to disk,
/// closes it and renames it over the destination (a symlink there is replaced, not written
/// through). Every failure is a one-line error with the reason ("cannot write 'x.json': No space
/// left on device"); the temporary file is removed on failure and by the destructor if commit()
/// was not reached. A file-size limit (RLIMIT_FSIZE) is such an error too: the first AtomicFile
/// sets SIGXFSZ to be ignored, unless the process has a handler of its own for it.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  /// Flushes the data to disk and closes the temporary file, checked; the destination is unchanged.
  /// commit() calls it if it was not called: call it first to finish several files before any of
  /// them replaces its destination.
  void finish();
  /// finish(), then renames the temporary file into place.
  void commit();
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(int err);
  void discard();

  std::string path_, temp_;
  int fd_ = -1;
  int live_slot_ = -1;  ///< where remove_temporary_files_on_signals() finds temp_
  bool finished_ = false, committed_ = false;
};

/// For a command-line program: SIGINT, SIGTERM and SIGHUP, where their default action is in
/// place, first remove the temporary files of the AtomicFiles being written (a Ctrl-C during
/// `jvpc linearize -o` leaves no hidden file behind), then end the process as the signal would.
/// A library leaves the process's signals alone: it does not call this.
void remove_temporary_files_on_signals();

/// An advisory lock (flock(2)) on the folder that holds `path`, held while the object lives:
/// exclusive while a writer replaces files that belong together (a graph file and its constants
/// file), shared while a reader reads them. Writers of the same folder then replace their pairs
/// one after the other, and a reader never gets half of one pair and half of another. Where the
/// folder cannot be opened for reading or its file system has no locks, nothing is locked.
class FolderLock {
 public:
  FolderLock(const std::string& path, bool exclusive);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

/// Writes `contents` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace jvpc
