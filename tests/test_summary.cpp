// summary/: ds::SummaryWriter and TensorBoard event files. The bytes of an Event against the
// protobuf wire format worked out by hand; files read back with read_event_file (both CRCs of every
// record checked); corrupted and truncated tails; bad arguments; who writes in a multi-worker job,
// decided from TF_CONFIG. TensorBoard's own reader is tests/check_tensorboard.py; a real 2-worker
// job with the digits example is in tests/test_examples.cpp.
#include <distribute/summary/summary_writer.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace ds = distribute;
namespace fs = std::filesystem;
using ds::summary::Event;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() / fmt::format("distribute-summary-{}-{}", getpid(), counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string bytes_of(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

/// The byte offsets at which the file's records start, walked with the framing's length fields
/// (8 bytes little-endian, then 4 of CRC, the data, 4 of CRC), independently of the reader.
std::vector<std::size_t> record_offsets(const std::string& file) {
  std::vector<std::size_t> offsets;
  std::size_t at = 0;
  while (at + 12 <= file.size()) {
    std::uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= std::uint64_t(static_cast<unsigned char>(file[at + i])) << (8 * i);
    offsets.push_back(at);
    at += 12 + length + 4;
  }
  REQUIRE(at == file.size());
  return offsets;
}

/// The message of what `f` throws as E (empty when it throws nothing).
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

std::shared_ptr<const ds::ClusterResolver> tf_config(std::string_view text) {
  return std::make_shared<ds::TFConfigClusterResolver>(text);
}

constexpr const char* kTwoWorkers = R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": %d}})";
std::string two_workers(int index) {
  std::string s = kTwoWorkers;
  s.replace(s.find("%d"), 2, std::to_string(index));
  return s;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_SUITE("summary") {

TEST_CASE("an Event's bytes are the protobuf wire format of event.proto/summary.proto") {
  // wall_time = 1 (fixed64 double 1.5 = 0x3FF8000000000000), step = 2 (varint 3), summary = 5
  // holding value = 1 { tag = 1 "a", simple_value = 2 (fixed32 float 2.0 = 0x40000000) }.
  Event e;
  e.wall_time = 1.5;
  e.step = 3;
  e.values.push_back({"a", 2.0f});
  CHECK(ds::summary::encode_event(e) == bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x10, 0x03, 0x2A, 0x0A, 0x0A, 0x08,
                                                  0x0A, 0x01, 'a', 0x15, 0, 0, 0, 0x40}));
  // A negative step is the ten-byte varint of its two's complement; a zero value is still written.
  Event negative;
  negative.wall_time = 0;
  negative.step = -1;
  negative.values.push_back({"z", 0.0f});
  CHECK(ds::summary::encode_event(negative) ==
        bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x2A,
                  0x0A, 0x0A, 0x08, 0x0A, 0x01, 'z', 0x15, 0, 0, 0, 0}));
  // The first event of a file: file_version = 3 "brain.Event:2"; step 0 is left out (proto3).
  Event version;
  version.wall_time = 2.0;
  version.file_version = "brain.Event:2";
  CHECK(ds::summary::encode_event(version) == bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x1A, 13}) + "brain.Event:2");
  // And back: decode_event reads them, skipping fields it does not know (here graph_def = 4).
  const Event back = ds::summary::decode_event(ds::summary::encode_event(negative) + bytes_of({0x22, 0x02, 'g', 'd'}));
  CHECK(back.step == -1);
  REQUIRE(back.values.size() == 1);
  CHECK(back.values[0].tag == "z");
  CHECK(back.values[0].simple_value == 0.0f);
}

