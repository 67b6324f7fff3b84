// data/: Dataset sources and transformations, record files, prefetch threads, and the
// DistributedDataset of distribute_dataset / distribute_datasets_from_function (rebatching,
// autosharding, the end-of-data agreement). The cases in TEST_SUITE "data_multi_worker" start
// real worker processes (tests/data_worker_helper.cpp); they run as the 'data_multi_worker'
// test, which sets DISTRIBUTE_DATA_WORKER_HELPER (and fail without it).
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/processes.hpp"

namespace ds = distribute;
namespace data = distribute::data;
using namespace std::chrono_literals;
using I64 = std::int64_t;

namespace {

template <class T>
std::vector<T> values(const ds::Tensor<T>& t) {
  return t.values();
}

/// Each step's per-replica batches as plain vectors: steps[s][replica] = that replica's rows.
template <class D>
std::vector<std::vector<std::vector<I64>>> steps_of(const D& dist) {
  std::vector<std::vector<std::vector<I64>>> out;
  for (const auto& per_replica : dist) {
    std::vector<std::vector<I64>> step;
    for (const auto& batch : per_replica.values()) step.push_back(batch.values());
    out.push_back(step);
  }
  return out;
}

/// A fresh directory under the system's temp directory, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           fmt::format("distribute_test_data_{}_{}", static_cast<long>(getpid()), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

/// Files of integer lines: file f holds counts[f] lines 1000*f + j. Returns the file names.
std::vector<std::string> write_number_files(const TempDir& dir, const std::vector<int>& counts) {
  std::vector<std::string> files;
  for (std::size_t f = 0; f < counts.size(); ++f) {
    files.push_back(dir.file(fmt::format("part-{}.csv", f)));
    std::string text;
    for (int j = 0; j < counts[f]; ++j) text += fmt::format("{}\n", 1000 * static_cast<int>(f) + j);
    write_text(files.back(), text);
  }
  return files;
}

I64 parse_line(const std::string& line) { return std::stoll(line); }

}  // namespace

// ---- sources -----------------------------------------------------------------------------------

TEST_CASE("range, from_vector, from_generator; every dataset is re-iterable") {
  CHECK(data::range(5).to_vector() == std::vector<I64>{0, 1, 2, 3, 4});
  CHECK(data::range(2, 11, 3).to_vector() == std::vector<I64>{2, 5, 8});
  CHECK(data::range(5, 0, -2).to_vector() == std::vector<I64>{5, 3, 1});
  CHECK(data::range(0).to_vector().empty());
  CHECK_THROWS_WITH_AS(data::range(0, 5, 0), "range: step must not be 0", ds::InvalidArgument);

  auto words = data::from_vector<std::string>({"a", "b", "c"});
  CHECK(words.to_vector() == std::vector<std::string>{"a", "b", "c"});
  CHECK(words.to_vector() == words.to_vector());  // a second pass starts over
  CHECK(data::Dataset<int>().to_vector().empty());

  // The generator's state lives in its captures, and each pass calls its own copy.
  auto gen = data::from_generator([i = 0]() mutable -> std::optional<int> {
    if (i < 4) return i++ * 10;
    return std::nullopt;
  });
  static_assert(std::is_same_v<decltype(gen), data::Dataset<int>>);
  CHECK(gen.to_vector() == std::vector<int>{0, 10, 20, 30});
  CHECK(gen.to_vector() == std::vector<int>{0, 10, 20, 30});

  // Iterators: an element is pulled when first looked at; ++ without a look skips one.
  auto it = data::range(3).begin();
  ++it;
  CHECK(*it == 1);
  CHECK(*it == 1);
  ++it;
  ++it;
  CHECK(it == std::default_sentinel);
  CHECK_THROWS_AS(*it, ds::InvalidArgument);
}

