// Progress inside an epoch, on stderr: on a terminal a bar redrawn in place (steps done, steps/s,
// the epoch's ETA, the last batch's loss), like Keras' verbose=1 or tqdm; when stderr is not a
// terminal (a pipe, a file, distribute-launch's prefixing), a plain line every `interval` seconds
// instead, so logs stay readable. The per-epoch result line is the caller's, on stdout.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace progress {

enum class Mode { Auto, Bar, Lines, Off };

/// Reads "auto", "bar", "lines" or "off" into `mode`; false for anything else.
inline bool parse_mode(std::string_view text, Mode& mode) {
  if (text == "auto") mode = Mode::Auto;
  else if (text == "bar") mode = Mode::Bar;
  else if (text == "lines") mode = Mode::Lines;
  else if (text == "off") mode = Mode::Off;
  else return false;
  return true;
}

/// "1:02:03" or "2:03" for a number of seconds (rounded up: an ETA never says 0:00 too early).
inline std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.999);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

/// Where an epoch is: `step` of `steps` done after `elapsed` seconds, the last batch's loss.
struct State {
  int epoch = 0, epochs = 0;
  std::int64_t step = 0, steps = 0;
  double elapsed = 0;
  double loss = 0;

  double steps_per_second() const { return elapsed > 0 ? static_cast<double>(step) / elapsed : 0.0; }
  double eta() const {
    const double rate = steps_per_second();
    return rate > 0 ? static_cast<double>(steps - step) / rate : 0.0;
  }
};

/// "[3/12] [=========>          ]  23/45   120.3 steps/s  ETA 0:01  loss 0.2345"
inline std::string bar_text(const State& s, int width = 24) {
  const double done = s.steps > 0 ? static_cast<double>(s.step) / static_cast<double>(s.steps) : 1.0;
  const int filled = std::clamp(static_cast<int>(done * width), 0, width);
  std::string bar(static_cast<std::size_t>(filled), '=');
  if (filled < width) bar += '>';
  bar.resize(static_cast<std::size_t>(width), ' ');
  return fmt::format("[{}/{}] [{}] {:>{}}/{}  {:7.1f} steps/s  ETA {}  loss {:.4f}", s.epoch, s.epochs, bar, s.step,
                     fmt::formatted_size("{}", s.steps), s.steps, s.steps_per_second(), duration_text(s.eta()), s.loss);
}

/// "progress: epoch 3/12  step 23/45 (51%)  120.3 steps/s  ETA 0:01  loss 0.2345"
inline std::string line_text(const State& s) {
  const double percent = s.steps > 0 ? 100.0 * static_cast<double>(s.step) / static_cast<double>(s.steps) : 100.0;
  return fmt::format("progress: epoch {}/{}  step {}/{} ({:.0f}%)  {:.1f} steps/s  ETA {}  loss {:.4f}", s.epoch,
                     s.epochs, s.step, s.steps, percent, s.steps_per_second(), duration_text(s.eta()), s.loss);
}

/// Shows the progress of each epoch on `out` (stderr by default).
class Display {
 public:
  using Clock = std::chrono::steady_clock;

  /// Auto: a bar when `out` is a terminal, plain lines otherwise. `interval`: seconds between plain
  /// lines (0: one per step). A bar is redrawn at most every 0.1 s, and at the last step.
  explicit Display(Mode mode = Mode::Auto, double interval = 10.0, std::FILE* out = stderr)
      : out_(out), interval_(interval) {
    if (mode == Mode::Auto) mode = ::isatty(::fileno(out)) ? Mode::Bar : Mode::Lines;
    mode_ = mode;
  }

  Mode mode() const noexcept { return mode_; }

  void begin_epoch(int epoch, int epochs, std::int64_t steps) {
    state_ = State{epoch, epochs, 0, steps, 0, 0};
    start_ = last_shown_ = Clock::now();
  }

  /// After step `step` (1-based) of the epoch, whose batch had mean loss `loss`.
  void step(std::int64_t step, double loss) {
    const auto now = Clock::now();
    state_.step = step;
    state_.loss = loss;
    state_.elapsed = std::chrono::duration<double>(now - start_).count();
    const double since = std::chrono::duration<double>(now - last_shown_).count();
    if (mode_ == Mode::Bar && (since >= 0.1 || step == state_.steps || step == 1)) {
      fmt::print(out_, "\r{}\033[K", bar_text(state_));
      std::fflush(out_);
      bar_shown_ = true;
      last_shown_ = now;
    } else if (mode_ == Mode::Lines && since >= interval_) {
      fmt::print(out_, "{}\n", line_text(state_));
      std::fflush(out_);
      last_shown_ = now;
    }
  }

  /// Before the caller prints the epoch's result: the bar's line is cleared for it.
  void end_epoch() {
    if (bar_shown_) {
      fmt::print(out_, "\r\033[K");
      std::fflush(out_);
      bar_shown_ = false;
    }
  }

 private:
  std::FILE* out_;
  double interval_;
  Mode mode_ = Mode::Off;
  State state_;
  Clock::time_point start_{}, last_shown_{};
  bool bar_shown_ = false;
};

}  // namespace progress