TEST_CASE("SummaryWriter: one event file named like TF 2's, the version event first, every scalar read back") {
  TempDir dir;
  const double before = now_seconds();
  std::string path;
  {
    ds::SummaryWriter writer((dir.path / "run1").string());  // created with its parent
    CHECK(writer.writes());
    path = writer.path();
    for (int step = 0; step < 25; ++step) {
      writer.scalar("loss", 1.0 / (step + 1), step);
      writer.scalar("train/accuracy", step / 25.0, step);
    }
    writer.scalar("nan", std::numeric_limits<double>::quiet_NaN(), 7);
    writer.scalar("inf", -std::numeric_limits<double>::infinity(), std::numeric_limits<std::int64_t>::max());
  }  // the destructor flushes and closes
  const double after = now_seconds();
  REQUIRE(fs::path(path).parent_path() == dir.path / "run1");
  std::vector<fs::path> files(fs::directory_iterator(dir.path / "run1"), fs::directory_iterator{});
  REQUIRE(files.size() == 1);
  std::smatch m;
  const std::string name = files[0].filename().string();
  REQUIRE(std::regex_match(name, m, std::regex(R"(events\.out\.tfevents\.([0-9]{10})\.(.+)\.([0-9]+)\.([0-9]+)\.v2)")));
  CHECK(std::stoll(m[1].str()) >= static_cast<long long>(before) - 1);
  CHECK(std::stoll(m[1].str()) <= static_cast<long long>(after) + 1);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  CHECK(m[2].str() == host);
  CHECK(m[3].str() == std::to_string(getpid()));

  const auto events = ds::summary::read_event_file(path);
  REQUIRE(events.size() == 1 + 50 + 2);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].values.empty());
  double last = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    CHECK(events[i].wall_time >= last);  // monotonic, within the run
    CHECK(events[i].wall_time >= before - 1e-3);
    CHECK(events[i].wall_time <= after + 1e-3);
    last = events[i].wall_time;
  }
  for (int step = 0; step < 25; ++step) {
    const Event& loss = events[1 + 2 * step];
    const Event& accuracy = events[2 + 2 * step];
    CHECK(loss.step == step);
    REQUIRE(loss.values.size() == 1);
    CHECK(loss.values[0].tag == "loss");
    CHECK(loss.values[0].simple_value == static_cast<float>(1.0 / (step + 1)));
    CHECK(accuracy.values[0].tag == "train/accuracy");
    CHECK(accuracy.values[0].simple_value == static_cast<float>(step / 25.0));  // 0 at step 0: present
  }
  CHECK(std::isnan(*events[51].values[0].simple_value));
  CHECK(events[52].step == std::numeric_limits<std::int64_t>::max());
  CHECK(*events[52].values[0].simple_value == -std::numeric_limits<float>::infinity());
}

TEST_CASE("SummaryWriter: two writers in one process write two files; ds::summary::create_file_writer is the same") {
  TempDir dir;
  ds::SummaryWriter a(dir.path.string());
  auto b = ds::summary::create_file_writer(dir.path.string(), {.filename_suffix = ".mine"});
  CHECK(a.path() != b.path());
  CHECK(b.path().ends_with(".mine"));
  a.scalar("x", 1, 1);
  b.scalar("x", 2, 1);
  a.close();
  b.close();
  CHECK(ds::summary::read_event_file(a.path()).back().values[0].simple_value == 1.0f);
  CHECK(ds::summary::read_event_file(b.path()).back().values[0].simple_value == 2.0f);
}

TEST_CASE("SummaryWriter: events reach the file when more than max_queue are queued, at flush(), and when flush_interval passed") {
  TempDir dir;
  ds::SummaryWriter writer(dir.path.string(), {.max_queue = 3});
  auto on_disk = [&] { return ds::summary::read_event_file(writer.path()).size() - 1; };  // less the version event
  CHECK(on_disk() == 0);  // the version event is written at once (TensorBoard sees the run)
  for (int step = 1; step <= 3; ++step) writer.scalar("q", step, step);
  CHECK(on_disk() == 0);  // 3 queued: not more than max_queue
  writer.scalar("q", 4, 4);
  CHECK(on_disk() == 4);
  writer.scalar("q", 5, 5);
  CHECK(on_disk() == 4);
  writer.flush();
  CHECK(on_disk() == 5);

  ds::SummaryWriter every(dir.path.string(), {.max_queue = 100, .flush_interval = std::chrono::milliseconds(0)});
  every.scalar("q", 1, 1);
  CHECK(ds::summary::read_event_file(every.path()).size() == 2);
}