TEST_CASE("from_tensor_slices slices along axis 0, component-wise for pairs and tuples") {
  ds::Tensor<float> t({3, 2}, {1, 2, 3, 4, 5, 6});
  auto rows = data::from_tensor_slices(t).to_vector();
  REQUIRE(rows.size() == 3);
  CHECK(rows[1] == ds::Tensor<float>({2}, {3, 4}));
  // A rank-1 tensor gives rank-0 tensors; a std::vector gives its elements.
  CHECK(data::from_tensor_slices(ds::Tensor<int>{7, 8}).to_vector() ==
        std::vector<ds::Tensor<int>>{ds::Tensor<int>::scalar(7), ds::Tensor<int>::scalar(8)});
  CHECK(data::from_tensor_slices(std::vector<double>{1.5, 2.5}).to_vector() == std::vector<double>{1.5, 2.5});

  auto pairs = data::from_tensor_slices(std::make_pair(t, std::vector<int>{7, 8, 9}));
  static_assert(std::is_same_v<decltype(pairs), data::Dataset<std::pair<ds::Tensor<float>, int>>>);
  auto p = pairs.to_vector();
  REQUIRE(p.size() == 3);
  CHECK(p[2].first == ds::Tensor<float>({2}, {5, 6}));
  CHECK(p[2].second == 9);
  auto triples = data::from_tensor_slices(std::make_tuple(std::vector<int>{1, 2}, t.reshape({2, 3}),
                                                          std::vector<std::string>{"x", "y"}));
  CHECK(std::get<2>(triples.to_vector()[1]) == "y");

  CHECK_THROWS_WITH_AS(data::from_tensor_slices(ds::Tensor<float>::scalar(1)),
                       "from_tensor_slices: a tensor of shape () has no axis 0 to split", ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(data::from_tensor_slices(std::make_pair(t, std::vector<int>{1, 2, 3, 4})),
                       doctest::Contains("from_tensor_slices: component 0 has 3 rows but component 1 has 4"),
                       ds::InvalidArgument);
}

TEST_CASE("from_text_files: lines of several files in order, CRLF too; a missing file names its path") {
  TempDir dir;
  write_text(dir.file("a.csv"), "1,x\n2,y\n");
  write_text(dir.file("b.csv"), "3,z\r\n4,w");  // CRLF and no final line end
  write_text(dir.file("empty.csv"), "");
  auto lines = data::from_text_files({dir.file("a.csv"), dir.file("empty.csv"), dir.file("b.csv")});
  CHECK(lines.to_vector() == std::vector<std::string>{"1,x", "2,y", "3,z", "4,w"});
  CHECK(lines.to_vector().size() == 4);  // files reopen on every pass

  auto missing = data::from_text_files({dir.file("a.csv"), dir.file("nope.csv")});
  const std::string message = "from_text_files: cannot open '" + dir.file("nope.csv") + "'";
  CHECK_THROWS_WITH_AS(missing.to_vector(), doctest::Contains(message.c_str()), ds::InvalidArgument);
}

TEST_CASE("record files (TFRecord): CRC-32C, round trip, truncation and corruption are DataLossError") {
  const std::string check = "123456789";
  CHECK(data::detail::crc32c(check.data(), check.size()) == 0xE3069283u);  // the standard CRC-32C check value

  TempDir dir;
  const std::vector<std::string> records{"first", "", std::string("bin\0ary\xff", 8), std::string(100000, 'z')};
  data::write_record_file(dir.file("a.tfrecord"), records);
  data::write_record_file(dir.file("b.tfrecord"), {"last"});
  // Layout: u64 length, u32 masked crc of it, payload, u32 masked crc of the payload.
  CHECK(std::filesystem::file_size(dir.file("b.tfrecord")) == 8 + 4 + 4 + 4);
  auto read = data::from_record_files({dir.file("a.tfrecord"), dir.file("b.tfrecord")}).to_vector();
  std::vector<std::string> want = records;
  want.push_back("last");
  CHECK(read == want);

  // Flip one payload byte of the first record.
  {
    std::fstream f(dir.file("a.tfrecord"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12 + 2);
    f.put('X');
  }
  CHECK_THROWS_WITH_AS(data::from_record_files({dir.file("a.tfrecord")}).to_vector(),
                       doctest::Contains("corrupted record data (checksum mismatch) at byte offset 0"),
                       data::DataLossError);
  // Cut the second file short.
  std::filesystem::resize_file(dir.file("b.tfrecord"), 8 + 4 + 2);
  CHECK_THROWS_WITH_AS(data::from_record_files({dir.file("b.tfrecord")}).to_vector(),
                       doctest::Contains("truncated record of 4 bytes"), data::DataLossError);
  CHECK_THROWS_AS(data::from_record_files({dir.file("none.tfrecord")}).to_vector(), ds::InvalidArgument);
}

TEST_CASE("record files: a header claiming more than the file holds is DataLossError, with no more memory than the file") {
  TempDir dir;
  // A 12-byte header whose length checksum is right, claiming 3 GiB, 2^40 and 2^62 bytes, then 5
  // bytes of payload (event files: test_summary.cpp).
  auto claim = [&](std::uint64_t length) {
    unsigned char header[12];
    data::detail::store_le(header, length, 8);
    data::detail::store_le(header + 8, data::detail::masked_crc32c(header, 8), 4);
    const std::string path = dir.file(fmt::format("claims-{}.tfrecord", length));
    std::ofstream(path, std::ios::binary) << std::string(reinterpret_cast<const char*>(header), sizeof header) << "hello";
    return path;
  };
  for (const std::uint64_t length : {std::uint64_t{3} << 30, std::uint64_t{1} << 40, std::uint64_t{1} << 62}) {
    CAPTURE(length);
    const std::string path = claim(length);
    CHECK_THROWS_WITH_AS(data::from_record_files({path}).to_vector(),
                         fmt::format("record file '{}': truncated record of {} bytes at byte offset 0", path, length).c_str(),
                         data::DataLossError);
  }
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // they reserve terabytes of address space
  // Read in a child whose address space is capped at 256 MiB above what it maps now: the 3 GiB
  // claim must not try to allocate it.
  const std::string path = claim(std::uint64_t{3} << 30);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::ifstream status("/proc/self/statm");
    std::uint64_t pages = 0;
    status >> pages;
    const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{256} << 20);
    const ::rlimit limit{cap, cap};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(3);
    try {
      data::RecordReader(path).next();
      ::_exit(4);
    } catch (const data::DataLossError&) {
      ::_exit(0);
    } catch (const std::bad_alloc&) {
      ::_exit(1);
    } catch (...) {
      ::_exit(2);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK_MESSAGE(WEXITSTATUS(status) == 0, "exit 1: bad_alloc; 2: another error; 3: setrlimit failed; 4: no error");
#endif
}

// ---- transformations --------------------------------------------------------------------------

TEST_CASE("batch stacks along a new axis 0; the last partial batch is kept unless dropped") {
  auto b = data::range(7).batch(3);
  static_assert(std::is_same_v<decltype(b), data::Dataset<ds::Tensor<I64>>>);
  auto batches = b.to_vector();
  REQUIRE(batches.size() == 3);
  CHECK(batches[0] == ds::Tensor<I64>({3}, {0, 1, 2}));
  CHECK(batches[2] == ds::Tensor<I64>({1}, {6}));
  CHECK(data::range(7).batch(3, true).to_vector().size() == 2);
  CHECK(data::range(6).batch(3, true).to_vector().size() == 2);
  CHECK(data::range(0).batch(3).to_vector().empty());

  // Tensors: (4, 2, 3) sliced and batched by 2 is two (2, 2, 3) halves of it.
  std::vector<float> v(24);
  std::iota(v.begin(), v.end(), 0.0f);
  ds::Tensor<float> t({4, 2, 3}, v);
  auto tb = data::from_tensor_slices(t).batch(2).to_vector();
  REQUIRE(tb.size() == 2);
  CHECK(tb[1].shape() == ds::Shape{2, 2, 3});
  CHECK(tb[1].values() == std::vector<float>(v.begin() + 12, v.end()));

  // std::vector and std::array elements become rows of a Tensor.
  auto vb = data::from_vector<std::vector<float>>({{1, 2}, {3, 4}, {5, 6}}).batch(2).to_vector();
  CHECK(vb[0] == ds::Tensor<float>({2, 2}, {1, 2, 3, 4}));
  CHECK(vb[1] == ds::Tensor<float>({1, 2}, {5, 6}));
  auto ab = data::from_vector<std::array<int, 3>>({{1, 2, 3}, {4, 5, 6}}).batch(5).to_vector();
  CHECK(ab[0] == ds::Tensor<int>({2, 3}, {1, 2, 3, 4, 5, 6}));
  // Batches of batches: a second batch adds another axis.
  CHECK(data::range(8).batch(2).batch(2).to_vector()[1].shape() == ds::Shape{2, 2});
}

TEST_CASE("batch works component-wise on pairs and tuples; other types batch into std::vector") {
  auto pairs = data::from_vector<std::pair<int, std::vector<float>>>({{1, {1, 2}}, {2, {3, 4}}, {3, {5, 6}}});
  auto pb = pairs.batch(2);
  static_assert(std::is_same_v<decltype(pb), data::Dataset<std::pair<ds::Tensor<int>, ds::Tensor<float>>>>);
  auto first = pb.to_vector()[0];
  CHECK(first.first == ds::Tensor<int>{1, 2});
  CHECK(first.second == ds::Tensor<float>({2, 2}, {1, 2, 3, 4}));

  using Row = std::tuple<double, std::string, ds::Tensor<double>>;
  auto tuples = data::from_vector<Row>({{0.5, "a", ds::Tensor<double>{1, 2}}, {1.5, "b", ds::Tensor<double>{3, 4}}});
  auto tb = tuples.batch(2).to_vector();
  static_assert(std::is_same_v<decltype(tb)::value_type,
                               std::tuple<ds::Tensor<double>, std::vector<std::string>, ds::Tensor<double>>>);
  CHECK(std::get<0>(tb[0]) == ds::Tensor<double>{0.5, 1.5});
  CHECK(std::get<1>(tb[0]) == std::vector<std::string>{"a", "b"});
  CHECK(std::get<2>(tb[0]) == ds::Tensor<double>({2, 2}, {1, 2, 3, 4}));
}

TEST_CASE("batch: elements of different shapes are InvalidArgument naming both shapes") {
  auto vectors = data::from_vector<std::vector<float>>({{1, 2}, {3, 4}, {5, 6, 7}});
  CHECK_THROWS_WITH_AS(vectors.batch(3).to_vector(),
                       "batch: element 0 of the batch has shape (2,) but element 2 has shape (3,); a batch stacks "
                       "elements of one shape",
                       ds::InvalidArgument);
  auto tensors = data::from_vector<ds::Tensor<int>>({ds::Tensor<int>({2, 2}, {1, 2, 3, 4}), ds::Tensor<int>{1, 2}});
  CHECK_THROWS_WITH_AS(tensors.batch(2).to_vector(), doctest::Contains("shape (2, 2) but element 1 has shape (2,)"),
                       ds::InvalidArgument);
  auto pairs = data::from_vector<std::pair<int, ds::Tensor<int>>>({{1, ds::Tensor<int>{1}}, {2, ds::Tensor<int>{1, 2}}});
  CHECK_THROWS_WITH_AS(pairs.batch(2).to_vector(),
                       doctest::Contains("batch (component 1): element 0 of the batch has shape (1,) but element 1 "
                                         "has shape (2,)"),
                       ds::InvalidArgument);
  // The shapes of separate batches may differ (only one batch is stacked at a time).
  CHECK(vectors.batch(2).to_vector().size() == 2);
  CHECK_THROWS_WITH_AS(data::range(3).batch(0), "batch: batch_size must be at least 1, got 0", ds::InvalidArgument);
}

TEST_CASE("shard, take, repeat, map") {
  CHECK(data::range(10).shard(3, 1).to_vector() == std::vector<I64>{1, 4, 7});
  CHECK(data::range(10).shard(3, 0).to_vector() == std::vector<I64>{0, 3, 6, 9});
  CHECK(data::range(2).shard(3, 2).to_vector().empty());
  CHECK_THROWS_WITH_AS(data::range(3).shard(2, 2), "shard: index 2 is out of range for 2 shards (valid: [0, 2))",
                       ds::InvalidArgument);
  CHECK_THROWS_AS(data::range(3).shard(0, 0), ds::InvalidArgument);
  CHECK_THROWS_AS(data::range(3).shard(2, -1), ds::InvalidArgument);

  CHECK(data::range(10).take(3).to_vector() == std::vector<I64>{0, 1, 2});
  CHECK(data::range(10).take(-1).to_vector().size() == 10);
  CHECK(data::range(10).take(0).to_vector().empty());
  CHECK(data::range(4).take(100).to_vector().size() == 4);
  // take pulls no more than it returns.
  int pulled = 0;
  auto counting = data::from_generator([&pulled]() -> std::optional<int> { return pulled++; });
  CHECK(counting.take(5).to_vector() == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(pulled == 5);

  CHECK(data::range(3).repeat(2).to_vector() == std::vector<I64>{0, 1, 2, 0, 1, 2});
  CHECK(data::range(3).repeat().take(7).to_vector() == std::vector<I64>{0, 1, 2, 0, 1, 2, 0});
  CHECK(data::range(3).repeat(0).to_vector().empty());
  CHECK(data::range(0).repeat().to_vector().empty());  // an empty pass ends an endless repeat
  CHECK(data::range(5).batch(2).repeat(2).to_vector().size() == 6);

  auto strings = data::range(3).map([](I64 x) { return std::to_string(x * x); });
  static_assert(std::is_same_v<decltype(strings), data::Dataset<std::string>>);
  CHECK(strings.to_vector() == std::vector<std::string>{"0", "1", "4"});
  // A pair or tuple element may be taken whole or unpacked into the function's parameters.
  auto pairs = data::range(3).map([](I64 x) { return std::make_pair(x, 2.5 * static_cast<double>(x)); });
  CHECK(pairs.map([](I64 a, double b) { return static_cast<double>(a) + b; }).to_vector() ==
        std::vector<double>{0, 3.5, 7});
  CHECK(pairs.map([](const std::pair<I64, double>& p) { return p.first; }).to_vector() == std::vector<I64>{0, 1, 2});
  // Each pass runs its own copy of a stateful function.
  auto numbered = data::from_vector<std::string>({"a", "b"}).map([n = 0](const std::string& s) mutable {
    return s + std::to_string(n++);
  });
  CHECK(numbered.to_vector() == std::vector<std::string>{"a0", "b1"});
  CHECK(numbered.to_vector() == std::vector<std::string>{"a0", "b1"});
}

TEST_CASE("shuffle: a permutation, deterministic for a seed, reshuffled per pass") {
  auto base = data::range(100);
  auto a = base.shuffle(100, 7).to_vector();
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == base.to_vector());
  CHECK(a != base.to_vector());
  CHECK(base.shuffle(100, 7).to_vector() == a);   // another dataset, the same seed: the same order
  CHECK(base.shuffle(100, 8).to_vector() != a);   // another seed
  // The same on every machine and standard library (the order is part of the contract that lets
  // workers agree under AutoShardPolicy::Data); cross-checked with an independent Python
  // implementation of mt19937_64 and the algorithm.
  CHECK(data::range(10).shuffle(10, 42).to_vector() == std::vector<I64>{7, 5, 8, 3, 4, 1, 0, 2, 6, 9});

  // Each pass of one dataset draws the next order of the seed's sequence, reproducibly.
  auto shuffled = base.shuffle(100, 7);
  auto pass1 = shuffled.to_vector(), pass2 = shuffled.to_vector();
  CHECK(pass1 == a);
  CHECK(pass2 != pass1);
  auto again = base.shuffle(100, 7);
  again.to_vector();
  CHECK(again.to_vector() == pass2);
  auto fixed = base.shuffle(100, 7, /*reshuffle_each_iteration=*/false);
  CHECK(fixed.to_vector() == fixed.to_vector());
  // shuffle before repeat reshuffles each repetition.
  auto twice = base.shuffle(100, 3).repeat(2).to_vector();
  CHECK(std::vector<I64>(twice.begin(), twice.begin() + 100) != std::vector<I64>(twice.begin() + 100, twice.end()));

  // A buffer of 1 keeps the order; a small buffer only moves elements forward by a bounded amount.
  CHECK(base.shuffle(1, 5).to_vector() == base.to_vector());
  auto local = base.shuffle(4, 5).to_vector();
  for (std::size_t i = 0; i < local.size(); ++i) CHECK(local[i] <= static_cast<I64>(i) + 3);
  CHECK_THROWS_WITH_AS(base.shuffle(0, 1), "shuffle: buffer_size must be at least 1, got 0", ds::InvalidArgument);
}

TEST_CASE("with_options carries the AutoShardPolicy through transformations") {
  auto d = data::range(10);
  CHECK(d.options().auto_shard_policy == data::AutoShardPolicy::Auto);
  auto o = d.with_options({.auto_shard_policy = data::AutoShardPolicy::Data});
  CHECK(o.options().auto_shard_policy == data::AutoShardPolicy::Data);
  CHECK(o.map([](I64 x) { return x; }).shuffle(3, 1).batch(2).prefetch(1).options().auto_shard_policy ==
        data::AutoShardPolicy::Data);
  CHECK(o.to_vector() == d.to_vector());
  CHECK(fmt::format("{} {}", data::AutoShardPolicy::File, data::AutoShardPolicy::Off) == "FILE OFF");
}

// ---- prefetch ---------------------------------------------------------------------------------

TEST_CASE("prefetch yields the same elements, from a bounded buffer filled by a background thread") {
  auto d = data::range(1000).map([](I64 x) { return x * 3; }).batch(7);
  CHECK(d.prefetch(1).to_vector() == d.to_vector());
  CHECK(d.prefetch(16).to_vector() == d.to_vector());
  CHECK(d.prefetch(2).prefetch(3).to_vector() == d.to_vector());  // nested background threads

  std::atomic<int> produced{0};
  auto counted = data::from_generator([&produced, i = 0]() mutable -> std::optional<int> {
    ++produced;
    return i++;
  });
  auto it = counted.prefetch(4).begin();
  CHECK(*it == 0);
  std::this_thread::sleep_for(100ms);
  // At most the buffer (4), the element handed out, and one in the producer's hands.
  CHECK(produced.load() <= 6);
  CHECK_THROWS_WITH_AS(data::range(3).prefetch(0), "prefetch: buffer_size must be at least 1, got 0",
                       ds::InvalidArgument);
}

TEST_CASE("prefetch: an exception in the producer reaches the consumer after the elements before it") {
  auto failing = data::from_generator([i = 0]() mutable -> std::optional<int> {
    if (i == 3) throw std::runtime_error("generator failed at 3");
    return i++;
  });
  std::vector<int> seen;
  auto consume = [&](const data::Dataset<int>& d) {
    seen.clear();
    for (int x : d) seen.push_back(x);
  };
  CHECK_THROWS_WITH_AS(consume(failing.prefetch(2)), "generator failed at 3", std::runtime_error);
  CHECK(seen == std::vector<int>{0, 1, 2});
  // Through map and batch inside the prefetched part, and a DataLossError keeps its type.
  auto mapped = data::range(10).map([](I64 x) {
    if (x == 5) throw data::DataLossError("bad element 5");
    return x;
  });
  CHECK_THROWS_WITH_AS(mapped.batch(2).prefetch(3).to_vector(), "bad element 5", data::DataLossError);
  // After the error the iterator is at its end.
  auto it = failing.prefetch(2).begin();
  for (int k = 0; k < 3; ++k) ++it;
  CHECK_THROWS_AS((void)(it == std::default_sentinel), std::runtime_error);
  CHECK(it == std::default_sentinel);
}

TEST_CASE("prefetch: destroying a half-read dataset iterator stops its thread promptly") {
  std::atomic<int> produced{0};
  auto endless = data::from_generator([&produced, i = 0]() mutable -> std::optional<int> {
    ++produced;
    return i++;
  });
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 20; ++round) {
    int read = 0;
    for (int x : endless.map([](int v) { return v + 1; }).prefetch(8)) {
      CHECK(x == read + 1);
      if (++read == 3) break;  // leaves the loop with the producer running (or blocked on a full buffer)
    }
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  const int after = produced.load();
  std::this_thread::sleep_for(50ms);
  CHECK(produced.load() == after);  // no producer outlived its iterator

  // A slow stage: the destructor waits for the element in progress only, not for the rest.
  auto slow = data::range(1000000).map([](I64 x) {
    std::this_thread::sleep_for(20ms);
    return x;
  });
  const auto t0 = std::chrono::steady_clock::now();
  {
    auto it = slow.prefetch(2).prefetch(2).begin();
    CHECK(*it == 0);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}

// ---- DistributedDataset -----------------------------------------------------------------------

TEST_CASE("distribute_dataset rebatches each global batch with TF's rule") {
  using Steps = std::vector<std::vector<std::vector<I64>>>;
  ds::MirroredStrategy<> three(3), two(2), five(5);
  // TF's documented examples.
  CHECK(steps_of(three.distribute_dataset(data::range(8).batch(4))) ==
        Steps{{{0, 1}, {2, 3}, {}}, {{4, 5}, {6, 7}, {}}});
  CHECK(steps_of(two.distribute_dataset(data::range(6).batch(4))) == Steps{{{0, 1}, {2, 3}}, {{4}, {5}}});
  CHECK(steps_of(two.distribute_dataset(data::range(4).batch(2))) == Steps{{{0}, {1}}, {{2}, {3}}});
  CHECK(steps_of(five.distribute_dataset(data::range(4).batch(4))) == Steps{{{0}, {1}, {2}, {3}, {}}});
  CHECK(steps_of(two.distribute_dataset(data::range(5).batch(4, true))) == Steps{{{0, 1}, {2, 3}}});
  CHECK(steps_of(three.distribute_dataset(data::range(0).batch(4))).empty());

  // One replica gets the whole global batch.
  ds::OneDeviceStrategy<> one;
  CHECK(steps_of(one.distribute_dataset(data::range(5).batch(2))) == Steps{{{0, 1}}, {{2, 3}}, {{4}}});

  // The iteration yields PerReplica values of the strategy; a second pass starts over.
  auto dist = three.distribute_dataset(data::range(8).batch(4));
  static_assert(std::is_same_v<decltype(*dist.begin()), ds::PerReplica<ds::Tensor<I64>, ds::MirroredStrategy<>>&>);
  CHECK(steps_of(dist) == steps_of(dist));
  CHECK(dist.num_replicas_in_sync() == 3);
  CHECK(dist.auto_shard_policy() == data::AutoShardPolicy::Off);  // one worker: nothing to shard
  // Empty pieces keep the inner shape of the batch.
  auto rows = three.distribute_dataset(data::from_tensor_slices(ds::Tensor<float>({2, 3}, std::vector<float>(6, 1.0f))).batch(2));
  auto step = *rows.begin();
  CHECK(step[0].shape() == ds::Shape{1, 3});
  CHECK(step[2].shape() == ds::Shape{0, 3});
}

TEST_CASE("distribute_dataset: pairs split component-wise, string batches as vectors; run unwraps the batches") {
  ds::MirroredStrategy<> two(2);
  std::vector<float> features(12);
  std::iota(features.begin(), features.end(), 0.0f);
  auto pairs = data::from_tensor_slices(std::make_pair(ds::Tensor<float>({6, 2}, features), std::vector<int>{0, 1, 2, 3, 4, 5}));
  std::vector<std::pair<ds::Shape, std::vector<int>>> seen;
  std::vector<I64> rows_per_step;
  for (const auto& batch : two.distribute_dataset(pairs.batch(4))) {
    auto result = two.run(
        [](ds::ReplicaContext& ctx, const std::pair<ds::Tensor<float>, ds::Tensor<int>>& b) {
          auto rows = ctx.all_reduce("sum", std::vector<I64>{static_cast<I64>(b.second.size())});
          return std::make_tuple(b.first.shape(), b.second.values(), rows[0]);
        },
        batch);
    for (std::size_t r = 0; r < 2; ++r) seen.emplace_back(std::get<0>(result)[r], std::get<1>(result)[r]);
    rows_per_step.push_back(std::get<2>(result)[0]);
  }
  CHECK(rows_per_step == std::vector<I64>{4, 2});
  REQUIRE(seen.size() == 4);
  CHECK(seen[0] == std::make_pair(ds::Shape{2, 2}, std::vector<int>{0, 1}));
  CHECK(seen[1] == std::make_pair(ds::Shape{2, 2}, std::vector<int>{2, 3}));
  CHECK(seen[2] == std::make_pair(ds::Shape{1, 2}, std::vector<int>{4}));
  CHECK(seen[3] == std::make_pair(ds::Shape{1, 2}, std::vector<int>{5}));

  TempDir dir;
  write_text(dir.file("w.txt"), "a\nb\nc\n");
  auto words = two.distribute_dataset(data::from_text_files({dir.file("w.txt")}).batch(3));
  auto first = *words.begin();
  CHECK(first[0] == std::vector<std::string>{"a", "b"});
  CHECK(first[1] == std::vector<std::string>{"c"});
}

TEST_CASE("reduce(Mean, per-replica loss, axis 0) over an uneven last batch equals the plain mean") {
  ds::MirroredStrategy<> three(3);
  std::vector<float> xs;
  for (int i = 0; i < 10; ++i) xs.push_back(0.5f * static_cast<float>(i) + 1.0f);
  // Global batches of 4, 4, 2: the last one splits into 1, 1 and 0 rows.
  auto dist = three.distribute_dataset(data::from_vector(xs).batch(4));
  std::size_t start = 0;
  double total = 0;
  int steps = 0;
  for (const auto& batch : dist) {
    auto loss = three.run(
        [](const ds::Tensor<float>& x) {
          ds::Tensor<float> l = x;
          for (auto& v : l) v = v * v;
          return l;
        },
        batch);
    const std::size_t n = std::min<std::size_t>(4, xs.size() - start);
    double plain = 0;
    for (std::size_t i = start; i < start + n; ++i) plain += double(xs[i]) * xs[i];
    plain /= static_cast<double>(n);
    auto mean = three.reduce(ds::ReduceOp::Mean, loss, 0);
    CHECK(mean.shape() == ds::Shape{});
    CHECK(mean[0] == doctest::Approx(plain));
    auto sum = three.reduce(ds::ReduceOp::Sum, loss, 0);
    total += sum[0];
    start += n;
    ++steps;
  }
  CHECK(steps == 3);
  double all = 0;
  for (float x : xs) all += double(x) * x;
  CHECK(total == doctest::Approx(all));
}

TEST_CASE("distribute_dataset: errors in the pipeline reach the loop; prefetching starts with the pass") {
  ds::MirroredStrategy<> two(2);
  auto failing = data::range(10).map([](I64 x) {
    if (x == 6) throw std::runtime_error("bad row 6");
    return x;
  });
  int steps = 0;
  auto loop = [&] {
    for (const auto& b : two.distribute_dataset(failing.batch(2))) {
      (void)b;
      ++steps;
    }
  };
  CHECK_THROWS_WITH_AS(loop(), "bad row 6", std::runtime_error);
  CHECK(steps == 3);  // rows 0..5 made three steps; the global batch holding row 6 fails

  std::atomic<int> pulled{0};
  auto counted = data::from_generator([&pulled, i = 0]() mutable -> std::optional<I64> {
    ++pulled;
    return i++;
  });
  auto dist = two.distribute_dataset(counted.batch(2));
  std::this_thread::sleep_for(20ms);
  CHECK(pulled.load() == 0);  // nothing runs before a pass begins
  {
    auto it = dist.begin();
    auto step = it.get_next_as_optional();
    REQUIRE(step);
    CHECK((*step)[1].values() == std::vector<I64>{1});
  }  // leaving the pass early stops its prefetch thread
  const int after = pulled.load();
  std::this_thread::sleep_for(20ms);
  CHECK(pulled.load() == after);
}

TEST_CASE("autosharding across workers: which rows or files a worker keeps (worker placement simulated)") {
  using S = ds::MirroredStrategy<>;
  using Steps = std::vector<std::vector<std::vector<I64>>>;
  // Worker 1 of 3, one replica each: Data keeps piece 1 of every global batch.
  const data::InputPlacement w1{.num_workers = 3, .worker_index = 1, .num_local_replicas = 1,
                                        .num_replicas_in_sync = 3};
  auto by_data = data::distribute_dataset<S>(
      data::range(12).batch(6).with_options({.auto_shard_policy = data::AutoShardPolicy::Data}), w1, nullptr);
  CHECK(by_data.auto_shard_policy() == data::AutoShardPolicy::Data);
  CHECK(steps_of(by_data) == Steps{{{2, 3}}, {{8, 9}}});
  // Auto without files is Data.
  CHECK(data::distribute_dataset<S>(data::range(12).batch(6), w1, nullptr).auto_shard_policy() ==
        data::AutoShardPolicy::Data);
  // Off: every piece of every global batch, one per step.
  auto off = data::distribute_dataset<S>(
      data::range(6).batch(6).with_options({.auto_shard_policy = data::AutoShardPolicy::Off}), w1, nullptr);
  CHECK(steps_of(off) == Steps{{{0, 1}}, {{2, 3}}, {{4, 5}}});

  TempDir dir;
  auto files = write_number_files(dir, {2, 1, 3, 1});
  auto numbers = data::from_text_files(files).map(parse_line).batch(3);
  // File: worker 1 reads files 1 (1000) and, with 3 workers, nothing else; Auto picks File.
  auto by_file = data::distribute_dataset<S>(numbers, w1, nullptr);
  CHECK(by_file.auto_shard_policy() == data::AutoShardPolicy::File);
  CHECK(steps_of(by_file) == Steps{{{1000}}, {{}}, {{}}});
  const data::InputPlacement w0{.num_workers = 3, .worker_index = 0, .num_local_replicas = 1,
                                        .num_replicas_in_sync = 3};
  CHECK(steps_of(data::distribute_dataset<S>(numbers, w0, nullptr)) ==
        Steps{{{0}}, {{1}}, {{3000}}});  // files 0 and 3: one global batch [0, 1, 3000]

  // Fewer files than workers: InvalidArgument for File, Data for Auto.
  const data::InputPlacement five_workers{.num_workers = 5, .worker_index = 0, .num_local_replicas = 1,
                                                  .num_replicas_in_sync = 5};
  CHECK_THROWS_WITH_AS(
      data::distribute_dataset<S>(numbers.with_options({.auto_shard_policy = data::AutoShardPolicy::File}),
                                          five_workers, nullptr),
      "distribute_dataset: AutoShardPolicy::File: the dataset reads 4 file(s) but there are 5 workers; every worker "
      "needs at least one file. Use more files or AutoShardPolicy::Data",
      ds::InvalidArgument);
  CHECK(data::distribute_dataset<S>(numbers, five_workers, nullptr).auto_shard_policy() ==
        data::AutoShardPolicy::Data);
  CHECK_THROWS_WITH_AS(data::distribute_dataset<S>(
                           data::range(4).batch(2).with_options({.auto_shard_policy = data::AutoShardPolicy::File}),
                           w1, nullptr),
                       doctest::Contains("AutoShardPolicy::File needs a dataset read from files"),
                       ds::InvalidArgument);
  // One worker: File needs nothing (there is nothing to shard).
  ds::MirroredStrategy<> two(2);
  CHECK(steps_of(two.distribute_dataset(data::range(2).batch(2).with_options(
            {.auto_shard_policy = data::AutoShardPolicy::File}))) == Steps{{{0}, {1}}});
}

TEST_CASE("distribute_datasets_from_function: one call, InputContext, a batch per replica per step") {
  ds::MirroredStrategy<> two(2);
  int calls = 0;
  ds::InputContext seen;
  auto dist = two.distribute_datasets_from_function([&](const ds::InputContext& ctx) {
    ++calls;
    seen = ctx;
    return data::range(10).batch(ctx.get_per_replica_batch_size(4));
  });
  CHECK(calls == 1);
  CHECK(seen == ds::InputContext{1, 0, 2});
  using Steps = std::vector<std::vector<std::vector<I64>>>;
  // The last step has one batch for two replicas: the other gets an empty one.
  CHECK(steps_of(dist) == Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}, {{8, 9}, {}}});
  CHECK(calls == 1);

  // batch(n, drop_remainder=true): every batch is full, and (on one worker) a last step that
  // would leave a replica without a batch is dropped. Expected steps: TF 2.21's
  // MirroredStrategy.distribute_datasets_from_function on 2 and 3 logical CPUs.
  auto from_fn = [](auto& strategy, I64 n, I64 b, bool drop) {
    return steps_of(strategy.distribute_datasets_from_function(
        [=](const ds::InputContext&) { return data::range(n).batch(b, drop); }));
  };
  CHECK(from_fn(two, 10, 2, true) == Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}});
  CHECK(from_fn(two, 11, 2, true) == Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}});
  CHECK(from_fn(two, 11, 2, false) == Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}, {{8, 9}, {10}}});
  CHECK(from_fn(two, 7, 3, true) == Steps{{{0, 1, 2}, {3, 4, 5}}});
  ds::MirroredStrategy<> three(3);
  CHECK(from_fn(three, 10, 2, true) == Steps{{{0, 1}, {2, 3}, {4, 5}}});
  CHECK(from_fn(three, 10, 2, false) == Steps{{{0, 1}, {2, 3}, {4, 5}}, {{6, 7}, {8, 9}, {}}});
  CHECK(from_fn(three, 7, 3, true).empty());
  // The batch stays full through later stages (map, prefetch); a later batch() decides anew.
  CHECK(steps_of(two.distribute_datasets_from_function([](const ds::InputContext&) {
          return data::range(10).batch(2, true).map([](ds::Tensor<I64> t) { return t; }).prefetch(2);
        })) == Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}});

  ds::InputContext ctx{.num_input_pipelines = 2, .input_pipeline_id = 1, .num_replicas_in_sync = 4};
  CHECK(ctx.get_per_replica_batch_size(64) == 16);
  CHECK_THROWS_WITH_AS(ctx.get_per_replica_batch_size(10),
                       "InputContext::get_per_replica_batch_size: the global batch size 10 is not divisible by "
                       "num_replicas_in_sync 4",
                       ds::InvalidArgument);
  // Batches of strings are std::vectors; a replica without data gets an empty one.
  auto words = two.distribute_datasets_from_function(
      [](ds::InputContext) { return data::from_vector<std::string>({"x", "y", "z"}).batch(1); });
  std::vector<std::vector<std::vector<std::string>>> w;
  for (const auto& step : words) w.push_back(step.values());
  CHECK(w == std::vector<std::vector<std::vector<std::string>>>{{{"x"}, {"y"}}, {{"z"}, {}}});
}

