// The digits example (examples/digits.cpp) run as real processes, as a user runs it. Two suites
// (tests/meson.build runs this program twice):
//   examples       (everything outside TEST_SUITE "examples_full"): each strategy at reduced epochs
//                  (kReducedEpochs): the exit status agrees with the final accuracy, one progress line
//                  per epoch, the CSV has one row per epoch, the SVG is there; plus the error cases.
//   examples_full  (TEST_SUITE "examples_full"): the default epochs; each strategy reaches the
//                  documented 95% test accuracy and the strategies end with the same loss (same
//                  batches, same math).
// The parameter_server example (examples/parameter_server.cpp) runs under distribute-launch with 2 ps
// and 3 workers, one worker SIGKILLing itself mid-step and being restarted, in both suites.
// examples/torch_digits.cpp (libtorch) trains with one_device, mirrored(4) and 2 workers to the same
// weights, and with bfloat16 gradients, in the quick suite (it takes seconds).
// What the examples show while training (quick suite): --logdir's TensorBoard scalars read back with
// read_event_file and checked against the CSV (one process; a 2-worker job, where only the chief
// writes), the progress inside an epoch as plain lines through a pipe and as a bar under a
// pseudo-terminal (forkpty), and the bad values of the new options.
// The programs come from the environment: DISTRIBUTE_DIGITS (the example), DISTRIBUTE_PARAMETER_SERVER
// (absent when the build has no ps/ part), DISTRIBUTE_TORCH_DIGITS (absent without libtorch) and
// DISTRIBUTE_LAUNCH (tools/distribute-launch), set by tests/meson.build. DISTRIBUTE_RECOMMENDER
// (examples/recommender.cpp: sharded embedding tables, Adagrad on the ps tasks) likewise: a quick
// run with a worker killed, its data files and JSON figures, its usage errors; in the full suite the
// documented 5% of the hidden model's loss and 10,000,000-row tables.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <distribute/summary/event.hpp>

#include <poll.h>
#include <pty.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../examples/common/progress.hpp"
#include "support/processes.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr double kTargetAccuracy = 0.95;
constexpr int kDefaultEpochs = 12;  // the example's default
constexpr int kReducedEpochs = 2;   // the quick suite
constexpr int kParameterServerEpochs = 15;  // the parameter_server example's default
constexpr int kExitBelowTarget = 1; // digits' exit status when the final accuracy is below the target

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

/// The progress lines in `output` (those that start with `prefix` + "epoch "): exactly one per
/// epoch, for epochs 1..epochs in order, each "epoch e/E  loss L  accuracy A  test accuracy T
/// N examples/s".
void check_progress_lines(const std::string& output, int epochs, const std::string& prefix = "") {
  static const std::regex progress(
      R"(epoch +([0-9]+)/([0-9]+)  loss ([0-9]+\.[0-9]+)  accuracy ([01]\.[0-9]+)  test accuracy ([01]\.[0-9]+) +([0-9]+) examples/s)");
  std::vector<int> seen;
  std::istringstream lines(output);
  const std::string marker = prefix + "epoch ";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(marker, 0) != 0) continue;
    INFO("progress line: ", line);
    std::smatch m;
    const std::string rest = line.substr(prefix.size());
    REQUIRE(std::regex_match(rest, m, progress));
    seen.push_back(std::stoi(m[1].str()));
    CHECK(std::stoi(m[2].str()) == epochs);
    CHECK(std::stod(m[3].str()) > 0.0);
    CHECK(std::stod(m[6].str()) > 0.0);
  }
  std::vector<int> expected(static_cast<std::size_t>(epochs));
  for (int e = 1; e <= epochs; ++e) expected[static_cast<std::size_t>(e - 1)] = e;
  CHECK(seen == expected);
}

/// digits exits 0 when the final test accuracy reaches the target and kExitBelowTarget when not.
void check_exit_status(int status, const FinalLine& final_line) {
  INFO("final test accuracy ", final_line.test_accuracy);
  CHECK(status == (final_line.test_accuracy >= kTargetAccuracy ? 0 : kExitBelowTarget));
}