TEST_CASE("SummaryWriter: scalars from several threads are all written") {
  TempDir dir;
  ds::SummaryWriter writer(dir.path.string());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int step = 0; step < 200; ++step) writer.scalar(fmt::format("thread{}", t), t * 1000 + step, step);
    });
  }
  for (auto& th : threads) th.join();
  writer.close();
  const auto events = ds::summary::read_event_file(writer.path());
  REQUIRE(events.size() == 1 + 800);
  std::vector<int> next(4, 0);
  for (std::size_t i = 1; i < events.size(); ++i) {
    const int t = events[i].values[0].tag.back() - '0';
    REQUIRE((t >= 0 && t < 4));
    CHECK(events[i].step == next[t]);  // each thread's in its order
    CHECK(*events[i].values[0].simple_value == static_cast<float>(t * 1000 + next[t]));
    ++next[t];
  }
}

TEST_CASE("SummaryWriter: bad arguments give InvalidArgument with a message that says what is wrong") {
  TempDir dir;
  ds::SummaryWriter writer(dir.path.string());
  CHECK(error_of<ds::InvalidArgument>([&] { writer.scalar("", 1.0, 5); }) ==
        "SummaryWriter::scalar: the tag is empty (step 5)");
  for (const std::string& bad : {std::string("\xff"), std::string("ab\xc3"), std::string("\xc0\x80"),
                                std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80")}) {
    CAPTURE(bad.size());
    CHECK(error_of<ds::InvalidArgument>([&] { writer.scalar(bad, 1.0, 2); }) ==
          fmt::format("SummaryWriter::scalar: the tag is not valid UTF-8 ({} bytes, step 2)", bad.size()));
  }
  writer.scalar("\xc3\xa9t\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x93\x88", 1.0, 1);  // "été/€/📈" is fine
  writer.close();
  CHECK(error_of<ds::InvalidArgument>([&] { writer.scalar("loss", 1.0, 3); }) ==
        "SummaryWriter::scalar('loss'): the writer is closed");
  writer.flush();  // nothing to do, no error
  CHECK(ds::summary::read_event_file(writer.path()).back().values[0].tag == "\xc3\xa9t\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x93\x88");

  CHECK(error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w(""); }) == "SummaryWriter: the log directory is empty");
  CHECK(error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w(dir.path.string(), {.max_queue = -1}); }) ==
        "SummaryWriter: max_queue -1 is negative");
  CHECK(error_of<ds::InvalidArgument>([&] {
          ds::SummaryWriter w(dir.path.string(), {.flush_interval = std::chrono::milliseconds(-5)});
        }) == "SummaryWriter: flush_interval -5 ms is negative");
  CHECK(error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w(dir.path.string(), {.filename_suffix = "/x"}); }) ==
        "SummaryWriter: filename_suffix '/x' has a '/'");
}

TEST_CASE("SummaryWriter: a log directory that cannot be created or written is InvalidArgument naming it") {
  TempDir dir;
  const fs::path file = dir.path / "a_file";
  write_all(file, "x");
  CHECK(error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w(file.string()); }) ==
        fmt::format("SummaryWriter: cannot create the log directory '{}': a file of that name is in the way", file.string()));
  const fs::path under_file = file / "logs";
  CHECK(error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w(under_file.string()); }) ==
        fmt::format("SummaryWriter: cannot create the log directory '{}': Not a directory", under_file.string()));
  // /proc takes no new files, even from root: the directory is there, the event file cannot be made.
  const std::string in_proc = error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w("/proc"); });
  CHECK(in_proc.starts_with("SummaryWriter: cannot write an event file in '/proc': RecordWriter: cannot open "
                            "'/proc/events.out.tfevents."));
  CHECK(in_proc.ends_with("(No such file or directory)"));
  CHECK(error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w("/proc/distribute-logs"); }) ==
        "SummaryWriter: cannot create the log directory '/proc/distribute-logs': No such file or directory");
  if (geteuid() != 0) {  // root writes into read-only directories
    const fs::path read_only = dir.path / "read_only";
    fs::create_directories(read_only);
    fs::permissions(read_only, fs::perms::owner_read | fs::perms::owner_exec);
    const std::string message = error_of<ds::InvalidArgument>([&] { ds::SummaryWriter w(read_only.string()); });
    CHECK(message.starts_with(fmt::format("SummaryWriter: cannot write an event file in '{}': ", read_only.string())));
    CHECK(message.ends_with("(Permission denied)"));
    fs::permissions(read_only, fs::perms::owner_all);
  } else {
    MESSAGE("running as root: the read-only log directory case is skipped");
  }
}