// ---- multi-worker (real processes) -------------------------------------------------------------

namespace {

const char* data_helper() { return std::getenv("DISTRIBUTE_DATA_WORKER_HELPER"); }

std::vector<test_support::Child> start_data_workers(int n, const std::vector<std::string>& args) {
  auto ports = test_support::free_ports(n);
  std::vector<test_support::Child> children;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> argv{data_helper()};
    argv.insert(argv.end(), args.begin(), args.end());
    children.push_back(test_support::spawn(argv, {{"TF_CONFIG", test_support::tf_config(ports, i)}}));
  }
  return children;
}

/// One "RESULT name steps=S sum=X elems=a b c" line of a worker.
struct Seen {
  I64 steps = -1;
  I64 reduced_sum = 0;  // the sum over all workers, through strategy.reduce
  std::vector<I64> elements;
};

std::map<std::string, Seen> parse_results(const std::string& output) {
  std::map<std::string, Seen> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RESULT ", 0) != 0) continue;
    std::istringstream fields(line.substr(7));
    std::string name, word;
    fields >> name;
    Seen s;
    while (fields >> word) {
      if (word.rfind("steps=", 0) == 0) s.steps = std::stoll(word.substr(6));
      else if (word.rfind("reduced_sum=", 0) == 0) s.reduced_sum = std::stoll(word.substr(12));
      else if (word != "elems=") s.elements.push_back(std::stoll(word));
    }
    out[name] = s;
  }
  return out;
}