/// Runs `digits --strategy <strategy> --epochs <epochs> [extra...] --out DIR`, checks its exit
/// status, progress lines and files (and, at the default epochs, the target accuracy), and
/// returns its final line.
FinalLine run_digits(const std::string& strategy, int epochs, const std::vector<std::string>& extra = {}) {
  TempDir out;
  std::vector<std::string> argv{env_path("DISTRIBUTE_DIGITS"), "--strategy", strategy, "--epochs",
                                std::to_string(epochs)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--out", out.path.string()});
  const auto child = run(argv);
  INFO("digits --strategy ", strategy, " --epochs ", epochs, " output:\n", child.output);
  const auto finals = final_lines(child.output);
  REQUIRE(finals.size() == 1);
  check_exit_status(child.status, finals[0]);
  if (epochs == kDefaultEpochs) {
    CHECK(child.status == 0);
    CHECK(finals[0].test_accuracy >= kTargetAccuracy);
  }
  check_progress_lines(child.output, epochs);
  check_metrics_csv(out.path / fmt::format("metrics-{}.csv", strategy), epochs);
  check_loss_svg(out.path / fmt::format("loss-{}.svg", strategy));
  return finals[0];
}

/// `distribute-launch -n 3 -- digits --strategy multi_worker --epochs <epochs>`: every worker ends
/// with the same model; only the chief prints progress and writes the files. Returns the chief's
/// final line.
FinalLine run_multi_worker(int epochs) {
  TempDir out;
  const auto launch = run({env_path("DISTRIBUTE_LAUNCH"), "-n", "3", "--timeout", "50", "--",
                           env_path("DISTRIBUTE_DIGITS"), "--strategy", "multi_worker", "--epochs",
                           std::to_string(epochs), "--out", out.path.string()});
  INFO("launcher output:\n", launch.output);
  std::vector<FinalLine> finals;
  for (int worker = 0; worker < 3; ++worker) {
    const auto lines = final_lines(launch.output, fmt::format("[worker:{}] ", worker));
    REQUIRE(lines.size() == 1);
    finals.push_back(lines[0]);
    CHECK(lines[0].loss == finals[0].loss);
    CHECK(lines[0].test_accuracy == finals[0].test_accuracy);
  }
  // The launcher exits with the first non-zero status of a worker: all of them agree here.
  check_exit_status(launch.status, finals[0]);
  if (epochs == kDefaultEpochs) {
    CHECK(launch.status == 0);
    CHECK(finals[0].test_accuracy >= kTargetAccuracy);
  }
  check_progress_lines(launch.output, epochs, "[worker:0] ");
  CHECK(launch.output.find("[worker:1] epoch") == std::string::npos);
  CHECK(launch.output.find("[worker:2] epoch") == std::string::npos);
  CHECK(launch.output.find("[worker:1] wrote") == std::string::npos);
  check_metrics_csv(out.path / "metrics-multi_worker.csv", epochs);
  check_loss_svg(out.path / "loss-multi_worker.svg");
  return finals[0];
}

/// One "steps per worker a b c  workers up u/n  steps retried so far r" line of the
/// parameter_server example (after each epoch's progress line).
struct StepsLine {
  std::vector<int> per_worker;
  int up = 0, workers = 0, retried = 0;
  std::size_t position = 0;  // in the output
};

std::vector<StepsLine> steps_lines(const std::string& output) {
  static const std::regex re(R"(\[chief:0\] +steps per worker ([0-9 ]+?)  workers up ([0-9]+)/([0-9]+)  steps retried so far ([0-9]+))");
  std::vector<StepsLine> out;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it) {
    StepsLine s;
    std::istringstream counts((*it)[1].str());
    for (int n; counts >> n;) s.per_worker.push_back(n);
    s.up = std::stoi((*it)[2].str());
    s.workers = std::stoi((*it)[3].str());
    s.retried = std::stoi((*it)[4].str());
    s.position = static_cast<std::size_t>(it->position(0));
    out.push_back(s);
  }
  return out;
}