TEST_CASE("read_event_file: a corrupted or truncated last record is DataLossError naming the file and the offset") {
  TempDir dir;
  std::string path;
  {
    ds::SummaryWriter writer(dir.path.string());
    for (int step = 0; step < 4; ++step) writer.scalar("loss", 0.5 * step, step);
    path = writer.path();
  }
  const std::string good = read_all(path);
  const auto offsets = record_offsets(good);
  REQUIRE(offsets.size() == 5);
  const std::size_t last = offsets.back();
  auto message_after = [&](const std::string& bytes) {
    write_all(path, bytes);
    return error_of<ds::data::DataLossError>([&] { ds::summary::read_event_file(path); });
  };
  const std::string where = fmt::format("record file '{}': ", path);
  {
    std::string flipped = good;
    flipped[last + 12 + 3] ^= 0x20;  // a byte of the last record's data
    CHECK(message_after(flipped) == where + fmt::format("corrupted record data (checksum mismatch) at byte offset {}", last));
  }
  {
    std::string flipped = good;
    flipped[last + 1] ^= 0x01;  // its length
    CHECK(message_after(flipped) == where + fmt::format("corrupted record length (checksum mismatch) at byte offset {}", last));
  }
  const std::size_t last_length = good.size() - last - 16;
  CHECK(message_after(good.substr(0, good.size() - 2)) == where + fmt::format("truncated record checksum at byte offset {}", last));
  CHECK(message_after(good.substr(0, last + 12 + last_length / 2)) ==
        where + fmt::format("truncated record of {} bytes at byte offset {}", last_length, last));
  CHECK(message_after(good.substr(0, last + 5)) == where + fmt::format("truncated record header at byte offset {}", last));
  // A length whose checksum is right but that claims more than the file holds (2^40 bytes).
  {
    std::string claims = good.substr(0, last + 12);
    unsigned char header[12];
    ds::data::detail::store_le(header, std::uint64_t{1} << 40, 8);
    ds::data::detail::store_le(header + 8, ds::data::detail::masked_crc32c(header, 8), 4);
    claims.replace(last, 12, reinterpret_cast<const char*>(header), 12);
    CHECK(message_after(claims) == where + fmt::format("truncated record of {} bytes at byte offset {}", std::uint64_t{1} << 40, last));
  }
  // Cut at a record boundary, the file is whole: the events before it.
  write_all(path, good.substr(0, last));
  CHECK(ds::summary::read_event_file(path).size() == 4);

  CHECK(error_of<ds::InvalidArgument>([&] { ds::summary::read_event_file((dir.path / "missing").string()); }) ==
        fmt::format("read_event_file: cannot open '{}' (No such file or directory)", (dir.path / "missing").string()));
}

