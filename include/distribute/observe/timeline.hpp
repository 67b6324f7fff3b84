// Timeline: what this task did and when, as Chrome trace-event JSON (Perfetto, chrome://tracing),
// one file per task: every cross-worker collective (kind, bytes, algorithm, waiting for peers vs
// moving data) and every strategy run() step. Horovod's timeline, for this library.
//
// Off unless started: DISTRIBUTE_TIMELINE=path (or CommunicationOptions::timeline) makes a
// multi-worker strategy start it with its task's name; it then writes path with the task inserted
// before the extension (timeline.json -> timeline.worker-1.json). Recording appends to a buffer of
// the calling thread; the file is written whole (to a temporary, then renamed: it is always valid
// JSON) by flush(): at exit, and when a collective fails so that the trace shows the failure.
// tools/merge_timelines.py merges the tasks' files into one, a process per task.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace observe {

/// Whether the timeline records: the one thing the hot path reads when it is off.
inline std::atomic<bool> timeline_on{false};

DISTRIBUTE_DECL std::string json_escape(std::string_view s);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  return out;
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
/// A cross-worker call's numbers, kept as numbers and written out only by flush(): recording one
/// call allocates nothing.
struct CallArgs {
  std::int64_t seq = -1;  // the collective's number (-1: point-to-point)
  std::uint64_t bytes = 0, sent = 0, received = 0;
  const char* algorithm = nullptr;  // a literal
  std::int64_t wait_ns = -1;        // waiting for peers; the rest of the span moved data (-1: unknown)
};

struct TraceEvent {
  std::string name;
  const char* category;  // a literal
  char phase;            // 'X' complete, 'i' instant, 'b'/'e' an async span's ends
  std::int64_t ts_ns;
  std::int64_t dur_ns;
  std::string args;  // a JSON object's members, without braces ("" for none)
  bool has_call = false;
  CallArgs call{};
  std::uint64_t id = 0;  // 'b'/'e': the async span's id
};

DISTRIBUTE_DECL std::string call_args_json(const TraceEvent& e);

struct ThreadBuffer;  // one thread's events

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string call_args_json(const TraceEvent& e) {
  std::string out;
  const CallArgs& c = e.call;
  if (c.seq >= 0) out += fmt::format("\"seq\":{},", c.seq);
  out += fmt::format("\"bytes\":{},\"sent\":{},\"received\":{}", c.bytes, c.sent, c.received);
  if (c.algorithm) out += fmt::format(",\"algorithm\":\"{}\"", c.algorithm);
  if (c.wait_ns >= 0) {
    out += fmt::format(",\"wait_for_peers_us\":{:.3f},\"transfer_us\":{:.3f}", c.wait_ns / 1000.0,
                       (e.dur_ns - c.wait_ns) / 1000.0);
  }
  if (!e.args.empty()) out += "," + e.args;
  return out;
}

struct ThreadBuffer {
  std::mutex mutex;  // taken by its thread per event (uncontended) and by flush()
  std::vector<TraceEvent> events;
  int tid = 0;
};
#endif  // DISTRIBUTE_DETAIL_DEFINE


/// Whether the timeline records now (a relaxed load: cheap enough for every call).
inline bool timeline_enabled() noexcept { return timeline_on.load(std::memory_order_relaxed); }

/// The file a task writes for DISTRIBUTE_TIMELINE=`path`: the task ("worker-1") before the extension.
DISTRIBUTE_DECL std::string timeline_file(std::string_view path, std::string_view task_type, int task_index);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string timeline_file(std::string_view path, std::string_view task_type, int task_index) {
  const std::string task = fmt::format("{}-{}", task_type, task_index);
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash) || dot == 0 ||
      (slash != std::string_view::npos && dot == slash + 1)) {
    return fmt::format("{}.{}.json", path, task);
  }
  return fmt::format("{}.{}{}", path.substr(0, dot), task, path.substr(dot));
}