/// The parameter_server example's program, or nothing when this build has none.
std::optional<std::string> parameter_server_program() {
  const char* v = std::getenv("DISTRIBUTE_PARAMETER_SERVER");
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

struct PsRun {
  FinalLine final_line;
  test_support::Child launch;
};

/// `distribute-launch --ps 2 --workers 3 --restart-workers 1 -- parameter_server --epochs E
/// [extra...]`: the chief's progress and files, and every epoch's steps spread over the workers
/// with each step counted once (a step lost with its worker is retried, not repeated).
PsRun run_parameter_server(const std::string& program, int epochs, const std::vector<std::string>& extra = {},
                           const fs::path& out = {}) {
  std::vector<std::string> argv{env_path("DISTRIBUTE_LAUNCH"), "--ps", "2", "--workers", "3", "--restart-workers", "1",
                                "--restart-delay", "0.2", "--timeout", "55", "--", program, "--epochs",
                                std::to_string(epochs), "--out", out.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  PsRun r{{}, run(argv)};
  const std::string& output = r.launch.output;
  INFO("launcher output:\n", output);
  const auto finals = final_lines(output, "[chief:0] ");
  REQUIRE(finals.size() == 1);
  r.final_line = finals[0];
  check_exit_status(r.launch.status, r.final_line);
  check_progress_lines(output, epochs, "[chief:0] ");
  CHECK(output.find("[worker:0] epoch") == std::string::npos);  // only the coordinator reports
  // Round-robin placement over the 2 ps tasks, with TF's device strings.
  CHECK(output.find("dense_1/kernel on /job:ps/replica:0/task:0/device:CPU:0, dense_1/bias on "
                    "/job:ps/replica:0/task:1/device:CPU:0") != std::string::npos);
  std::smatch m;
  REQUIRE(std::regex_search(output, m, std::regex("([0-9]+) steps per epoch")));
  const int steps_per_epoch = std::stoi(m[1].str());
  CHECK(steps_per_epoch == 45);  // ceil(1438 training examples / batch 32)
  const auto steps = steps_lines(output);
  REQUIRE(steps.size() == static_cast<std::size_t>(epochs));
  for (const auto& s : steps) {
    REQUIRE(s.per_worker.size() == 3);
    CHECK(s.per_worker[0] + s.per_worker[1] + s.per_worker[2] == steps_per_epoch);
    CHECK(s.workers == 3);
  }
  check_metrics_csv(out / "metrics-parameter_server.csv", epochs);
  check_loss_svg(out / "loss-parameter_server.svg");
  return r;
}

/// Worker 1 SIGKILLs itself in its `kill_at_step`-th step; the launcher restarts it; the
/// coordinator retries the lost step, takes the worker back, and it takes steps again.
void check_worker_killed_and_back(const PsRun& r, int kill_at_step) {
  const std::string& output = r.launch.output;
  INFO("launcher output:\n", output);
  CHECK(output.find(fmt::format("[worker:1] worker 1: --kill-worker: SIGKILL in step {}", kill_at_step)) !=
        std::string::npos);
  CHECK(output.find("distribute-launch: worker:1 was killed by signal 9") != std::string::npos);
  CHECK(output.find("distribute-launch: starting worker:1 again") != std::string::npos);
  CHECK(output.find("[chief:0] coordinator: lost worker 1") != std::string::npos);
  const auto back = output.find("[chief:0] coordinator: worker 1 (");
  REQUIRE(back != std::string::npos);
  CHECK(output.find("is back; it receives closures again", back) != std::string::npos);
  const auto steps = steps_lines(output);
  REQUIRE(!steps.empty());
  CHECK(steps.back().retried >= 1);  // the step it died in ran again elsewhere
  int steps_after_back = 0;
  for (const auto& s : steps) {
    if (s.position > back && s.per_worker.size() == 3) steps_after_back += s.per_worker[1];
  }
  CHECK(steps_after_back > 0);  // the restarted worker receives closures again
  CHECK(steps.back().up == 3);
}

bool has_multi_worker() {
  const auto child = run({env_path("DISTRIBUTE_DIGITS"), "--strategies"});
  return child.status == 0 && child.output.find("multi_worker") != std::string::npos;
}

/// The recommender example's program, or nothing when this build has none.
std::optional<std::string> recommender_program() {
  const char* v = std::getenv("DISTRIBUTE_RECOMMENDER");
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

/// What the recommender's chief printed at the end: "done: ... held-out loss L, truth loss T (...)".
struct RecommenderRun {
  test_support::Child launch;
  double before = 0, held_out = 0, truth = 0;
  std::vector<double> train_losses;  // the progress lines'
};

/// `distribute-launch --ps 2 --workers 3 --restart-workers 1 -- recommender [args...]`, at most `limit`.
RecommenderRun run_recommender(const std::string& program, const std::vector<std::string>& args,
                               std::chrono::seconds limit) {
  std::vector<std::string> argv{env_path("DISTRIBUTE_LAUNCH"), "--ps", "2", "--workers", "3", "--restart-workers", "1",
                                "--restart-delay", "0.2", "--", program};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<test_support::Child> children;
  children.push_back(test_support::spawn(argv, {}));
  const bool finished = test_support::wait_all(children, limit);
  RecommenderRun r;
  r.launch = children[0];
  const std::string& output = r.launch.output;
  INFO("launcher output:\n", output);
  CHECK_MESSAGE(finished, "still running after the time limit");
  std::smatch m;
  REQUIRE(std::regex_search(output, m, std::regex(R"(held-out loss before ([0-9.]+), truth loss ([0-9.]+))")));
  r.before = std::stod(m[1].str());
  REQUIRE(std::regex_search(output, m, std::regex(R"(\[chief:0\] done: .* held-out loss ([0-9.]+), truth loss ([0-9.]+))")));
  r.held_out = std::stod(m[1].str());
  r.truth = std::stod(m[2].str());
  static const std::regex progress(R"(\[chief:0\] step +[0-9]+/[0-9]+  train loss ([0-9.]+) +[0-9]+ examples/s)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), progress); it != std::sregex_iterator(); ++it) {
    r.train_losses.push_back(std::stod((*it)[1].str()));
  }
  return r;
}

}  // namespace

// ---- examples: reduced epochs --------------------------------------------------------------

TEST_CASE("digits --epochs 2: one_device and mirrored(4): exit status, a progress line per epoch, CSV, SVG") {
  const FinalLine one = run_digits("one_device", kReducedEpochs);
  const FinalLine mirrored = run_digits("mirrored", kReducedEpochs, {"--replicas", "4"});
  CHECK(mirrored.loss == doctest::Approx(one.loss).epsilon(1e-4));
}

TEST_CASE("digits --epochs 2: multi_worker under distribute-launch -n 3: the chief's progress and files") {
  if (!has_multi_worker()) {
    MESSAGE("this build's digits has no multi_worker strategy (no Boost/OpenSSL): skipped");
    return;
  }
  const FinalLine chief = run_multi_worker(kReducedEpochs);
  const FinalLine one = run_digits("one_device", kReducedEpochs);
  CHECK(chief.loss == doctest::Approx(one.loss).epsilon(1e-4));
}

TEST_CASE("parameter_server --epochs 3 under distribute-launch --ps 2 --workers 3: a worker killed mid-step comes "
          "back") {
  const auto program = parameter_server_program();
  if (!program) {
    MESSAGE("this build has no parameter_server example (no cereal/Boost/OpenSSL): skipped");
    return;
  }
  TempDir out;
  const PsRun r = run_parameter_server(*program, 3,
                                       {"--kill-worker", "1", "--kill-at-step", "5", "--wait-for-workers", "30"},
                                       out.path);
  check_worker_killed_and_back(r, 5);
}

TEST_CASE("parameter_server: a checkpoint read from the ps tasks each epoch; a second run resumes from it") {
  const auto program = parameter_server_program();
  if (!program) {
    MESSAGE("this build has no parameter_server example (no cereal/Boost/OpenSSL): skipped");
    return;
  }
  TempDir out;
  const fs::path checkpoints = out.path / "ckpt";
  const PsRun first = run_parameter_server(*program, 2, {"--checkpoint-dir", checkpoints.string()}, out.path);
  CHECK(fs::exists(checkpoints / "ckpt-2.safetensors"));
  CHECK(read_file(checkpoints / "checkpoint").find("model_checkpoint_path: \"ckpt-2.safetensors\"") != std::string::npos);

  const auto second = run({env_path("DISTRIBUTE_LAUNCH"), "--ps", "2", "--workers", "3", "--timeout", "55", "--",
                           *program, "--epochs", "4", "--out", out.path.string(), "--checkpoint-dir",
                           checkpoints.string()});
  INFO("second run:\n", second.output);
  CHECK(second.output.find(fmt::format("[chief:0] resumed from {} after epoch 2",
                                       (checkpoints / "ckpt-2.safetensors").string())) != std::string::npos);
  CHECK(second.output.find("[chief:0] epoch  1/4") == std::string::npos);
  CHECK(second.output.find("[chief:0] epoch  3/4") != std::string::npos);
  CHECK(second.output.find("[chief:0] epoch  4/4") != std::string::npos);
  CHECK(fs::exists(checkpoints / "ckpt-4.safetensors"));
  const auto finals = final_lines(second.output, "[chief:0] ");
  REQUIRE(finals.size() == 1);
  // Two more epochs from where the first run stopped: better than after its two.
  CHECK(finals[0].loss < first.final_line.loss);
}

TEST_CASE("parameter_server: outside a cluster it says how to run it (exit 2)") {
  const auto program = parameter_server_program();
  if (!program) {
    MESSAGE("this build has no parameter_server example: skipped");
    return;
  }
  const auto child = run({*program, "--epochs", "1"});
  INFO(child.output);
  CHECK(child.status == 2);
  CHECK(child.output.find("distribute-launch --ps") != std::string::npos);
}

TEST_CASE("parameter_server: bad arguments are usage errors (exit 2) that say what is wrong") {
  const auto program = parameter_server_program();
  if (!program) {
    MESSAGE("this build has no parameter_server example: skipped");
    return;
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--kill-worker", "1"}, "--kill-worker and --kill-at-step go together"},
      {{"--epochs", "0"}, "--epochs: 0 must be positive"},
      {{"--wait-for-workers", "-1"}, "--wait-for-workers: -1 is negative"},
      {{"--learning-rate", "fast"}, "--learning-rate: 'fast' is not a number"},
      {{"--bogus"}, "unknown argument '--bogus'"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv{*program};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto child = run(argv);
    INFO(child.output);
    CHECK(child.status == 2);
    CHECK(child.output.find("parameter_server: " + message) != std::string::npos);
    CHECK(child.output.find("usage: distribute-launch --ps 2") != std::string::npos);
  }
}

TEST_CASE("recommender under distribute-launch --ps 2 --workers 3: a worker killed mid-step comes back, the loss "
          "falls, progress and examples/s shown") {
  const auto program = recommender_program();
  if (!program) {
    MESSAGE("this build has no recommender example (no cereal/Boost/OpenSSL): skipped");
    return;
  }
  const auto r = run_recommender(*program,
                                 {"--examples", "1000000", "--progress-every", "500", "--kill-worker", "1",
                                  "--kill-at-step", "200", "--wait-for-workers", "30"},
                                 120s);
  const std::string& output = r.launch.output;
  INFO("launcher output:\n", output);
  CHECK(output.find("[chief:0] recommender: 2 ps, 3 workers; 1000 users x 1000 items, D 8: tables user_embedding and "
                    "item_embedding in 2 shards each on /job:ps/replica:0/task:0/device:CPU:0, "
                    "/job:ps/replica:0/task:1/device:CPU:0") != std::string::npos);
  CHECK(output.find("[worker:1] worker 1: --kill-worker: SIGKILL in step 200") != std::string::npos);
  CHECK(output.find("distribute-launch: starting worker:1 again") != std::string::npos);
  CHECK(output.find("is back; it receives closures again") != std::string::npos);
  REQUIRE(r.train_losses.size() >= 4);
  CHECK(r.train_losses.back() < 0.5 * r.train_losses.front());
  CHECK(r.held_out < 0.5 * r.before);
  CHECK(r.truth == doctest::Approx(0.25).epsilon(0.05));  // the noise's variance (--noise 0.5)
}

TEST_CASE("recommender --write-data, then trained on those files with --report-json: the figures as JSON") {
  const auto program = recommender_program();
  if (!program) {
    MESSAGE("this build has no recommender example: skipped");
    return;
  }
  TempDir out;
  const auto written = run({*program, "--write-data", out.path.string(), "--users", "500", "--items", "400", "--dim", "4",
                            "--examples", "300000", "--eval-examples", "5000"});
  REQUIRE(written.status == 0);
  CHECK(fs::file_size(out.path / "train.bin") == 300000u * 20);
  CHECK(fs::file_size(out.path / "eval.bin") == 5000u * 20);
  const std::string meta = read_file(out.path / "meta.json");
  CHECK(meta.find("\"users\":500,\"items\":400,\"dim\":4,\"train_examples\":300000,\"eval_examples\":5000") !=
        std::string::npos);
  const auto r = run_recommender(*program,
                                 {"--data", out.path.string(), "--examples", "300000", "--warmup-steps", "20",
                                  "--report-json"},
                                 120s);
  CHECK(r.launch.status == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.launch.output, m, std::regex(R"(\[chief:0\] RESULT (\{.*\}))")));
  const std::string json = m[1].str();
  for (const char* key : {"\"examples\":", "\"seconds\":", "\"examples_per_s\":", "\"eval_loss\":",
                          "\"bytes_per_step\":", "\"truth_eval_loss\":"}) {
    CHECK(json.find(key) != std::string::npos);
  }
  CHECK(json.find(fmt::format("\"examples\":{}", (300000 / 256 - 20) * 256)) != std::string::npos);
  CHECK(r.held_out < r.before);
}

TEST_CASE("recommender: bad arguments are usage errors (exit 2) that say what is wrong") {
  const auto program = recommender_program();
  if (!program) {
    MESSAGE("this build has no recommender example: skipped");
    return;
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--kill-worker", "1"}, "--kill-worker and --kill-at-step go together"},
      {{"--users", "0"}, "--users: 0 must be positive"},
      {{"--examples", "1000", "--batch", "256"}, "--examples 1000 gives 3 steps of 256: not more than the 50 warm-up steps"},
      {{"--noise", "-1"}, "--noise: -1 is negative"},
      {{"--lr", "fast"}, "--lr: 'fast' is not a number"},
      {{"--data", "a", "--write-data", "b"}, "--data and --write-data exclude each other"},
      {{"--bogus"}, "unknown argument '--bogus'"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv{*program};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto child = run(argv);
    INFO(child.output);
    CHECK(child.status == 2);
    CHECK(child.output.find("recommender: " + message) != std::string::npos);
  }
  const auto outside = run({*program});
  CHECK(outside.status == 2);
  CHECK(outside.output.find("no cluster (TF_CONFIG is not set)") != std::string::npos);
}

// ---- examples_full: the default epochs, the documented accuracy -----------------------------

TEST_SUITE("examples_full") {
  TEST_CASE("digits: one_device and mirrored(4) reach 95% test accuracy and end with the same loss") {
    const FinalLine one = run_digits("one_device", kDefaultEpochs);
    const FinalLine mirrored = run_digits("mirrored", kDefaultEpochs, {"--replicas", "4"});
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
    const FinalLine chief = run_multi_worker(kDefaultEpochs);
    const FinalLine one = run_digits("one_device", kDefaultEpochs);
    CHECK(chief.loss == doctest::Approx(one.loss).epsilon(1e-4));
  }

  TEST_CASE("parameter_server (2 ps, 3 workers, asynchronous) reaches 95% with a worker killed and restarted") {
    const auto program = parameter_server_program();
    if (!program) {
      MESSAGE("this build has no parameter_server example (no cereal/Boost/OpenSSL): skipped");
      return;
    }
    TempDir out;
    const PsRun r = run_parameter_server(*program, kParameterServerEpochs,
                                         {"--kill-worker", "1", "--kill-at-step", "20", "--wait-for-workers", "30"},
                                         out.path);
    check_worker_killed_and_back(r, 20);
    CHECK(r.launch.status == 0);
    CHECK(r.final_line.test_accuracy >= kTargetAccuracy);
  }

  TEST_CASE("recommender (2 ps, 3 workers) reaches within 5% of the hidden model's loss, a worker killed and restarted") {
    const auto program = recommender_program();
    if (!program) {
      MESSAGE("this build has no recommender example: skipped");
      return;
    }
    const auto r = run_recommender(*program, {"--kill-worker", "2", "--kill-at-step", "1000", "--wait-for-workers", "30"}, 600s);
    INFO("launcher output:\n", r.launch.output);
    CHECK(r.launch.output.find("distribute-launch: starting worker:2 again") != std::string::npos);
    CHECK(r.launch.status == 0);
    CHECK(r.held_out <= 1.05 * r.truth);
  }

  TEST_CASE("recommender: tables of 10,000,000 rows train on 2 ps tasks in this machine's memory") {
    const auto program = recommender_program();
    if (!program) {
      MESSAGE("this build has no recommender example: skipped");
      return;
    }
    const auto r = run_recommender(*program,
                                   {"--users", "10000000", "--items", "10000000", "--examples", "500000", "--report-json"},
                                   600s);
    INFO("launcher output:\n", r.launch.output);
    CHECK(r.launch.status == 0);
    CHECK(r.launch.output.find("10000000 users x 10000000 items") != std::string::npos);
    CHECK(r.held_out < r.before);
  }
}

// ---- examples: errors -------------------------------------------------------------------------

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

// ---- examples/torch_digits.cpp: the same MLP in libtorch, gradients all-reduced as torch::Tensors

namespace {

/// DISTRIBUTE_TORCH_DIGITS, or empty when this build has no libtorch.
std::string torch_digits_path() {
  const char* v = std::getenv("DISTRIBUTE_TORCH_DIGITS");
  return v ? v : "";
}

std::vector<double> read_weights(const fs::path& path) {
  std::ifstream in(path);
  std::vector<double> out;
  for (double x; in >> x;) out.push_back(x);
  return out;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

/// How two runs' weights differ, for the message of a check that they are equal.
std::string weights_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return fmt::format("{} weights against {}", a.size(), b.size());
  std::size_t differing = 0, first = a.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i] && differing++ == 0) first = i;
  }
  if (differing == 0) return "the same weights";
  return fmt::format("{} of {} weights differ (the first at index {}: {:.17g} against {:.17g}), by at most {:.3g}",
                     differing, a.size(), first, a[first], b[first], max_difference(a, b));
}

}  // namespace

