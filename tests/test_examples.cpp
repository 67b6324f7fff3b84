// The digits example (examples/digits.cpp) run as real processes, as a user runs it: each
// strategy reaches the documented test accuracy, writes its CSV and SVG, and the strategies end
// with the same loss (same batches, same math). The programs come from the environment:
// DISTRIBUTE_DIGITS (the example) and DISTRIBUTE_LAUNCH (tools/distribute-launch), set by
// tests/meson.build.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/processes.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr double kTargetAccuracy = 0.95;
constexpr int kDefaultEpochs = 12;  // the example's default

std::string env_path(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE((v && *v), name, " is not set (run the tests through meson test)");
  return v;
}

/// A fresh directory under the system's temp directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() / fmt::format("distribute-examples-{}-{}", getpid(), counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// Runs argv to completion (60 s at most) and returns the child with its merged output and status.
test_support::Child run(const std::vector<std::string>& argv) {
  std::vector<test_support::Child> children;
  children.push_back(test_support::spawn(argv, {}));
  const bool finished = test_support::wait_all(children, 60s);
  INFO("output:\n", children[0].output);
  CHECK_MESSAGE(finished, "still running after 60 s");
  return children[0];
}

/// The numbers of a "final  test accuracy A  loss L  (...)" line.
struct FinalLine {
  double test_accuracy = 0;
  double loss = 0;
};

/// The final lines in `output` whose prefix (what comes before "final") is `prefix`.
std::vector<FinalLine> final_lines(const std::string& output, const std::string& prefix = "") {
  std::vector<FinalLine> out;
  std::istringstream lines(output);
  const std::string marker = prefix + "final  test accuracy ";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(marker, 0) != 0) continue;
    FinalLine f;
    std::istringstream rest(line.substr(marker.size()));
    std::string word;
    rest >> f.test_accuracy >> word >> f.loss;
    if (rest && word == "loss") out.push_back(f);
  }
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The metrics CSV has its header and one row of five fields per epoch.
void check_metrics_csv(const fs::path& path, int epochs) {
  INFO("file: ", path.string());
  REQUIRE(fs::exists(path));
  std::istringstream csv(read_file(path));
  std::string line;
  std::getline(csv, line);
  CHECK(line == "epoch,loss,train_accuracy,test_accuracy,examples_per_second");
  int rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    CHECK(line.rfind(fmt::format("{},", rows), 0) == 0);
    CHECK(std::count(line.begin(), line.end(), ',') == 4);
  }
  CHECK(rows == epochs);
}

void check_loss_svg(const fs::path& path) {
  INFO("file: ", path.string());
  REQUIRE(fs::exists(path));
  const std::string svg = read_file(path);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("<polyline") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
}

/// Runs `digits --strategy <strategy> [extra...] --out DIR`, checks its result and files, and
/// returns its final line.
FinalLine run_digits(const std::string& strategy, const std::vector<std::string>& extra = {}) {
  TempDir out;
  std::vector<std::string> argv{env_path("DISTRIBUTE_DIGITS"), "--strategy", strategy};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--out", out.path.string()});
  const auto child = run(argv);
  INFO("digits --strategy ", strategy, " output:\n", child.output);
  CHECK(child.status == 0);
  CHECK(child.output.find("epoch 12/12") != std::string::npos);  // a progress line per epoch
  const auto finals = final_lines(child.output);
  REQUIRE(finals.size() == 1);
  CHECK(finals[0].test_accuracy >= kTargetAccuracy);
  check_metrics_csv(out.path / fmt::format("metrics-{}.csv", strategy), kDefaultEpochs);
  check_loss_svg(out.path / fmt::format("loss-{}.svg", strategy));
  return finals[0];
}

bool has_multi_worker() {
  const auto child = run({env_path("DISTRIBUTE_DIGITS"), "--strategies"});
  return child.status == 0 && child.output.find("multi_worker") != std::string::npos;
}

}  // namespace

TEST_CASE("digits: one_device and mirrored(4) reach 95% test accuracy and end with the same loss") {
  const FinalLine one = run_digits("one_device");
  const FinalLine mirrored = run_digits("mirrored", {"--replicas", "4"});
  // The same global batches in the same order and the same update: only the split of each batch
  // across replicas differs (uneven in the last batch), which changes rounding only.
  CHECK(mirrored.loss == doctest::Approx(one.loss).epsilon(1e-4));
  CHECK(std::abs(mirrored.test_accuracy - one.test_accuracy) <= 0.003);  // at most one of the 359 test images
}

