// distribute-launch's output: each task's stdout and stderr forwarded line by line with its
// "[T:I] " prefix, and the launcher's own notes on stderr.
//
// Lines are forwarded whole (one write each, so tasks never interleave mid-line); a last line
// without a newline is flushed with one when the stream closes. Tasks write to pipes, so their
// stdio is block-buffered unless they flush or set line buffering.
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include <poll.h>
#include <unistd.h>

namespace launch {

inline constexpr std::size_t kMaxForwardedLine = 64 * 1024;  // longer lines are forwarded in pieces

/// Writes all of `data` to `fd`. A standard stream that fails for good (EPIPE: the reader is
/// gone) is dropped, so a closed terminal does not stop the job.
inline void write_all(int fd, std::string_view data) {
  static bool broken[3] = {false, false, false};
  if (fd >= 0 && fd < 3 && broken[fd]) return;
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      if (fd >= 0 && fd < 3) broken[fd] = true;
      return;
    }
  }
}

/// One line on the launcher's stderr, "distribute-launch: ...".
template <typename... Args>
void note(fmt::format_string<Args...> f, Args&&... args) {
  write_all(2, "distribute-launch: " + fmt::format(f, std::forward<Args>(args)...) + "\n");
}

/// The read end of one of a task's output pipes, what it has read of an unfinished line, and
/// where its lines go.
struct Stream {
  int fd = -1;
  int dest = 1;        // the launcher's fd the lines are forwarded to
  std::string prefix;  // "[worker:0] "
  std::string buf;
};

/// Forwards the complete lines in `s.buf` (with `final`, the rest too, ended by a newline).
inline void forward_lines(Stream& s, bool final) {
  std::size_t start = 0;
  std::string chunk;
  for (;;) {
    const auto nl = s.buf.find('\n', start);
    if (nl == std::string::npos) break;
    chunk.append(s.prefix).append(s.buf, start, nl - start + 1);
    start = nl + 1;
  }
  s.buf.erase(0, start);
  while (s.buf.size() >= kMaxForwardedLine) {
    chunk.append(s.prefix).append(s.buf, 0, kMaxForwardedLine).append("\n");
    s.buf.erase(0, kMaxForwardedLine);
  }
  if (final && !s.buf.empty()) {
    chunk.append(s.prefix).append(s.buf).append("\n");
    s.buf.clear();
  }
  if (!chunk.empty()) write_all(s.dest, chunk);
}

inline void close_stream(Stream& s) {
  if (s.fd < 0) return;
  forward_lines(s, /*final=*/true);
  ::close(s.fd);
  s.fd = -1;
}

/// Reads what is available (the pipe is non-blocking); closes the stream at EOF or on error.
inline void drain(Stream& s) {
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.buf.append(buf, static_cast<std::size_t>(n));
      forward_lines(s, false);
      if (static_cast<std::size_t>(n) < sizeof buf) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_stream(s);
    return;
  }
}

}  // namespace launch