#endif  // DISTRIBUTE_DETAIL_DEFINE
class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  /// The process's timeline.
  static Timeline& instance();

  ~Timeline();

  /// Starts recording into `file` (written by flush()) as task `task_type`:`task_index`. Throws
  /// InvalidArgument when the file cannot be written, or when another file is being recorded.
  void start(std::string file, std::string task_type, int task_index);

  /// Stops recording (what is recorded stays, and is written by the next flush()).
  void stop() noexcept { timeline_on.store(false, std::memory_order_relaxed); }

  const std::string& file() const noexcept { return file_; }

  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }

  /// A span [start, end) on the calling thread. `args`: JSON members ("\"bytes\":4"), or "".
  void complete(std::string name, const char* category, std::int64_t start_ns, std::int64_t end_ns, std::string args = {}) {
    record({std::move(name), category, 'X', start_ns, std::max<std::int64_t>(end_ns - start_ns, 0), std::move(args)});
  }

  /// A cross-worker call [start, end) on the calling thread, its numbers formatted only when written;
  /// `extra`: more JSON members (an error), or "".
  void call(const char* name, std::int64_t start_ns, std::int64_t end_ns, const CallArgs& args, std::string extra = {}) {
    TraceEvent e{name, "collective", 'X', start_ns, std::max<std::int64_t>(end_ns - start_ns, 0), std::move(extra)};
    e.has_call = true;
    e.call = args;
    record(std::move(e));
  }

  /// A span [start, end) that may overlap others of its thread (Chrome's async 'b'/'e' pair, shown
  /// on a track of its own): work that waits in a queue, such as a coordinator's closures. Both
  /// ends are recorded now, on the calling thread; `id` tells the spans of one `category` apart.
  void async_span(std::string name, const char* category, std::uint64_t id, std::int64_t start_ns, std::int64_t end_ns,
                  std::string args = {});

  /// A moment on the calling thread (a failure).
  void instant(std::string name, const char* category, std::int64_t at_ns, std::string args = {}) {
    record({std::move(name), category, 'i', at_ns, 0, std::move(args)});
  }

  /// Writes every event recorded so far (the whole file again: it stays valid JSON).
  void flush();

 private:
  Timeline() = default;

  ThreadBuffer& buffer();

  void record(TraceEvent e);

  void write_locked();

  static std::string json_escape_(std::string_view s) { return json_escape(s); }

  std::mutex mutex_;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers_;
  std::string file_;
  std::string task_type_;
  int task_index_ = 0;
};

/// Records a span of the calling thread from construction to destruction when the timeline is
/// on (`number` >= 0 goes into its args as "step"); when it is off, one relaxed load and a branch
/// (its members are trivial: nothing to build or destroy on the hot path).
class TimelineSpan {
 public:
  TimelineSpan(const char* name, const char* category, std::int64_t number = -1) noexcept
      : name_(name), category_(category), number_(number) {
    if (timeline_enabled()) start_ = Timeline::now_ns();
  }
  ~TimelineSpan() {
    if (start_ != 0) record();
  }
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;
  bool active() const noexcept { return start_ != 0; }

 private:
  void record() noexcept;

  const char* name_;
  const char* category_;
  std::int64_t number_;
  std::int64_t start_ = 0;
};

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL Timeline& Timeline::instance() {
  static Timeline t;
  return t;
}

DISTRIBUTE_DECL Timeline::~Timeline() {
  try {
    flush();
  } catch (...) {
  }
}

DISTRIBUTE_DECL void Timeline::start(std::string file, std::string task_type, int task_index) {
  std::lock_guard lock(mutex_);
  if (!file_.empty() && file_ != file) {
    throw InvalidArgument(fmt::format("timeline: this process already records into '{}', not '{}'", file_, file));
  }
  if (std::FILE* f = std::fopen(file.c_str(), "w")) {
    std::fclose(f);
  } else {
    throw InvalidArgument(fmt::format("timeline: cannot write '{}' (DISTRIBUTE_TIMELINE): {}", file, std::strerror(errno)));
  }
  file_ = std::move(file);
  task_type_ = std::move(task_type);
  task_index_ = task_index;
  timeline_on.store(true, std::memory_order_relaxed);
  write_locked();  // valid (empty) from the start
}