TEST_CASE("torch_digits: one_device, mirrored(4) and 2 workers reach 95% with the same weights; bf16 gradients and --overlap too") {
  const std::string program = torch_digits_path();
  if (program.empty()) {
    MESSAGE("this build has no libtorch (Debian libtorch-dev): torch_digits skipped");
    return;
  }
  // Replica threads call libtorch's BLAS at once: a BLAS that is not safe for that (OpenBLAS's
  // single-threaded build without locking) gives weights that differ from run to run.
  std::error_code no_blas;
  const fs::path blas = fs::canonical("/usr/lib/x86_64-linux-gnu/libblas.so.3", no_blas);
  INFO("libblas.so.3 is ", no_blas ? std::string("not found") : blas.string(),
       "; Mirrored needs a BLAS safe to call from several threads at once (docs/tensors.md)");
  TempDir out;
  auto train = [&](const std::string& name, std::vector<std::string> argv) {
    const fs::path weights = out.path / (name + ".txt");
    argv.insert(argv.end(), {"--out", out.path.string(), "--weights-out", weights.string()});
    const auto child = run(argv);
    INFO(name, " output:\n", child.output);
    CHECK(child.status == 0);
    const auto finals = final_lines(child.output, argv.front() == program ? "" : "[worker:0] ");
    REQUIRE(finals.size() == 1);
    CHECK(finals[0].test_accuracy >= kTargetAccuracy);
    check_progress_lines(child.output, kDefaultEpochs, argv.front() == program ? "" : "[worker:0] ");
    return read_weights(weights);
  };
  const auto one = train("one_device", {program, "--strategy", "one_device"});
  const auto mirrored = train("mirrored", {program, "--strategy", "mirrored", "--replicas", "4"});
  const auto workers = train("multi_worker", {env_path("DISTRIBUTE_LAUNCH"), "-n", "2", "--timeout", "120", "--", program,
                                              "--strategy", "multi_worker"});
  REQUIRE(one.size() == 64 * 64 + 64 + 64 * 10 + 10);
  CHECK(max_difference(one, mirrored) <= 1e-5);
  CHECK(max_difference(one, workers) <= 1e-5);
  const auto bf16 = train("bf16", {program, "--strategy", "mirrored", "--replicas", "4", "--grad-dtype", "bf16"});
  CHECK(max_difference(one, bf16) > 0.0);  // the gradients did travel in bfloat16
  // --overlap (buckets all-reduced while backward runs): the same sums, so the very same weights.
  const auto mirrored_overlap = train("mirrored_overlap", {program, "--strategy", "mirrored", "--replicas", "4", "--overlap"});
  CHECK_MESSAGE(mirrored_overlap == mirrored, weights_difference(mirrored_overlap, mirrored));
  const auto workers_overlap = train("multi_worker_overlap", {env_path("DISTRIBUTE_LAUNCH"), "-n", "2", "--timeout", "120",
                                                              "--", program, "--strategy", "multi_worker", "--overlap"});
  CHECK_MESSAGE(workers_overlap == workers, weights_difference(workers_overlap, workers));
  const auto bf16_overlap = train("bf16_overlap", {program, "--strategy", "mirrored", "--replicas", "4", "--grad-dtype",
                                                   "bf16", "--overlap"});
  CHECK_MESSAGE(bf16_overlap == bf16, weights_difference(bf16_overlap, bf16));
}