/// One "MEAN name step=S mean=M rows= a b" line of a worker: the last step's
/// reduce(Mean, per_replica_loss, axis=0) over all workers, and this worker's rows of that step.
struct LastStepMean {
  I64 step = -1;
  double mean = 0;
  std::vector<I64> rows;
};

std::map<std::string, LastStepMean> parse_means(const std::string& output) {
  std::map<std::string, LastStepMean> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MEAN ", 0) != 0) continue;
    std::istringstream fields(line.substr(5));
    std::string name, word;
    fields >> name;
    LastStepMean m;
    while (fields >> word) {
      if (word.rfind("step=", 0) == 0) m.step = std::stoll(word.substr(5));
      else if (word.rfind("mean=", 0) == 0) m.mean = std::stod(word.substr(5));
      else if (word != "rows=") m.rows.push_back(std::stoll(word));
    }
    out[name] = m;
  }
  return out;
}

// What the whole cluster must have seen, as a multiset (sorted).
std::vector<I64> truncate_to_batches(std::vector<I64> v, std::size_t batch, bool drop) {
  if (drop) v.resize(v.size() / batch * batch);
  return v;
}

}  // namespace

TEST_SUITE("data_multi_worker") {
  // Files of 7, 3, 0, 11 and 6 lines (27 rows), global batch 4; see tests/data_worker_helper.cpp.
  const std::vector<int> file_lines{7, 3, 0, 11, 6};
  constexpr std::size_t global_batch = 4;
  constexpr I64 range_size = 23;

  TEST_CASE("every element is seen exactly once across all replicas (Data, File, Auto; Off: once per worker)") {
    REQUIRE_MESSAGE(data_helper(), "DISTRIBUTE_DATA_WORKER_HELPER is not set: run through `meson test --suite data_multi_worker`");
    TempDir dir;
    auto files = write_number_files(dir, file_lines);
    std::vector<std::vector<I64>> lines_of(files.size());
    for (std::size_t f = 0; f < files.size(); ++f) {
      for (int j = 0; j < file_lines[f]; ++j) lines_of[f].push_back(1000 * static_cast<I64>(f) + j);
    }
    for (const auto& layout : {std::pair{1, 1}, {2, 1}, {3, 1}, {2, 2}}) {
      const int workers = layout.first, local = layout.second;  // not bindings: CAPTURE takes them
      CAPTURE(workers);
      CAPTURE(local);
      auto children = start_data_workers(workers, {"multiset", std::to_string(local), dir.path.string()});
      const bool finished = test_support::wait_all(children, 180s);
      CHECK(finished);
      std::vector<std::map<std::string, Seen>> results;
      for (int w = 0; w < workers; ++w) {
        INFO("worker ", w, " output:\n", children[static_cast<std::size_t>(w)].output);
        CHECK(children[static_cast<std::size_t>(w)].status == 0);
        results.push_back(parse_results(children[static_cast<std::size_t>(w)].output));
      }
      for (bool drop : {false, true}) {
        // The helper shuffles the range (seed 99) before batching, so drop_remainder drops the
        // last rows of the shuffled order: the first pass of the same pipeline here.
        const std::vector<I64> all_range = data::range(range_size).shuffle(10, 99).to_vector();
        std::vector<I64> all_files;
        for (const auto& l : lines_of) all_files.insert(all_files.end(), l.begin(), l.end());
        // File: each worker batches (and drops the remainder of) its own files.
        std::vector<I64> by_file;
        for (int w = 0; w < workers; ++w) {
          std::vector<I64> mine;
          for (std::size_t f = static_cast<std::size_t>(w); f < files.size(); f += static_cast<std::size_t>(workers)) {
            mine.insert(mine.end(), lines_of[f].begin(), lines_of[f].end());
          }
          mine = truncate_to_batches(mine, global_batch, drop);
          by_file.insert(by_file.end(), mine.begin(), mine.end());
        }
        std::vector<I64> off_range;
        for (int w = 0; w < workers; ++w) {
          auto once = truncate_to_batches(all_range, global_batch, drop);
          off_range.insert(off_range.end(), once.begin(), once.end());
        }
        const std::map<std::string, std::vector<I64>> expected{
            {"data_range", truncate_to_batches(all_range, global_batch, drop)},
            {"data_files", truncate_to_batches(all_files, global_batch, drop)},
            {"file_files", by_file},
            {"auto_files", by_file},  // 5 files >= 3 workers: Auto is File
            {"off_range", off_range},
        };
        for (const auto& [kind, want_unsorted] : expected) {
          const std::string name = kind + (drop ? "_drop" : "_keep");
          CAPTURE(name);
          std::vector<I64> got;
          I64 steps = -1;
          for (int w = 0; w < workers; ++w) {
            auto it = results[static_cast<std::size_t>(w)].find(name);
            REQUIRE(it != results[static_cast<std::size_t>(w)].end());
            if (steps < 0) steps = it->second.steps;
            CHECK(it->second.steps == steps);  // every worker ran the same steps
            got.insert(got.end(), it->second.elements.begin(), it->second.elements.end());
            const I64 want_sum = std::accumulate(want_unsorted.begin(), want_unsorted.end(), I64{0});
            CHECK(it->second.reduced_sum == want_sum);  // strategy.reduce saw every replica of every worker
          }
          auto want = want_unsorted;
          std::sort(want.begin(), want.end());
          std::sort(got.begin(), got.end());
          CHECK(got.size() == want.size());
          CHECK(std::accumulate(got.begin(), got.end(), I64{0}) == std::accumulate(want.begin(), want.end(), I64{0}));
          CHECK(got == want);

          // The last step's (with rows) reduce(Mean, per_replica_loss, axis=0), over every worker's
          // replicas, is the plain mean of that step's losses (helper: loss of row v is v/8 + 0.1), however
          // unevenly the step's rows were split among replicas and workers.
          std::vector<I64> last_rows;
          std::vector<double> means;
          I64 mean_step = -1;
          for (int w = 0; w < workers; ++w) {
            const auto m = parse_means(children[static_cast<std::size_t>(w)].output);
            auto it = m.find(name);
            REQUIRE(it != m.end());
            if (mean_step < 0) mean_step = it->second.step;
            CHECK(it->second.step == mean_step);  // the same step on every worker
            CHECK(it->second.step >= 1);
            CHECK(it->second.step <= steps);
            means.push_back(it->second.mean);
            last_rows.insert(last_rows.end(), it->second.rows.begin(), it->second.rows.end());
          }
          REQUIRE(!last_rows.empty());
          double plain = 0;
          for (I64 v : last_rows) plain += static_cast<double>(v) / 8.0 + 0.1;
          plain /= static_cast<double>(last_rows.size());
          for (double mean : means) CHECK(mean == doctest::Approx(plain).epsilon(1e-12));
          if (kind == "data_range") {
            CHECK(mean_step == steps);  // Data: every step has rows
            // Data sharding: the last step is the global batch that one process would see last,
            // the partial one (23 = 5 * 4 + 3) unless dropped.
            auto tail = truncate_to_batches(all_range, global_batch, drop);
            const std::size_t last_size = drop ? global_batch : tail.size() % global_batch;
            REQUIRE(last_size <= tail.size());
            std::vector<I64> want_last(tail.end() - static_cast<std::ptrdiff_t>(last_size), tail.end());
            std::sort(want_last.begin(), want_last.end());
            std::sort(last_rows.begin(), last_rows.end());
            CHECK(last_rows == want_last);
          }
        }
      }
    }
  }

  TEST_CASE("AutoShardPolicy::File with fewer files than workers: InvalidArgument on every worker") {
    REQUIRE(data_helper());
    TempDir dir;
    write_number_files(dir, {3, 3});
    auto children = start_data_workers(3, {"few_files", "1", dir.path.string()});
    CHECK(test_support::wait_all(children, 120s));
    for (auto& c : children) {
      INFO(c.output);
      CHECK(c.status == 4);
      CHECK(c.output.find("InvalidArgument: distribute_dataset: AutoShardPolicy::File: the dataset reads 2 file(s) "
                          "but there are 3 workers") != std::string::npos);
    }
  }

  TEST_CASE("a worker whose input pipeline throws: it reports its error, the others PeerFailure, none hangs") {
    REQUIRE(data_helper());
    TempDir dir;
    write_number_files(dir, {8, 8, 8});
    auto children = start_data_workers(3, {"pipeline_error", "1", dir.path.string()});
    CHECK(test_support::wait_all(children, 120s));
    for (std::size_t w = 0; w < children.size(); ++w) {
      INFO("worker ", w, ": ", children[w].output);
      if (w == 1) {
        CHECK(children[w].status == 5);
        CHECK(children[w].output.find("bad record 1005") != std::string::npos);
      } else {
        CHECK(children[w].status == 3);
        CHECK(children[w].output.find("PeerFailure: distribute_dataset: the input pipeline of another worker failed") !=
              std::string::npos);
      }
    }
  }
}