DISTRIBUTE_DECL void Timeline::async_span(std::string name, const char* category, std::uint64_t id,
                                          std::int64_t start_ns, std::int64_t end_ns, std::string args) {
  TraceEvent b{name, category, 'b', start_ns, 0, std::move(args)};
  b.id = id;
  TraceEvent e{std::move(name), category, 'e', std::max(end_ns, start_ns), 0, {}};
  e.id = id;
  ThreadBuffer& buf = buffer();
  std::lock_guard lock(buf.mutex);
  buf.events.push_back(std::move(b));
  buf.events.push_back(std::move(e));
}

DISTRIBUTE_DECL void Timeline::flush() {
  std::lock_guard lock(mutex_);
  if (!file_.empty()) write_locked();
}

DISTRIBUTE_DECL ThreadBuffer& Timeline::buffer() {
  thread_local std::shared_ptr<ThreadBuffer> mine;
  if (!mine) {
    mine = std::make_shared<ThreadBuffer>();
    std::lock_guard lock(mutex_);
    mine->tid = static_cast<int>(buffers_.size()) + 1;
    buffers_.push_back(mine);
  }
  return *mine;
}

DISTRIBUTE_DECL void Timeline::record(TraceEvent e) {
  ThreadBuffer& b = buffer();
  std::lock_guard lock(b.mutex);
  b.events.push_back(std::move(e));
}

DISTRIBUTE_DECL void Timeline::write_locked() {
  const auto steady = Clock::now();
  const auto wall = std::chrono::system_clock::now();
  // What to add to a ts to get microseconds since the Unix epoch: lets the merge script align
  // files of tasks on different hosts, whose steady clocks do not agree.
  const std::int64_t wall_minus_steady_us =
      std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count() -
      std::chrono::duration_cast<std::chrono::microseconds>(steady.time_since_epoch()).count();
  const std::string task = fmt::format("{}:{}", task_type_, task_index_);
  std::string out = fmt::format(
      "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"task\":\"{}\",\"task_type\":\"{}\",\"task_index\":{},"
      "\"wall_minus_steady_us\":{}}},\"traceEvents\":[\n",
      json_escape_(task), json_escape_(task_type_), task_index_, wall_minus_steady_us);
  out += fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"{}\"}}}}",
                     task_index_, json_escape_(task));
  for (const auto& b : buffers_) {
    std::vector<TraceEvent> events;
    {
      std::lock_guard lock(b->mutex);
      events = b->events;
    }
    // Sorted by start, enclosing spans first: ts never goes back within a thread.
    std::stable_sort(events.begin(), events.end(), [](const auto& x, const auto& y) {
      return x.ts_ns != y.ts_ns ? x.ts_ns < y.ts_ns : x.dur_ns > y.dur_ns;
    });
    out += fmt::format(",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"thread {}\"}}}}",
                       task_index_, b->tid, b->tid);
    for (const auto& e : events) {
      out += fmt::format(",\n{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":{:.3f}",
                         json_escape_(e.name), e.category, e.phase, task_index_, b->tid, e.ts_ns / 1000.0);
      if (e.phase == 'X') out += fmt::format(",\"dur\":{:.3f}", e.dur_ns / 1000.0);
      if (e.phase == 'i') out += ",\"s\":\"t\"";
      if (e.phase == 'b' || e.phase == 'e') out += fmt::format(",\"id\":\"0x{:x}\"", e.id);
      out += fmt::format(",\"args\":{{{}}}}}", e.has_call ? call_args_json(e) : e.args);
    }
  }
  out += "\n]}\n";
  const std::string tmp = file_ + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;  // flushing must not throw into a failing collective; start() checked the place
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) == 0 && ok) std::rename(tmp.c_str(), file_.c_str());
}

DISTRIBUTE_DECL void TimelineSpan::record() noexcept {
  try {
    Timeline::instance().complete(name_, category_, start_, Timeline::now_ns(),
                                  number_ >= 0 ? fmt::format("\"step\":{}", number_) : std::string());
  } catch (...) {
  }
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

}  // namespace observe
DISTRIBUTE_END_NAMESPACE