TEST_CASE("read_event_file: a whole record that is not an Event message is DataLossError naming the record") {
  TempDir dir;
  const std::string path = (dir.path / "bad.tfevents").string();
  const std::string version = ds::summary::encode_event({.wall_time = 1, .step = 0, .file_version = "brain.Event:2", .values = {}});
  struct Case {
    std::string bytes, message;
  };
  for (const Case& c : std::vector<Case>{
           {bytes_of({0x2A, 0x05, 'a', 'b'}), "malformed Event message: length-delimited field longer than the message"},
           {bytes_of({0x08, 0x01}), "malformed Event message: field 1 has wire type 0, expected 1"},
           {bytes_of({0x10}), "malformed Event message: truncated or overlong varint"},
           {bytes_of({0x09, 1, 2, 3}), "malformed Event message: truncated 64-bit field"},
           {bytes_of({0x0B}), "malformed Event message: unsupported wire type 3"},
           {bytes_of({0x2A, 0x03, 0x0A, 0x05, 'x'}), "malformed Summary message: length-delimited field longer than the message"},
           {bytes_of({0x2A, 0x04, 0x0A, 0x02, 0x15, 0x01}), "malformed Summary.Value message: truncated 32-bit field"},
       }) {
    CAPTURE(c.message);
    ds::data::write_record_file(path, {version, c.bytes});
    CHECK(error_of<ds::data::DataLossError>([&] { ds::summary::read_event_file(path); }) ==
          fmt::format("event file '{}': record 1: {}", path, c.message));
  }
}

TEST_CASE("SummaryWriter in a cluster (TF_CONFIG): only the chief writes unless all_tasks; all_tasks gives each task its run") {
  TempDir dir;
  const std::string logdir = (dir.path / "logs").string();
  {
    ds::SummaryWriter worker1(logdir, {.cluster_resolver = tf_config(two_workers(1))});
    CHECK_FALSE(worker1.writes());
    CHECK(worker1.path().empty());
    worker1.scalar("loss", 1.0, 1);  // checked, not written
    CHECK(error_of<ds::InvalidArgument>([&] { worker1.scalar("", 1.0, 1); }) ==
          "SummaryWriter::scalar: the tag is empty (step 1)");
    worker1.flush();
  }
  CHECK_FALSE(fs::exists(logdir));  // nothing made on a task that does not write

  ds::SummaryWriter worker0(logdir, {.cluster_resolver = tf_config(two_workers(0))});  // worker 0: the chief
  CHECK(worker0.writes());
  CHECK(fs::path(worker0.path()).parent_path() == fs::path(logdir));

  // With a chief job, worker 0 is not the chief.
  const std::string with_chief =
      R"({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}})";
  CHECK_FALSE(ds::SummaryWriter(logdir, {.cluster_resolver = tf_config(with_chief)}).writes());

  ds::SummaryWriter all1(logdir, {.all_tasks = true, .cluster_resolver = tf_config(two_workers(1))});
  ds::SummaryWriter all0(logdir, {.all_tasks = true, .cluster_resolver = tf_config(two_workers(0))});
  CHECK(all1.writes());
  CHECK(all1.logdir() == (fs::path(logdir) / "worker_1").string());
  CHECK(fs::path(all1.path()).parent_path() == fs::path(logdir) / "worker_1");
  CHECK(fs::path(all0.path()).parent_path() == fs::path(logdir) / "worker_0");
}

TEST_CASE("SummaryWriter decides the chief from the TF_CONFIG environment variable by default; a bad TF_CONFIG is ClusterConfigError") {
  TempDir dir;
  struct RestoreTfConfig {
    std::optional<std::string> old;
    RestoreTfConfig() {
      if (const char* v = std::getenv("TF_CONFIG")) old = v;
    }
    ~RestoreTfConfig() {
      if (old) setenv("TF_CONFIG", old->c_str(), 1);
      else unsetenv("TF_CONFIG");
    }
  } restore;
  setenv("TF_CONFIG", two_workers(1).c_str(), 1);
  CHECK_FALSE(ds::SummaryWriter(dir.path.string()).writes());
  setenv("TF_CONFIG", two_workers(0).c_str(), 1);
  CHECK(ds::SummaryWriter(dir.path.string()).writes());
  unsetenv("TF_CONFIG");  // one process: the chief
  CHECK(ds::SummaryWriter(dir.path.string()).writes());
  setenv("TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}})", 1);
  const std::string message = error_of<ds::ClusterConfigError>([&] { ds::SummaryWriter w(dir.path.string()); });
  CHECK(message.find("TF_CONFIG") != std::string::npos);
  CHECK(message.find("3") != std::string::npos);
}

}  // TEST_SUITE("summary")
