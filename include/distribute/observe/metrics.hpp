// Metrics of one task in Prometheus's text format (version 0.0.4): counters, gauges read when
// scraped, and histograms, every series labelled with the task it belongs to. One registry per
// task; the parameter-server Server and the multi-worker collectives both expose theirs through it.
//
//   ds::observe::MetricsRegistry reg("worker", 1);
//   auto& calls = reg.counter("distribute_collectives_total", "Collectives called.", {{"kind", "all_reduce"}});
//   calls.add();                      // a relaxed atomic add: safe from any thread
//   std::string text = reg.expose();  // what GET /metrics returns
//
// The task's labels are `task_type` and `task_index`, never `job`: Prometheus sets `job` itself on
// every scraped series (the scrape configuration's job name) and would rename ours `exported_job`.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace observe {

/// Label names and values of one series, besides the task's own.
using Labels = std::vector<std::pair<std::string, std::string>>;

/// A monotonically increasing count.
class Counter {
 public:
  void add(std::uint64_t n = 1) noexcept { value_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

/// Observations counted into cumulative buckets (upper bounds, in the unit of the observations),
/// with their sum and count, as Prometheus histograms are.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1) {}

  void observe(double v) noexcept {
    const auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    // The sum in nanounits keeps it an integer atomic (a double's fetch_add is a CAS loop).
    sum_nano_.fetch_add(static_cast<std::uint64_t>(std::max(v, 0.0) * 1e9), std::memory_order_relaxed);
  }
  const std::vector<double>& bounds() const noexcept { return bounds_; }
  /// Observations in bucket i alone (not cumulative); the last is above every bound.
  std::uint64_t bucket(std::size_t i) const noexcept { return buckets_[i].load(std::memory_order_relaxed); }
  std::uint64_t count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& b : buckets_) n += b.load(std::memory_order_relaxed);
    return n;
  }
  double sum() const noexcept { return static_cast<double>(sum_nano_.load(std::memory_order_relaxed)) / 1e9; }

 private:
  std::vector<double> bounds_;
  std::deque<std::atomic<std::uint64_t>> buckets_;  // deque: atomics cannot move
  std::atomic<std::uint64_t> sum_nano_{0};
};

/// Latency buckets (seconds) for collectives and requests: 50 µs to 10 s.
inline std::vector<double> latency_buckets() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10};
}

namespace detail {

inline bool valid_name(std::string_view s, bool label) {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return !(label && s.starts_with("__"));
}

/// A label value as the text format writes it: backslash, double quote and newline escaped.
inline std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

/// HELP text: backslash and newline escaped.
inline std::string escape_help(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

inline std::string format_value(double v) {
  if (v == std::numeric_limits<double>::infinity()) return "+Inf";
  return fmt::format("{}", v);
}

}  // namespace detail

/// The metrics of one task. Registering is done once, up front (it takes a lock); the references
/// it returns stay valid as long as the registry and are updated lock-free.
class MetricsRegistry {
 public:
  /// `task_type` ("worker", "ps", "chief"...) and `task_index` label every series.
  MetricsRegistry(std::string task_type, int task_index) : task_type_(std::move(task_type)), task_index_(task_index) {}
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  const std::string& task_type() const noexcept { return task_type_; }
  int task_index() const noexcept { return task_index_; }

  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {}) {
    std::lock_guard lock(mutex_);
    Series& s = add(name, help, "counter", labels);
    s.counter = std::make_unique<Counter>();
    return *s.counter;
  }

  Histogram& histogram(std::string_view name, std::string_view help, const Labels& labels = {},
                       std::vector<double> bounds = latency_buckets()) {
    if (bounds.empty() || !std::is_sorted(bounds.begin(), bounds.end()) ||
        std::adjacent_find(bounds.begin(), bounds.end()) != bounds.end()) {
      throw InvalidArgument(fmt::format("metric '{}': histogram bounds must be non-empty and strictly increasing", name));
    }
    for (const auto& [k, v] : labels) {
      if (k == "le") throw InvalidArgument(fmt::format("metric '{}': 'le' is the histogram's own label", name));
    }
    std::lock_guard lock(mutex_);
    Series& s = add(name, help, "histogram", labels);
    s.histogram = std::make_unique<Histogram>(std::move(bounds));
    return *s.histogram;
  }