TEST_CASE("digits: multi_worker under distribute-launch -n 3 reaches 95% and matches one_device") {
  if (!has_multi_worker()) {
    MESSAGE("this build's digits has no multi_worker strategy (no Boost/OpenSSL): skipped");
    return;
  }
  TempDir out;
  const auto launch = run({env_path("DISTRIBUTE_LAUNCH"), "-n", "3", "--timeout", "50", "--",
                           env_path("DISTRIBUTE_DIGITS"), "--strategy", "multi_worker", "--out", out.path.string()});
  INFO("launcher output:\n", launch.output);
  REQUIRE(launch.status == 0);
  // Every worker ends with the same model; only the chief prints progress and writes the files.
  std::vector<FinalLine> finals;
  for (int worker = 0; worker < 3; ++worker) {
    const auto lines = final_lines(launch.output, fmt::format("[worker:{}] ", worker));
    REQUIRE(lines.size() == 1);
    finals.push_back(lines[0]);
    CHECK(lines[0].test_accuracy >= kTargetAccuracy);
    CHECK(lines[0].loss == finals[0].loss);
  }
  CHECK(launch.output.find("[worker:0] epoch 12/12") != std::string::npos);
  CHECK(launch.output.find("[worker:1] epoch") == std::string::npos);
  CHECK(launch.output.find("[worker:1] wrote") == std::string::npos);
  check_metrics_csv(out.path / "metrics-multi_worker.csv", kDefaultEpochs);
  check_loss_svg(out.path / "loss-multi_worker.svg");
  const FinalLine one = run_digits("one_device");
  CHECK(finals[0].loss == doctest::Approx(one.loss).epsilon(1e-4));
}

TEST_CASE("digits: a missing data file is a clear error and a non-zero exit") {
  TempDir out;
  const std::string missing = (out.path / "no-such-digits.csv").string();
  const auto child = run({env_path("DISTRIBUTE_DIGITS"), "--strategy", "one_device", "--data", missing, "--out",
                          out.path.string()});
  INFO(child.output);
  CHECK(child.status != 0);
  CHECK(child.output.find(fmt::format("cannot open the digits data file '{}'", missing)) != std::string::npos);
  CHECK(child.output.find("--data") != std::string::npos);
  CHECK(final_lines(child.output).empty());
  CHECK(!fs::exists(out.path / "metrics-one_device.csv"));
}

TEST_CASE("digits: a malformed data file names the line and the field") {
  TempDir dir;
  const fs::path bad = dir.path / "digits.csv";
  {
    std::ofstream f(bad);
    std::string row;
    for (int i = 0; i < 64; ++i) row += "0,";
    f << row << "3\n" << row << "7\n\n" << row.substr(0, 6) << "x" << row.substr(7) << "1\n";  // line 4: "x"
  }
  auto child = run({env_path("DISTRIBUTE_DIGITS"), "--strategy", "one_device", "--data", bad.string(), "--out",
                    dir.path.string()});
  INFO(child.output);
  CHECK(child.status != 0);
  CHECK(child.output.find(fmt::format("{}:4: field 4 is 'x', not an integer", bad.string())) != std::string::npos);

  {
    std::ofstream f(bad);
    f << "1,2,3\n";
  }
  child = run({env_path("DISTRIBUTE_DIGITS"), "--data", bad.string(), "--out", dir.path.string()});
  INFO(child.output);
  CHECK(child.status != 0);
  CHECK(child.output.find(fmt::format("{}:1: only 3 fields", bad.string())) != std::string::npos);
}

TEST_CASE("digits: a bad argument is a usage error (exit 2)") {
  const auto child = run({env_path("DISTRIBUTE_DIGITS"), "--strategy", "tpu"});
  INFO(child.output);
  CHECK(child.status == 2);
  CHECK(child.output.find("'tpu' is not one_device, mirrored or multi_worker") != std::string::npos);
  CHECK(child.output.find("usage: digits") != std::string::npos);
}