TEST_CASE("torch_digits: a bad --grad-dtype is a usage error (exit 2)") {
  const std::string program = torch_digits_path();
  if (program.empty()) {
    MESSAGE("this build has no libtorch (Debian libtorch-dev): torch_digits skipped");
    return;
  }
  const auto child = run({program, "--grad-dtype", "fp8"});
  INFO(child.output);
  CHECK(child.status == 2);
  CHECK(child.output.find("--grad-dtype: 'fp8' is not f64 or bf16") != std::string::npos);
}

// ---- what the examples show while they train: TensorBoard scalars (--logdir), progress in an epoch

namespace {

/// The event files directly in `dir`.
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  }
  return out;
}

/// The scalars of an event file by tag: (step, value) in file order.
std::map<std::string, std::vector<std::pair<std::int64_t, float>>> scalars_of(const fs::path& file) {
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> out;
  const auto events = distribute::summary::read_event_file(file.string());
  REQUIRE(!events.empty());
  CHECK(events[0].file_version == "brain.Event:2");
  for (const auto& e : events) {
    for (const auto& v : e.values) {
      REQUIRE(v.simple_value.has_value());
      out[v.tag].emplace_back(e.step, *v.simple_value);
    }
  }
  return out;
}

/// The CSV's rows as numbers (epoch, loss, train_accuracy, test_accuracy, examples_per_second).
std::vector<std::vector<double>> csv_rows(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  std::vector<std::vector<double>> rows;
  while (std::getline(in, line)) {
    std::vector<double> row;
    std::istringstream fields(line);
    for (std::string f; std::getline(fields, f, ',');) row.push_back(std::stod(f));
    rows.push_back(row);
  }
  return rows;
}

