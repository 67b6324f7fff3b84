// The C++ side of tests/check_tensorboard.py:
//   summary_helper write DIR   writes the scalars below with ds::SummaryWriter into DIR
//   summary_helper read FILE   prints every event of FILE (read_event_file), one per line:
//                              "<wall_time> <step> version=<file_version>" or
//                              "<wall_time> <step> <tag>=<value as %.9g, or ? without simple_value> ..."
// The values written (check_tensorboard.py computes the same from these formulas):
//   "loss"        steps 0, 10, ..., 490: 1 / (1 + step)
//   "accuracy"    steps 0, 10, ..., 490: step / 500 (0 at step 0: a zero value is still a value)
//   "big/step"    steps 2^40 and 2^40 + 1: -2.5 and 1e30
//   "weird"       step 3: NaN, step 4: +inf, step 5: -inf
#include <distribute/summary/summary_writer.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace ds = distribute;

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string_view(argv[1]) == "write") {
      ds::SummaryWriter writer(argv[2]);
      for (std::int64_t step = 0; step < 500; step += 10) {
        writer.scalar("loss", 1.0 / (1.0 + static_cast<double>(step)), step);
        writer.scalar("accuracy", static_cast<double>(step) / 500.0, step);
      }
      writer.scalar("weird", std::numeric_limits<double>::quiet_NaN(), 3);
      writer.scalar("weird", std::numeric_limits<double>::infinity(), 4);
      writer.scalar("weird", -std::numeric_limits<double>::infinity(), 5);
      const std::int64_t big = std::int64_t{1} << 40;
      writer.scalar("big/step", -2.5, big);
      writer.scalar("big/step", 1e30, big + 1);
      writer.close();
      fmt::print("{}\n", writer.path());
      return 0;
    }
    if (argc == 3 && std::string_view(argv[1]) == "read") {
      for (const auto& e : ds::summary::read_event_file(argv[2])) {
        std::string line = fmt::format("{:.6f} {}", e.wall_time, e.step);
        if (!e.file_version.empty()) line += " version=" + e.file_version;
        for (const auto& v : e.values) {
          line += " " + v.tag + "=" + (v.simple_value ? fmt::format("{:.9g}", *v.simple_value) : std::string("?"));
        }
        fmt::print("{}\n", line);
      }
      return 0;
    }
    fmt::print(stderr, "usage: summary_helper write DIR | read FILE\n");
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "summary_helper: {}\n", e.what());
    return 1;
  }
}