  /// A value read when scraped (`type` "gauge" or "counter"): sizes, or counts kept elsewhere.
  void callback(std::string_view name, std::string_view help, std::string_view type, const Labels& labels,
                std::function<double()> read) {
    if (type != "gauge" && type != "counter") {
      throw InvalidArgument(fmt::format("metric '{}': a callback is a gauge or a counter, not '{}'", name, type));
    }
    std::lock_guard lock(mutex_);
    add(name, help, type, labels).read = std::move(read);
  }

  /// Every series in the text format, families in registration order.
  std::string expose() const {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const Family& f : families_) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, detail::escape_help(f.help), f.name, f.type);
      for (const Series& s : f.series) {
        if (s.histogram) {
          const Histogram& h = *s.histogram;
          std::uint64_t cumulative = 0;
          for (std::size_t i = 0; i <= h.bounds().size(); ++i) {
            cumulative += h.bucket(i);
            const double le = i < h.bounds().size() ? h.bounds()[i] : std::numeric_limits<double>::infinity();
            out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", f.name, s.labels, detail::format_value(le), cumulative);
          }
          out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", f.name, s.labels, detail::format_value(h.sum()),
                             f.name, s.labels, cumulative);
        } else if (s.counter) {
          out += fmt::format("{}{{{}}} {}\n", f.name, s.labels, s.counter->value());
        } else {
          out += fmt::format("{}{{{}}} {}\n", f.name, s.labels, detail::format_value(s.read()));
        }
      }
    }
    return out;
  }

 private:
  struct Series {
    std::string labels;  // rendered: task_type="...",task_index="...",k="v"
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> read;
  };
  struct Family {
    std::string name, help, type;
    std::vector<std::string> label_names;
    std::deque<Series> series;  // deque: references handed out stay valid
  };

  Series& add(std::string_view name, std::string_view help, std::string_view type, const Labels& labels) {
    if (!detail::valid_name(name, false)) {
      throw InvalidArgument(fmt::format("'{}' is not a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", name));
    }
    std::vector<std::string> names;
    std::string rendered = fmt::format("task_type=\"{}\",task_index=\"{}\"", detail::escape_label_value(task_type_), task_index_);
    for (const auto& [k, v] : labels) {
      if (!detail::valid_name(k, true)) {
        throw InvalidArgument(fmt::format("metric '{}': '{}' is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, not __...)", name, k));
      }
      if (k == "task_type" || k == "task_index" || k == "job" || k == "instance") {
        throw InvalidArgument(fmt::format("metric '{}': label '{}' is reserved (the task's labels are task_type and "
                                          "task_index; job and instance are Prometheus's own)", name, k));
      }
      if (std::find(names.begin(), names.end(), k) != names.end()) {
        throw InvalidArgument(fmt::format("metric '{}': label '{}' given twice", name, k));
      }
      names.push_back(k);
      rendered += fmt::format(",{}=\"{}\"", k, detail::escape_label_value(v));
    }
    auto it = std::find_if(families_.begin(), families_.end(), [&](const Family& f) { return f.name == name; });
    if (it == families_.end()) {
      families_.push_back(Family{std::string(name), std::string(help), std::string(type), names, {}});
      it = std::prev(families_.end());
    } else if (it->type != type || it->label_names != names) {
      throw InvalidArgument(fmt::format("metric '{}' is already registered as a {} with other labels or type", name, it->type));
    }
    for (const Series& s : it->series) {
      if (s.labels == rendered) throw InvalidArgument(fmt::format("metric '{}{{{}}}' is registered twice", name, rendered));
    }
    return it->series.emplace_back(Series{std::move(rendered), nullptr, nullptr, {}});
  }

  std::string task_type_;
  int task_index_;
  mutable std::mutex mutex_;
  std::deque<Family> families_;
};

}  // namespace observe
DISTRIBUTE_END_NAMESPACE