/// Checks the digits examples' scalars for `epochs` epochs of 45 steps against the CSV they wrote.
void check_digits_scalars(const fs::path& event_file, const fs::path& csv, int epochs) {
  INFO("event file ", event_file.string());
  const auto scalars = scalars_of(event_file);
  const std::vector<std::string> tags{"batch_accuracy", "batch_examples_per_second", "batch_loss", "epoch_accuracy",
                                      "epoch_examples_per_second", "epoch_loss", "epoch_test_accuracy"};
  std::vector<std::string> got;
  for (const auto& [tag, points] : scalars) got.push_back(tag);
  REQUIRE(got == tags);
  const int steps = 45;  // ceil(1438 / 32)
  for (const std::string tag : {"batch_loss", "batch_accuracy", "batch_examples_per_second"}) {
    const auto& points = scalars.at(tag);
    REQUIRE(points.size() == static_cast<std::size_t>(steps * epochs));
    for (std::size_t i = 0; i < points.size(); ++i) {
      CHECK(points[i].first == static_cast<std::int64_t>(i + 1));  // the global step
      CHECK(points[i].second > 0);
      CHECK(std::isfinite(points[i].second));
    }
  }
  for (const auto& [step, accuracy] : scalars.at("batch_accuracy")) CHECK(accuracy <= 1.0f);
  // The mean of the batch losses, weighted by the batches' sizes (44 of 32, 1 of 30), is the epoch's loss.
  const auto rows = csv_rows(csv);
  REQUIRE(rows.size() == static_cast<std::size_t>(epochs));
  for (int e = 0; e < epochs; ++e) {
    double sum = 0, examples = 0;
    for (int s = 0; s < steps; ++s) {
      const double n = s == steps - 1 ? 1438 - 32 * (steps - 1) : 32;
      sum += n * scalars.at("batch_loss")[static_cast<std::size_t>(e * steps + s)].second;
      examples += n;
    }
    CHECK(sum / examples == doctest::Approx(rows[static_cast<std::size_t>(e)][1]).epsilon(1e-4));
    for (const auto& [tag, column] : std::vector<std::pair<std::string, int>>{
             {"epoch_loss", 1}, {"epoch_accuracy", 2}, {"epoch_test_accuracy", 3}}) {
      const auto& point = scalars.at(tag)[static_cast<std::size_t>(e)];
      CHECK(point.first == e + 1);
      CHECK(point.second == doctest::Approx(rows[static_cast<std::size_t>(e)][static_cast<std::size_t>(column)]).epsilon(1e-5));
    }
    CHECK(scalars.at("epoch_examples_per_second")[static_cast<std::size_t>(e)].second > 0);
  }
}

