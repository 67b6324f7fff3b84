// POSIX file primitives for checkpoints: reads and writes that retry short counts and EINTR, and
// AtomicFile, the replace-on-commit protocol that keeps a crash from ever exposing a partial file:
//   write a temp file in the target's directory → fsync it → rename it over the target → fsync
//   the directory (so the rename itself survives a power loss).
// rename(2) within one directory is atomic, so a reader sees the old file or the new one, never a mix.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace checkpoint::detail {

inline std::string errno_message(int err) { return std::system_category().message(err); }

/// An owned file descriptor; closes on destruction (errors there are ignored: use close()).
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  /// Closes and reports the error: on NFS a failed write may only surface here.
  void close(const std::filesystem::path& path) {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) {
      throw CheckpointError(fmt::format("closing '{}' failed: {}", path.string(), errno_message(errno)));
    }
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

inline FileDescriptor open_for_reading(const std::filesystem::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    throw CheckpointError(fmt::format("cannot open checkpoint file '{}': {}", path.string(), errno_message(errno)));
  }
  return FileDescriptor(fd);
}

inline std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw CheckpointError(fmt::format("cannot stat '{}': {}", path.string(), errno_message(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("'{}' is not a regular file", path.string()));
  return static_cast<std::uint64_t>(st.st_size);
}

/// Reads exactly `out.size()` bytes at `offset`; a short file is a CheckpointError naming `what`.
inline void read_exact(const FileDescriptor& fd, std::span<std::byte> out, std::uint64_t offset,
                       const std::filesystem::path& path, std::string_view what) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("reading {} from '{}' failed: {}", what, path.string(), errno_message(errno)));
    }
    if (n == 0) {
      throw CheckpointError(fmt::format("'{}' ended after {} of the {} bytes of {}: the file is truncated",
                                        path.string(), done, out.size(), what));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void write_all(const FileDescriptor& fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("writing '{}' failed after {} bytes: {}", path.string(), done,
                                        errno_message(errno)));
    }
    done += static_cast<std::size_t>(n);
  }
}

inline void fsync_or_throw(const FileDescriptor& fd, const std::filesystem::path& path) {
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    throw CheckpointError(fmt::format("fsync of '{}' failed: {}", path.string(), errno_message(errno)));
  }
}

/// Makes a rename or unlink in `dir` durable. Some filesystems cannot fsync a directory (EINVAL);
/// there is nothing more to do on those.
inline void fsync_directory(const std::filesystem::path& dir) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  FileDescriptor fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw CheckpointError(fmt::format("cannot open directory '{}': {}", d.string(), errno_message(errno)));
  while (::fsync(fd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) return;
    throw CheckpointError(fmt::format("fsync of directory '{}' failed: {}", d.string(), errno_message(errno)));
  }
}

inline const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("localhost");
    std::string s(buf);
    for (char& c : s) {
      if (c == '/' || c == ' ') c = '_';
    }
    return s.empty() ? std::string("localhost") : s;
  }();
  return name;
}

// Temp files are named ".<target>.tmp.<host>.<pid>.<seq>": hidden, next to the target (rename
// must not cross filesystems), and attributable, so that leftovers of a killed writer can be
// recognised and removed without touching a live writer's file.
inline std::string temp_prefix(const std::filesystem::path& target) {
  return "." + target.filename().string() + ".tmp.";
}


/// The file name a temp file was made for, when `name` is a temp file of a writer on this host
/// whose process no longer exists (killed mid-save); nothing otherwise.
inline std::optional<std::string> stale_temp_target(const std::string& name) {
  // .<target>.tmp.<host>.<pid>.<seq>; the host and the target may contain dots, so match from the right.
  const std::string marker = ".tmp." + host_name() + ".";
  const auto seq_dot = name.rfind('.');
  if (name.size() < 2 || name.front() != '.' || seq_dot == std::string::npos || seq_dot == 0) return std::nullopt;
  const auto pid_dot = name.rfind('.', seq_dot - 1);
  if (pid_dot == std::string::npos || pid_dot + 1 < marker.size()) return std::nullopt;
  const auto marker_at = pid_dot + 1 - marker.size();
  if (marker_at < 1 || name.compare(marker_at, marker.size(), marker) != 0) return std::nullopt;
  long long pid = 0;
  const char* first = name.data() + pid_dot + 1;
  const char* last = name.data() + seq_dot;
  auto [ptr, err] = std::from_chars(first, last, pid);
  if (err != std::errc{} || ptr != last || pid <= 0) return std::nullopt;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return std::nullopt;  // alive (or not ours to judge)
  return name.substr(1, marker_at - 1);
}

/// Removes, from `dir`, the temp files of dead writers on this host whose target satisfies
/// `is_target`. Best effort: a file that cannot be removed is left alone.
template <class Pred>
void remove_stale_temp_files(const std::filesystem::path& dir, Pred&& is_target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (auto target = stale_temp_target(it->path().filename().string()); target && is_target(*target)) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

/// A file that appears at `target` only on commit(), complete and durable; destroyed without a
/// commit (an exception, an early return) it removes its temp file and leaves `target` as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target, bool durable = true)
      : target_(std::move(target)), durable_(durable) {
    const std::string filename = target_.filename().string();
    remove_stale_temp_files(target_.parent_path(), [&](const std::string& t) { return t == filename; });
    static std::atomic<std::uint64_t> sequence{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      temp_ = target_.parent_path() / fmt::format("{}{}.{}.{}", temp_prefix(target_), host_name(),
                                                  static_cast<long long>(::getpid()), sequence.fetch_add(1));
      int fd;
      do {
        fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      } while (fd < 0 && errno == EINTR);
      if (fd >= 0) {
        fd_ = FileDescriptor(fd);
        return;
      }
      if (errno != EEXIST) {
        throw CheckpointError(fmt::format("cannot create a temporary file next to '{}' ({}): {}", target_.string(),
                                          temp_.string(), errno_message(errno)));
      }
    }
    throw CheckpointError(fmt::format("cannot create a unique temporary file next to '{}'", target_.string()));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (!committed_) {
      fd_ = FileDescriptor();
      ::unlink(temp_.c_str());
    }
  }

  void write(std::span<const std::byte> bytes) { write_all(fd_, bytes, temp_); }

  /// fsync → close → rename over the target → fsync the directory.
  void commit() {
    if (durable_) fsync_or_throw(fd_, temp_);
    fd_.close(temp_);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", temp_.string(), target_.string(),
                                        errno_message(errno)));
    }
    committed_ = true;
    if (durable_) fsync_directory(target_.parent_path());
  }

  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  FileDescriptor fd_;
  bool durable_;
  bool committed_ = false;
};

}  // namespace checkpoint::detail

DISTRIBUTE_END_NAMESPACE
