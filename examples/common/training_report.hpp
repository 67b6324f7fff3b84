// Files an example writes after training: the per-epoch metrics as CSV and the loss curve as a
// small hand-written SVG line plot (plain text, no plotting library).
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "digits_mlp.hpp"

namespace report {

/// Writes `text` to `path`, creating the parent directories; throws std::runtime_error on failure.
inline void write_file(const std::filesystem::path& path, std::string_view text) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) throw std::runtime_error(fmt::format("cannot create directory '{}': {}", path.parent_path().string(), ec.message()));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", path.string()));
}

/// "epoch  e/E  loss L  accuracy A  test accuracy T  N examples/s" (tests parse this line).
inline std::string epoch_line(const digits::EpochMetrics& m, int epochs) {
  return fmt::format("epoch {:>2}/{}  loss {:.4f}  accuracy {:.4f}  test accuracy {:.4f}  {:>9.0f} examples/s", m.epoch,
                     epochs, m.loss, m.train_accuracy, m.test_accuracy, m.examples_per_second);
}

/// "final  test accuracy T  loss L  (tag, E epochs, S s)" (tests parse this line).
inline std::string final_line(const digits::EpochMetrics& last, std::string_view tag, int epochs, double seconds) {
  return fmt::format("final  test accuracy {:.4f}  loss {:.6f}  ({}, {} epochs, {:.1f} s)", last.test_accuracy,
                     last.loss, tag, epochs, seconds);
}

/// epoch,loss,train_accuracy,test_accuracy,examples_per_second (a header, then one row per epoch).
inline std::string metrics_csv(const std::vector<digits::EpochMetrics>& history) {
  std::string csv = "epoch,loss,train_accuracy,test_accuracy,examples_per_second\n";
  for (const auto& m : history) {
    csv += fmt::format("{},{:.6f},{:.6f},{:.6f},{:.1f}\n", m.epoch, m.loss, m.train_accuracy, m.test_accuracy,
                       m.examples_per_second);
  }
  return csv;
}

namespace detail {

/// The smallest 1, 2, 2.5 or 5 x 10^k that is >= x (x > 0): a round step between axis ticks.
inline double round_up_nicely(double x) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(x)));
  for (double step : {1.0, 2.0, 2.5, 5.0}) {
    if (step * magnitude >= x * (1 - 1e-12)) return step * magnitude;
  }
  return 10 * magnitude;
}

inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace detail

/// A line plot of `values` (the loss of epochs 1..n) with axes, ticks, axis labels and a title.
inline std::string loss_plot_svg(const std::vector<double>& values, std::string_view title) {
  constexpr double width = 640, height = 400;
  constexpr double left = 70, right = 20, top = 40, bottom = 55;  // margins around the plot area
  constexpr double plot_w = width - left - right, plot_h = height - top - bottom;
  const std::size_t n = values.size();
  // y axis: 0 to a whole number (at most 5) of round tick steps above the largest value.
  const double largest = n ? std::max(*std::max_element(values.begin(), values.end()), 1e-9) : 1;
  const double y_step = detail::round_up_nicely(largest / 5);
  const int y_ticks = static_cast<int>(std::ceil(largest / y_step - 1e-9));
  const double y_max = y_step * y_ticks;
  const double x_span = n > 1 ? static_cast<double>(n - 1) : 1;
  auto x_of = [&](std::size_t epoch) { return left + plot_w * static_cast<double>(epoch - 1) / x_span; };
  auto y_of = [&](double v) { return top + plot_h * (1 - std::clamp(v / y_max, 0.0, 1.0)); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      width, height, left + plot_w / 2, detail::xml_escape(title));
  // Horizontal grid lines and y ticks.
  for (int t = 0; t <= y_ticks; ++t) {
    const double v = y_step * t, y = y_of(v);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", left, y,
                       left + plot_w, y);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.3g}</text>\n", left - 6, y + 4, v);
  }
  // x ticks: every epoch, or about ten of them for long runs.
  const std::size_t every = std::max<std::size_t>(1, (n + 9) / 10);
  for (std::size_t e = 1; e <= n; e += every) {
    const double x = x_of(e);
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"black\"/>\n", x,
                       top + plot_h, top + plot_h + 5);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x, top + plot_h + 19, e);
  }
  // Axes and their labels.
  svg += fmt::format("<path d=\"M{0} {1} V{2} H{3}\" fill=\"none\" stroke=\"black\"/>\n", left, top, top + plot_h,
                     left + plot_w);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">epoch</text>\n", left + plot_w / 2, height - 12);
  svg += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">training loss "
      "(cross-entropy)</text>\n",
      top + plot_h / 2);
  // The curve, with a dot per epoch.
  std::string points;
  for (std::size_t e = 1; e <= n; ++e) points += fmt::format("{}{:.1f},{:.1f}", e > 1 ? " " : "", x_of(e), y_of(values[e - 1]));
  svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n", points);
  for (std::size_t e = 1; e <= n; ++e) {
    svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#1f77b4\"><title>epoch {}: {:.4f}</title></circle>\n",
                       x_of(e), y_of(values[e - 1]), e, values[e - 1]);
  }
  svg += "</svg>\n";
  return svg;
}

/// Writes DIR/metrics-<tag>.csv and DIR/loss-<tag>.svg (titled `title`) and says so on stdout.
inline void write_metrics_and_plot(const std::filesystem::path& dir, std::string_view tag,
                                   const std::vector<digits::EpochMetrics>& history, std::string_view title) {
  const auto csv_path = dir / fmt::format("metrics-{}.csv", tag);
  const auto svg_path = dir / fmt::format("loss-{}.svg", tag);
  std::vector<double> losses;
  for (const auto& m : history) losses.push_back(m.loss);
  write_file(csv_path, metrics_csv(history));
  write_file(svg_path, loss_plot_svg(losses, title));
  fmt::print("wrote {} and {}\n", csv_path.string(), svg_path.string());
}

}  // namespace report