/// Runs argv under a new pseudo-terminal (its stdout and stderr), reading what it writes, for at
/// most 60 s; returns the output and sets `status`.
std::string run_in_pty(const std::vector<std::string>& argv, int& status) {
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  std::string output;
  const auto end = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[4096];
      const ssize_t n = read(master, buf, sizeof buf);
      if (n <= 0) break;  // EIO: the child's side closed
      output.append(buf, static_cast<std::size_t>(n));
    }
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      FAIL_CHECK("still running after 60 s under a pseudo-terminal");
      break;
    }
  }
  close(master);
  int st = 0;
  waitpid(pid, &st, 0);
  status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return output;
}

/// The "progress: epoch e/E  step s/S (p%)  r steps/s  ETA m:ss  loss L" lines, as (epoch, step).
std::vector<std::pair<int, int>> plain_progress_lines(const std::string& output, const std::string& prefix = "") {
  static const std::regex re(
      R"(progress: epoch ([0-9]+)/([0-9]+)  step ([0-9]+)/45 \(([0-9]+)%\)  [0-9]+\.[0-9] steps/s  ETA [0-9]+:[0-9]{2}  loss [0-9]+\.[0-9]{4})");
  std::vector<std::pair<int, int>> out;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix + "progress: ", 0) != 0) continue;
    INFO("line: ", line);
    std::smatch m;
    const std::string rest = line.substr(prefix.size());
    REQUIRE(std::regex_match(rest, m, re));
    const int step = std::stoi(m[3].str());
    CHECK(std::stoi(m[4].str()) == static_cast<int>(std::lround(100.0 * step / 45)));
    out.emplace_back(std::stoi(m[1].str()), step);
  }
  return out;
}

}  // namespace

TEST_CASE("progress texts: the bar and the plain line for a given state, ETAs rounded up") {
  CHECK(progress::duration_text(0) == "0:00");
  CHECK(progress::duration_text(0.2) == "0:01");
  CHECK(progress::duration_text(59.5) == "1:00");
  CHECK(progress::duration_text(3725) == "1:02:05");
  CHECK(progress::duration_text(-3) == "0:00");
  // 20 of 45 steps in 4 s: 5 steps/s, 25 steps left: 5 s.
  const progress::State s{.epoch = 3, .epochs = 12, .step = 20, .steps = 45, .elapsed = 4.0, .loss = 0.22114};
  CHECK(progress::bar_text(s) == "[3/12] [==========>             ] 20/45      5.0 steps/s  ETA 0:05  loss 0.2211");
  CHECK(progress::line_text(s) == "progress: epoch 3/12  step 20/45 (44%)  5.0 steps/s  ETA 0:05  loss 0.2211");
  const progress::State done{.epoch = 1, .epochs = 1, .step = 7, .steps = 7, .elapsed = 1.0, .loss = 1.0};
  CHECK(progress::bar_text(done, 4) == "[1/1] [====] 7/7      7.0 steps/s  ETA 0:00  loss 1.0000");
  progress::Mode mode = progress::Mode::Off;
  CHECK(progress::parse_mode("lines", mode));
  CHECK(mode == progress::Mode::Lines);
  CHECK_FALSE(progress::parse_mode("fancy", mode));
}

TEST_CASE("digits --logdir: loss, accuracy and examples/s per step and per epoch as TensorBoard scalars, beside the CSV") {
  TempDir out;
  const fs::path logdir = out.path / "logs";
  const auto child = run({env_path("DISTRIBUTE_DIGITS"), "--strategy", "mirrored", "--epochs", "2", "--out",
                          out.path.string(), "--logdir", logdir.string()});
  INFO("output:\n", child.output);
  REQUIRE(final_lines(child.output).size() == 1);
  check_progress_lines(child.output, 2);  // the per-epoch lines are as before
  const auto files = event_files(logdir);
  REQUIRE(files.size() == 1);
  CHECK(child.output.find(fmt::format("wrote TensorBoard scalars to {}\n", files[0].string())) != std::string::npos);
  check_digits_scalars(files[0], out.path / "metrics-mirrored.csv", 2);
}

TEST_CASE("digits --logdir in a 2-worker job (distribute-launch -n 2): only the chief writes, one event file") {
  if (!has_multi_worker()) {
    MESSAGE("this build has no multi_worker strategy: skipped");
    return;
  }
  TempDir out;
  const fs::path logdir = out.path / "logs";
  const auto launch = run({env_path("DISTRIBUTE_LAUNCH"), "-n", "2", "--timeout", "50", "--", env_path("DISTRIBUTE_DIGITS"),
                           "--strategy", "multi_worker", "--epochs", "1", "--out", out.path.string(), "--logdir",
                           logdir.string()});
  INFO("launcher output:\n", launch.output);
  REQUIRE(final_lines(launch.output, "[worker:1] ").size() == 1);  // worker 1 trained to the end
  std::vector<fs::path> everything(fs::recursive_directory_iterator(logdir), fs::recursive_directory_iterator{});
  REQUIRE(everything.size() == 1);  // one file, no per-task directories
  CHECK(launch.output.find(fmt::format("[worker:0] wrote TensorBoard scalars to {}", everything[0].string())) !=
        std::string::npos);
  CHECK(launch.output.find("[worker:1] wrote TensorBoard") == std::string::npos);
  check_digits_scalars(everything[0], out.path / "metrics-multi_worker.csv", 1);
  // Progress inside the epoch: the chief's only (the launcher's pipes are not terminals: plain lines).
  CHECK(launch.output.find("[worker:1] progress:") == std::string::npos);
}

TEST_CASE("digits progress: plain lines when the output is not a terminal, a bar with steps/s and ETA on one") {
  const std::string digits = env_path("DISTRIBUTE_DIGITS");
  TempDir out;
  {  // A pipe: a plain line after every step with --progress-interval 0, in order.
    const auto child = run({digits, "--strategy", "one_device", "--epochs", "2", "--progress-interval", "0", "--out",
                            out.path.string()});
    INFO("output:\n", child.output);
    std::vector<std::pair<int, int>> expected;
    for (int e = 1; e <= 2; ++e) {
      for (int s = 1; s <= 45; ++s) expected.emplace_back(e, s);
    }
    CHECK(plain_progress_lines(child.output) == expected);
    CHECK(child.output.find('\r') == std::string::npos);
    check_progress_lines(child.output, 2);
  }
  {  // A pipe at the default interval (10 s): a run of a second has no progress lines, no bar.
    const auto child = run({digits, "--strategy", "one_device", "--epochs", "2", "--out", out.path.string()});
    INFO("output:\n", child.output);
    CHECK(plain_progress_lines(child.output).empty());
    CHECK(child.output.find('\r') == std::string::npos);
  }
  {  // A terminal: the bar, redrawn in place, then cleared for each epoch's line.
    int status = -1;
    const std::string output =
        run_in_pty({digits, "--strategy", "one_device", "--epochs", "2", "--out", out.path.string()}, status);
    INFO("output under a pseudo-terminal:\n", output);
    CHECK(status == 0);
    static const std::regex bar(
        R"(\r\[([12])/2\] \[[=> ]{24}\] +([0-9]+)/45 +[0-9]+\.[0-9] steps/s  ETA [0-9]+:[0-9]{2}  loss [0-9]+\.[0-9]{4}\x1b\[K)");
    std::vector<std::pair<int, int>> drawn;
    for (auto it = std::sregex_iterator(output.begin(), output.end(), bar); it != std::sregex_iterator(); ++it) {
      drawn.emplace_back(std::stoi((*it)[1].str()), std::stoi((*it)[2].str()));
    }
    REQUIRE(drawn.size() >= 4);  // at least the first and last step of each epoch
    CHECK(drawn.front() == std::pair{1, 1});
    CHECK(drawn.back() == std::pair{2, 45});
    CHECK(std::is_sorted(drawn.begin(), drawn.end()));
    CHECK(output.find("[1/2] [========================] 45/45") != std::string::npos);
    CHECK(output.find("\r\x1b[Kepoch  1/2  loss ") != std::string::npos);  // cleared, then the epoch's line
    CHECK(output.find("\r\x1b[Kepoch  2/2  loss ") != std::string::npos);
    CHECK(output.find("progress: ") == std::string::npos);
  }
  {  // --progress off on a terminal: nothing but the usual lines.
    int status = -1;
    const std::string output = run_in_pty(
        {digits, "--strategy", "one_device", "--epochs", "2", "--progress", "off", "--out", out.path.string()}, status);
    INFO("output:\n", output);
    CHECK(status == 0);
    CHECK(output.find("\r[") == std::string::npos);
    CHECK(output.find("epoch  2/2  loss ") != std::string::npos);
  }
}

TEST_CASE("digits: bad --progress, --progress-interval and --logdir are errors that say what is wrong") {
  const std::string digits = env_path("DISTRIBUTE_DIGITS");
  TempDir out;
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--progress", "fancy"}, "--progress: 'fancy' is not auto, bar, lines or off"},
           {{"--progress-interval", "-1"}, "--progress-interval: -1 is negative"},
           {{"--progress-interval", "soon"}, "--progress-interval: 'soon' is not a number"},
       }) {
    std::vector<std::string> argv{digits};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto child = run(argv);
    INFO(child.output);
    CHECK(child.status == 2);
    CHECK(child.output.find(message) != std::string::npos);
  }
  const fs::path file = out.path / "a_file";
  std::ofstream(file) << "x";
  const auto child = run({digits, "--epochs", "1", "--logdir", file.string(), "--out", out.path.string()});
  INFO(child.output);
  CHECK(child.status == 3);
  CHECK(child.output.find(fmt::format("digits: error: SummaryWriter: cannot create the log directory '{}': a file of "
                                      "that name is in the way", file.string())) != std::string::npos);
}

TEST_CASE("torch_digits --logdir and progress lines: the same scalars as digits, a plain line per step") {
  const std::string program = torch_digits_path();
  if (program.empty()) {
    MESSAGE("this build has no libtorch (Debian libtorch-dev): torch_digits skipped");
    return;
  }
  TempDir out;
  const fs::path logdir = out.path / "logs";
  const auto child = run({program, "--strategy", "mirrored", "--replicas", "2", "--epochs", "2", "--out",
                          out.path.string(), "--logdir", logdir.string(), "--progress-interval", "0"});
  INFO("output:\n", child.output);
  check_progress_lines(child.output, 2);
  CHECK(plain_progress_lines(child.output).size() == 90);
  const auto files = event_files(logdir);
  REQUIRE(files.size() == 1);
  check_digits_scalars(files[0], out.path / "metrics-torch-mirrored.csv", 2);
}
