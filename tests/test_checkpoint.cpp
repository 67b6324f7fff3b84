// Checkpoints: safetensors round trips and validation, Checkpoint (plain, mirrored, sync-on-read,
// sharded), atomic writes under SIGKILL, CheckpointManager.
#define DISTRIBUTE_WITH_CHECKPOINT
#define DISTRIBUTE_WITH_PS
#include <distribute/distribute.hpp>

#include <doctest/doctest.h>

#if __has_include(<boost/json.hpp>)

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "support/tensor_types.hpp"

namespace ds = distribute;
namespace st = distribute::safetensors;
namespace fs = std::filesystem;
using test_types::ColMajor;
using test_types::DynTensor;

namespace {

// A fresh directory under the system temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "distribute-ckpt-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::vector<std::byte> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_bytes(const fs::path& p, std::span<const std::byte> bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a literal header and payload, for malformed-file tests.
std::vector<std::byte> raw_file(const std::string& json, std::vector<std::uint8_t> payload, std::uint64_t length = 0) {
  const std::uint64_t n = length ? length : json.size();
  std::vector<std::byte> out(8);
  std::memcpy(out.data(), &n, 8);
  for (char c : json) out.push_back(static_cast<std::byte>(c));
  for (auto b : payload) out.push_back(static_cast<std::byte>(b));
  return out;
}

std::uint64_t header_length(std::span<const std::byte> file) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return n;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ds::CheckpointError& e) {
    return e.what();
  }
  return "<no CheckpointError>";
}

template <class T>
std::vector<T> sample_values(std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      v[i] = static_cast<T>((static_cast<double>(i) - 5.0) * 0.25);
    } else if constexpr (std::is_signed_v<T>) {
      v[i] = static_cast<T>(std::numeric_limits<T>::min() + static_cast<T>(i * 3));
    } else {
      v[i] = static_cast<T>(std::numeric_limits<T>::max() - static_cast<T>(i * 5));
    }
  }
  if constexpr (std::is_floating_point_v<T>) {
    // Bit patterns that a lossy path (text, conversion) would not preserve.
    const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::infinity(), T(-0.0),
                          std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max()};
    for (std::size_t i = 0; i < n && i < std::size(specials); ++i) v[i] = specials[i];
  }
  return v;
}

const std::vector<ds::Shape> kShapes = {{}, {5}, {2, 3}, {2, 0, 3}, {2, 3, 4}, {1, 2, 3, 2}};

template <class... T>
struct TypeList {};
using AllElements = TypeList<float, double, std::int8_t, std::int16_t, std::int32_t, std::int64_t, std::uint8_t,
                             std::uint16_t, std::uint32_t, std::uint64_t>;

template <class... T, class F>
void for_each_type(TypeList<T...>, F&& f) {
  (f(T{}), ...);
}

bool same_bytes(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

}  // namespace

// ---- safetensors -------------------------------------------------------------------------------

TEST_CASE("CRC-32 is the standard one (zlib.crc32)") {
  const std::string check = "123456789";
  CHECK(ds::checkpoint::detail::crc32(std::as_bytes(std::span(check.data(), check.size()))) == 0xCBF43926u);
}

TEST_CASE("safetensors round trip: every dtype, ranks 0 to 4, in a file and in memory") {
  TempDir dir;
  std::vector<std::vector<std::byte>> storage;  // keeps the viewed bytes alive
  st::TensorMap tensors;
  auto add = [&](std::string name, ds::DType dtype, ds::Shape shape, std::vector<std::byte> bytes) {
    storage.push_back(std::move(bytes));
    tensors.emplace(std::move(name), st::TensorView{dtype, std::move(shape), storage.back()});
  };
  storage.reserve(200);
  for_each_type(AllElements{}, [&](auto zero) {
    using T = decltype(zero);
    for (std::size_t r = 0; r < kShapes.size(); ++r) {
      const auto n = static_cast<std::size_t>(ds::num_elements(kShapes[r]));
      auto values = sample_values<T>(n);
      auto view = st::TensorView::of<T>(kShapes[r], values);
      add(fmt::format("{}/shape{}", st::dtype_name(ds::dtype_of<T>()), r), view.dtype, view.shape,
          std::vector<std::byte>(view.bytes.begin(), view.bytes.end()));
    }
  });
  for (std::size_t r = 0; r < kShapes.size(); ++r) {
    const auto n = static_cast<std::size_t>(ds::num_elements(kShapes[r]));
    std::vector<std::byte> bools(n), halves(2 * n), bhalves(2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      bools[i] = std::byte(i % 3 == 0);
      const auto h = static_cast<std::uint16_t>(0x3c00 + i * 0x111);
      std::memcpy(&halves[2 * i], &h, 2);
      const auto b = static_cast<std::uint16_t>(0x3f80 + i * 0x101);
      std::memcpy(&bhalves[2 * i], &b, 2);
    }
    add(fmt::format("BOOL/shape{}", r), ds::DType::Bool, kShapes[r], bools);
    add(fmt::format("F16/shape{}", r), ds::DType::F16, kShapes[r], halves);
    add(fmt::format("BF16/shape{}", r), ds::DType::BF16, kShapes[r], bhalves);
  }
  const st::Metadata metadata{{"format", "pt"}, {"note", "round trip"}};
  const fs::path path = dir / "all.safetensors";
  st::write(path, tensors, metadata);

  const auto bytes = read_bytes(path);
  CHECK(bytes == st::serialize(tensors, metadata));  // the file is exactly serialize()'s bytes
  for (const st::File& file : {st::read(path), st::parse(bytes, "memory")}) {
    REQUIRE(file.tensors.size() == tensors.size());
    CHECK(file.metadata.at("format") == "pt");
    CHECK(file.metadata.at("note") == "round trip");
    for (const auto& [name, view] : tensors) {
      const std::string& tensor = name;  // a copy CAPTURE can take (clang 14 captures no bindings)
      CAPTURE(tensor);
      const st::StoredTensor& t = file.at(name);
      CHECK(t.dtype == view.dtype);
      CHECK(t.shape == view.shape);
      CHECK(t.bytes.size() == view.bytes.size());
      CHECK(same_bytes(t.bytes.data(), view.bytes.data(), t.bytes.size()));
    }
  }

  // Typed access: the exact type, and nothing else.
  const st::File file = st::read(path);
  CHECK(file.at("I32/shape2").to_tensor<std::int32_t>() ==
        ds::Tensor<std::int32_t>({2, 3}, sample_values<std::int32_t>(6)));
  CHECK(file.at("F64/shape0").values<double>().size() == 1);
  CHECK(file.at("BOOL/shape1").values<bool>() == std::vector<bool>{true, false, false, true, false});
  CHECK(ds::to_bits(file.at("F16/shape1").values<ds::float16>()[1]) == 0x3d11);
  CHECK(ds::to_bits(file.at("BF16/shape1").values<ds::bfloat16>()[0]) == 0x3f80);
  CHECK_THROWS_WITH_AS(file.at("F16/shape2").values<float>(),
                       "tensor 'F16/shape2' has dtype F16 (float16) and cannot be read as F32 (float32); distribute "
                       "does not convert between element types",
                       ds::CheckpointError);
  CHECK_THROWS_WITH_AS(file.at("I32/shape2").values<std::int64_t>(), doctest::Contains("I32 (int32)"),
                       ds::CheckpointError);
  CHECK_THROWS_WITH_AS(file.at("missing"), doctest::Contains("has no tensor 'missing'"), ds::CheckpointError);
}

namespace {
// A 16-bit float and the bits it must have in a file. Built from `value` (the conversion rounds to
// nearest even), and checked against `bits`, so that a file's bytes are known independently.
struct HalfCase {
  float value;
  std::uint16_t bits;
};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const std::vector<HalfCase> kF16Cases = {
    {1.0f, 0x3c00},   {-0.0f, 0x8000},  {kInf, 0x7c00},
    {-kInf, 0xfc00},  {kNaN, 0x7e00},
    {0x1p-24f, 0x0001},      // the smallest subnormal
    {0x1.ff8p-15f, 0x03ff},  // the largest subnormal
    {65504.0f, 0x7bff}, {-2.0f, 0xc000}, {0.1f, 0x2e66}};
const std::vector<HalfCase> kBF16Cases = {
    {1.0f, 0x3f80},       {-0.0f, 0x8000},      {kInf, 0x7f80}, {-kInf, 0xff80},
    {kNaN, 0x7fc0},       {0x1p-133f, 0x0001},  // the smallest subnormal
    {0x1.fep127f, 0x7f7f},  {-2.0f, 0xc000},    {0.1f, 0x3dcd}, {3.14159265f, 0x4049}};
// A signalling and a negative NaN, made from their bits: only a path that copies bits keeps them.
constexpr std::uint16_t kF16NaNBits[] = {0x7c01, 0xfe00};
constexpr std::uint16_t kBF16NaNBits[] = {0x7f81, 0xffc0};

template <class H>
std::vector<H> halves_of(const std::vector<HalfCase>& cases, std::span<const std::uint16_t> nan_bits) {
  std::vector<H> out;
  for (const auto& c : cases) out.push_back(H(c.value));
  for (auto b : nan_bits) out.push_back(ds::from_bits<H>(b));
  return out;
}

std::vector<std::uint16_t> bits_expected(const std::vector<HalfCase>& cases, std::span<const std::uint16_t> nan_bits) {
  std::vector<std::uint16_t> out;
  for (const auto& c : cases) out.push_back(c.bits);
  out.insert(out.end(), nan_bits.begin(), nan_bits.end());
  return out;
}

// Compared as bits: as floats -0 == +0 and NaN != NaN.
template <class Range>
std::vector<std::uint16_t> bits_of(const Range& halves) {
  std::vector<std::uint16_t> out;
  for (auto h : halves) out.push_back(ds::to_bits(h));
  return out;
}
}  // namespace

TEST_CASE("safetensors F16 and BF16: the exact bits go into the file and come back") {
  const auto f16 = halves_of<ds::float16>(kF16Cases, kF16NaNBits);
  const auto bf16 = halves_of<ds::bfloat16>(kBF16Cases, kBF16NaNBits);
  const auto f16_bits = bits_expected(kF16Cases, kF16NaNBits);
  const auto bf16_bits = bits_expected(kBF16Cases, kBF16NaNBits);
  REQUIRE(f16.size() == 12);
  REQUIRE(bf16.size() == 12);
  CHECK(bits_of(f16) == f16_bits);  // the values below are the ones meant
  CHECK(bits_of(bf16) == bf16_bits);

  TempDir dir;
  const fs::path path = dir / "halves.safetensors";
  st::write(path, {{"f16", st::TensorView::of<ds::float16>({3, 4}, f16)}, {"bf16", st::view_of(bf16)}});

  // The file: dtype names as safetensors spells them, and little-endian bits at the recorded offsets.
  const auto bytes = read_bytes(path);
  const std::uint64_t n = header_length(bytes);
  const auto header =
      boost::json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()) + 8, n)).as_object();
  auto file_bits = [&](const char* name) {
    const auto& o = header.at(name).at("data_offsets").as_array();
    std::vector<std::uint16_t> out;
    for (auto at = 8 + n + o[0].to_number<std::uint64_t>(); at < 8 + n + o[1].to_number<std::uint64_t>(); at += 2) {
      out.push_back(static_cast<std::uint16_t>(static_cast<unsigned>(bytes[at]) |
                                               static_cast<unsigned>(bytes[at + 1]) << 8));
    }
    return out;
  };
  CHECK(header.at("f16").at("dtype").as_string() == "F16");
  CHECK(header.at("bf16").at("dtype").as_string() == "BF16");
  CHECK(header.at("f16").at("shape") == boost::json::array{3, 4});
  CHECK(file_bits("f16") == f16_bits);
  CHECK(file_bits("bf16") == bf16_bits);

  // Read back: the same bits, through every typed accessor.
  const st::File file = st::read(path);
  CHECK(file.at("f16").dtype == ds::DType::F16);
  CHECK(file.at("bf16").dtype == ds::DType::BF16);
  CHECK(file.at("f16").shape == ds::Shape{3, 4});
  CHECK(bits_of(file.at("f16").values<ds::float16>()) == f16_bits);
  const auto tensor = file.at("f16").to_tensor<ds::float16>();
  CHECK(tensor.shape() == ds::Shape{3, 4});
  CHECK(bits_of(tensor.values()) == f16_bits);
  CHECK(bits_of(file.at("bf16").values<ds::bfloat16>()) == bf16_bits);
  CHECK(static_cast<float>(file.at("bf16").values<ds::bfloat16>()[9]) == 3.140625f);
  CHECK(static_cast<float>(file.at("f16").values<ds::float16>()[5]) == 0x1p-24f);

  // Same size is not same type: F16 is not BF16, nor U16, nor float.
  CHECK_THROWS_WITH_AS(file.at("f16").values<ds::bfloat16>(),
                       "tensor 'f16' has dtype F16 (float16) and cannot be read as BF16 (bfloat16); distribute does "
                       "not convert between element types",
                       ds::CheckpointError);
  CHECK_THROWS_WITH_AS(file.at("bf16").values<std::uint16_t>(),
                       doctest::Contains("tensor 'bf16' has dtype BF16 (bfloat16) and cannot be read as U16 (uint16)"),
                       ds::CheckpointError);
  CHECK_THROWS_WITH_AS(file.at("bf16").to_tensor<float>(),
                       doctest::Contains("tensor 'bf16' has dtype BF16 (bfloat16) and cannot be read as F32 (float32)"),
                       ds::CheckpointError);

  // A file from another writer, its bits given byte by byte.
  const st::File other = st::parse(raw_file(
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}})",
      {0x00, 0x3c, 0x01, 0x00, 0x80, 0x3f, 0xc0, 0x7f}));
  CHECK(bits_of(other.at("h").values<ds::float16>()) == std::vector<std::uint16_t>{0x3c00, 0x0001});
  CHECK(bits_of(other.at("b").values<ds::bfloat16>()) == std::vector<std::uint16_t>{0x3f80, 0x7fc0});
  CHECK(std::isnan(static_cast<float>(other.at("b").values<ds::bfloat16>()[1])));
}

TEST_CASE("safetensors F16 and BF16: wrong sizes, other spellings and dtype codes with no name are rejected") {
  auto err = [](const std::string& json, std::vector<std::uint8_t> payload) {
    return error_of([&] { st::parse(raw_file(json, std::move(payload)), "f.safetensors"); });
  };
  CHECK(err(R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}})", std::vector<std::uint8_t>(4))
            .find("'f.safetensors': tensor 'h' of dtype F16 and shape (3,) needs 6 bytes, but its data_offsets "
                  "[0, 4] span 4") != std::string::npos);
  CHECK(err(R"({"b":{"dtype":"BF16","shape":[1],"data_offsets":[0,4]}})", std::vector<std::uint8_t>(4))
            .find("tensor 'b' of dtype BF16 and shape (1,) needs 2 bytes") != std::string::npos);
  // numpy's and TF's names are not safetensors' names.
  for (const char* name : {"float16", "bfloat16", "f16", "bf16", "F16 "}) {
    CAPTURE(name);
    CHECK(err(fmt::format(R"({{"h":{{"dtype":"{}","shape":[1],"data_offsets":[0,2]}}}})", name),
              std::vector<std::uint8_t>(2))
              .find(fmt::format("'f.safetensors': tensor 'h' has dtype \"{}\", which distribute does not know (known: "
                                "F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, BOOL, F16, BF16)",
                                name)) != std::string::npos);
  }

  std::vector<std::byte> four(4);
  CHECK_THROWS_WITH_AS(st::serialize({{"b", st::TensorView{ds::DType::BF16, {3}, four}}}),
                       "safetensors: tensor 'b' of dtype BF16 and shape (3,) needs 6 bytes, but 4 were given",
                       ds::InvalidArgument);
  CHECK_THROWS_WITH_AS(st::serialize({{"x", st::TensorView{static_cast<ds::DType>(200), {0}, {}}}}),
                       "safetensors: tensor 'x' has dtype code 200, which safetensors files cannot hold",
                       ds::InvalidArgument);
  const std::vector<ds::float16> three(3);
  CHECK_THROWS_WITH_AS(st::TensorView::of<ds::float16>({2, 2}, three),
                       "safetensors: shape (2, 2) holds 4 elements but 3 were given", ds::InvalidArgument);
}

TEST_CASE("safetensors layout: 8-byte aligned header padded with spaces, tensors aligned, widest first") {
  std::vector<std::uint8_t> u8(3, 1);
  std::vector<double> f64(2, 2.0);
  std::vector<std::int16_t> i16(3, 3);
  std::vector<float> f32(1, 4.0f);
  st::TensorMap tensors{{"a_u8", st::view_of(u8)},
                        {"b_i16", st::view_of(i16)},
                        {"c_f32", st::view_of(f32)},
                        {"d_f64", st::view_of(f64)}};
  const auto bytes = st::serialize(tensors);
  const std::uint64_t n = header_length(bytes);
  CHECK(n % 8 == 0);
  const std::string json(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  CHECK(json.front() == '{');
  CHECK(json.find_last_not_of(' ') == json.rfind('}'));
  const auto header = boost::json::parse(json).as_object();
  auto offsets = [&](const char* name) {
    const auto& o = header.at(name).at("data_offsets").as_array();
    return std::pair{o[0].to_number<std::uint64_t>(), o[1].to_number<std::uint64_t>()};
  };
  CHECK(offsets("d_f64") == std::pair<std::uint64_t, std::uint64_t>{0, 16});
  CHECK(offsets("c_f32") == std::pair<std::uint64_t, std::uint64_t>{16, 20});
  CHECK(offsets("b_i16") == std::pair<std::uint64_t, std::uint64_t>{20, 26});
  CHECK(offsets("a_u8") == std::pair<std::uint64_t, std::uint64_t>{26, 29});
  CHECK(header.at("d_f64").at("dtype").as_string() == "F64");
  CHECK(header.at("__metadata__").at("distribute.format").as_string() == "1");
  CHECK(bytes.size() == 8 + n + 29);

  // Empty: a valid file with no tensors.
  const auto empty = st::parse(st::serialize({}));
  CHECK(empty.tensors.empty());

  // Reserved keys and bad inputs.
  CHECK_THROWS_AS(st::serialize({}, {{"distribute.header_crc32", "0"}}), ds::InvalidArgument);
  CHECK_THROWS_AS(st::serialize({{"__metadata__", st::view_of(u8)}}), ds::InvalidArgument);
  CHECK_THROWS_AS(st::TensorView::of<float>({2, 2}, std::span<const float>(f32)), ds::InvalidArgument);
}

namespace {
// A small file with three tensors of different dtypes, written through the library.
std::vector<std::byte> sample_file() {
  static const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  static const std::vector<std::int64_t> step = {42};
  static const std::vector<std::uint8_t> mask = {1, 0, 1, 1};
  st::TensorMap tensors{{"dense/kernel", st::TensorView::of<float>({2, 3}, w)},
                        {"step", st::TensorView::of<std::int64_t>({}, step)},
                        {"mask", st::TensorView::of<std::uint8_t>({4}, mask)}};
  return st::serialize(tensors, {{"note", "x"}});
}
}  // namespace

TEST_CASE("a truncated file is rejected at every length, from a file and from memory") {
  TempDir dir;
  const auto full = sample_file();
  const std::uint64_t n = header_length(full);
  const fs::path path = dir / "cut.safetensors";
  for (std::size_t len = 0; len < full.size(); ++len) {
    CAPTURE(len);
    const std::span<const std::byte> cut(full.data(), len);
    write_bytes(path, cut);
    CHECK_THROWS_AS(st::read(path), ds::CheckpointError);
    CHECK_THROWS_AS(st::parse(cut), ds::CheckpointError);
  }
  auto read_cut = [&](std::size_t len) {
    write_bytes(path, std::span<const std::byte>(full.data(), len));
    return error_of([&] { st::read(path); });
  };
  // Each boundary class says what is wrong.
  CHECK(read_cut(3).find("is 3 bytes long, too short for the 8-byte header length") != std::string::npos);
  CHECK(read_cut(8 + n / 2).find(fmt::format("the header length {} runs past the end of the file", n)) !=
        std::string::npos);
  CHECK(read_cut(8 + n).find("tensor 'step' has data_offsets [0, 8] but the payload holds only 0 bytes") !=
        std::string::npos);
  CHECK(read_cut(8 + n + 10).find("the payload holds only 10 bytes: the file is truncated") != std::string::npos);
  CHECK(read_cut(full.size() - 1).find("tensor 'mask'") != std::string::npos);
  CHECK(read_cut(3).find(path.string()) != std::string::npos);  // errors name the file
  // Extra bytes after the last tensor are rejected too.
  auto longer = full;
  longer.push_back(std::byte{0});
  CHECK(error_of([&] { st::parse(longer); }).find("trailing bytes") != std::string::npos);
}

TEST_CASE("a flipped payload byte is caught by the tensor's checksum, naming the tensor") {
  const auto full = sample_file();
  const st::File good = st::parse(full);
  const std::uint64_t start = 8 + header_length(full);
  // Offsets in payload order: kernel (F32, 24 bytes), step (I64, 8), mask (U8, 4) — by width.
  for (const auto& [name, offset] : {std::pair{"step", 0}, std::pair{"dense/kernel", 8 + 13}, std::pair{"mask", 32 + 3}}) {
    const char* tensor = name;  // a copy CAPTURE can take (clang 14 captures no bindings)
    CAPTURE(tensor);
    auto bad = full;
    bad[start + offset] ^= std::byte{0x10};
    const std::string err = error_of([&] { st::parse(bad, "bad.safetensors"); });
    CHECK(err.find(fmt::format("'bad.safetensors': tensor '{}' is corrupted: the CRC-32", name)) != std::string::npos);
  }
  // Every single payload byte.
  for (std::size_t i = start; i < full.size(); ++i) {
    auto bad = full;
    bad[i] ^= std::byte{0x01};
    CHECK_THROWS_AS(st::parse(bad), ds::CheckpointError);
  }
  // With verification off the bytes are returned as they are.
  auto bad = full;
  bad[start] ^= std::byte{0x01};
  CHECK(st::parse(bad, "x", st::ReadOptions{.verify_checksums = false}).tensors.size() == 3);
}

TEST_CASE("any flipped byte in the length prefix or the JSON header is rejected") {
  const auto full = sample_file();
  const std::uint64_t n = header_length(full);
  int count = 0;
  for (std::size_t i = 0; i < 8 + n; ++i) {
    for (auto mask : {std::byte{0x01}, std::byte{0x02}, std::byte{0x20}, std::byte{0x80}}) {
      auto bad = full;
      bad[i] ^= mask;
      CAPTURE(i);
      CAPTURE(static_cast<int>(mask));
      CHECK_THROWS_AS(st::parse(bad), ds::CheckpointError);
      ++count;
    }
  }
  CHECK(count > 1000);
  // A change that keeps the JSON valid and the layout consistent is still caught by the header CRC.
  std::string json(reinterpret_cast<const char*>(full.data()) + 8, n);
  const auto at = json.find("\"note\":\"x\"");
  REQUIRE(at != std::string::npos);
  json[at + 8] = 'y';
  std::vector<std::byte> edited(full.begin(), full.begin() + 8);
  for (char c : json) edited.push_back(static_cast<std::byte>(c));
  edited.insert(edited.end(), full.begin() + static_cast<std::ptrdiff_t>(8 + n), full.end());
  CHECK(error_of([&] { st::parse(edited); }).find("header checksum mismatch") != std::string::npos);
}

TEST_CASE("malformed headers: each problem is a CheckpointError saying what is wrong") {
  auto err = [](const std::string& json, std::vector<std::uint8_t> payload, std::uint64_t length = 0) {
    return error_of([&] { st::parse(raw_file(json, std::move(payload), length), "f.safetensors"); });
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // A hand-written file without distribute's checksums is accepted (files from other writers).
  const auto plain = st::parse(raw_file(ok, {0, 0, 128, 63, 0, 0, 0, 64}));
  CHECK(plain.at("a").values<float>() == std::vector<float>{1.0f, 2.0f});
  // A dimension of 0 holds no elements whatever the others: (2^62, 4, 0) is an empty tensor, not
  // a count that overflows.
  const auto empty = st::parse(raw_file(R"({"e":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[0,0]}})", {}));
  CHECK(empty.at("e").num_elements() == 0);
  CHECK(empty.at("e").values<float>().empty());
  CHECK(err(R"({"e":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[0,4]}})", std::vector<std::uint8_t>(4))
            .find("tensor 'e' of dtype F32 and shape (4611686018427387904, 4, 0) needs 0 bytes") != std::string::npos);

  CHECK(err(ok, std::vector<std::uint8_t>(8), 1000).find("the header length 1000 runs past the end of the file") !=
        std::string::npos);
  CHECK(err(ok, std::vector<std::uint8_t>(8), std::uint64_t{1} << 62).find("runs past the end") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", std::vector<std::uint8_t>(8))
            .find("the JSON header") != std::string::npos);
  CHECK(err(R"([1, 2])", {}).find("does not start with '{'") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", std::vector<std::uint8_t>(8))
            .find("tensor 'a' of dtype F32 and shape (2,) needs 8 bytes, but its data_offsets [0, 16] span 16") !=
        std::string::npos);
  CHECK(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[100,108]}})", std::vector<std::uint8_t>(8))
            .find("tensor 'a' has data_offsets [100, 108] but the payload holds only 8 bytes") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::vector<std::uint8_t>(8))
            .find("begin is after end") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", std::vector<std::uint8_t>(2))
            .find("tensor 'a' has dtype \"F8_E4M3\", which distribute does not know") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::vector<std::uint8_t>(8))
            .find("tensor 'a': shape must hold non-negative integers, not -2") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", std::vector<std::uint8_t>(8))
            .find("non-negative integers") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
            std::vector<std::uint8_t>(6))
            .find("tensor 'b' (data_offsets [2, 6]) overlaps tensor 'a' (data_offsets [0, 4])") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
            std::vector<std::uint8_t>(5))
            .find("tensor 'b' (data_offsets [3, 5]) leaves a gap after tensor 'a'") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", std::vector<std::uint8_t>(4))
            .find("the first tensor 'a' starts at payload byte 2") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[2]}})", {}).find("tensor 'a' lacks \"data_offsets\"") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}})", std::vector<std::uint8_t>(2))
            .find("tensor 'a' has an unknown field \"x\"") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", std::vector<std::uint8_t>(1))
            .find("data_offsets must be [begin, end]") != std::string::npos);
  CHECK(err(R"({"__metadata__":{"k":1}})", {}).find("__metadata__ value of 'k' must be a string") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", {1, 2})
            .find("BOOL tensor 'a' holds byte 2 at element 1") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
            std::vector<std::uint8_t>(8))
            .find("overflows 64 bits") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"distribute.format":"1"}})", {7})
            .find("lacks \"distribute.crc32.a\"") != std::string::npos);
  CHECK(err(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"distribute.format":"2"}})", {7})
            .find("distribute.format is \"2\"") != std::string::npos);
  // Every message names the file.
  CHECK(err("{}", {1}).find("'f.safetensors'") != std::string::npos);
}

TEST_CASE("reading a file that does not exist names it") {
  CHECK_THROWS_WITH_AS(st::read("/nonexistent/dir/x.safetensors"),
                       doctest::Contains("cannot open checkpoint file '/nonexistent/dir/x.safetensors'"),
                       ds::CheckpointError);
}

// ---- Checkpoint --------------------------------------------------------------------------------

TEST_CASE("Checkpoint round trip of plain variables of every dtype and rank") {
  TempDir dir;
  ds::Checkpoint ckpt;
  std::vector<std::function<void()>> scramble, verify;
  for_each_type(AllElements{}, [&](auto zero) {
    using T = decltype(zero);
    for (std::size_t r = 0; r < kShapes.size(); ++r) {
      const auto n = static_cast<std::size_t>(ds::num_elements(kShapes[r]));
      const ds::Tensor<T> original(kShapes[r], sample_values<T>(n));
      ds::Variable<ds::Tensor<T>> var(original, {.name = fmt::format("v{}", r)});
      ckpt.track(fmt::format("{}/r{}", ds::to_string(ds::dtype_of<T>()), r), var);
      scramble.push_back([var]() mutable { var.assign(ds::Tensor<T>::full(var.shape(), T(7))); });
      verify.push_back([var, original] {
        const auto now = var.read_value();
        CHECK(now.shape() == original.shape());
        CHECK(same_bytes(now.data(), original.data(), original.size() * sizeof(T)));
      });
    }
  });
  ds::Variable<std::vector<double>> vec(std::vector<double>{1.5, -2.5}, {.name = "vec"});
  ds::Variable<std::array<std::int32_t, 3>> arr(std::array<std::int32_t, 3>{1, 2, 3}, {.name = "arr"});
  ds::Variable<std::int64_t> step(41, {.name = "step"});
  // bool (safetensors BOOL, one byte per element) in the one container a Variable holds it in,
  // std::array: ds::Tensor and std::vector refuse bool, and Variable<bool> does not compile (its
  // copies live in a std::vector<T>).
  ds::Variable<std::array<bool, 3>> bits(std::array<bool, 3>{true, false, true}, {.name = "bits"});
  ckpt.track("vec", vec).track("arr", arr).track("step", step).track("bits", bits);
  CHECK(ckpt.is_tracking("vec"));
  CHECK_THROWS_WITH_AS(ckpt.track("vec", vec), doctest::Contains("'vec' is already tracked"), ds::InvalidArgument);

  CHECK(ckpt.save_counter() == 0);
  const fs::path p1 = ckpt.save(dir / "run" / "ckpt");  // creates run/
  CHECK(p1 == dir / "run" / "ckpt-1.safetensors");
  CHECK(ckpt.save_counter() == 1);
  CHECK(st::read(p1).metadata.at("distribute.save_counter") == "1");
  {
    const auto file = st::read(p1);
    CHECK(file.at("bits").dtype == ds::DType::Bool);
    CHECK(file.at("bits").shape == ds::Shape{3});
  }

  for (auto& f : scramble) f();
  vec.assign(std::vector<double>{0, 0});
  arr.assign(std::array<std::int32_t, 3>{});
  step.assign(0);
  bits.assign(std::array<bool, 3>{false, true, false});
  ckpt.restore(p1);
  for (auto& f : verify) f();
  CHECK(bits.read_value() == std::array<bool, 3>{true, false, true});
  CHECK(vec.read_value() == std::vector<double>{1.5, -2.5});
  CHECK(arr.read_value() == std::array<std::int32_t, 3>{1, 2, 3});
  CHECK(step.read_value() == 41);

  // save() numbers files by the counter; write() leaves it alone; restore() brings it back.
  CHECK(ckpt.save(dir / "run" / "ckpt") == dir / "run" / "ckpt-2.safetensors");
  CHECK(ckpt.write(dir / "exact.safetensors") == dir / "exact.safetensors");
  CHECK(ckpt.save_counter() == 2);
  ds::Checkpoint other;
  ds::Variable<std::int64_t> step2(0, {.name = "step2"});
  other.track("step", step2);
  other.restore(dir / "run" / "ckpt-2.safetensors");  // a partial restore: extra tensors are fine
  CHECK(step2.read_value() == 41);
  CHECK(other.save_counter() == 2);
}

TEST_CASE("Checkpoint round trip of F16 and BF16 variables: Tensor, vector, scalar, sharded, mirrored") {
  TempDir dir;
  const auto f16 = halves_of<ds::float16>(kF16Cases, kF16NaNBits);
  const auto bf16 = halves_of<ds::bfloat16>(kBF16Cases, kBF16NaNBits);
  const auto f16_bits = bits_expected(kF16Cases, kF16NaNBits);
  const auto bf16_bits = bits_expected(kBF16Cases, kBF16NaNBits);

  ds::Variable<ds::Tensor<ds::float16>> tensor(ds::Tensor<ds::float16>({3, 4}, f16), {.name = "tensor"});
  ds::Variable<std::vector<ds::bfloat16>> vector(bf16, {.name = "vector"});
  ds::Variable<ds::float16> f16_scalar(ds::float16(-1.5f), {.name = "f16_scalar"});
  ds::Variable<ds::bfloat16> bf16_scalar(ds::bfloat16(0.5f), {.name = "bf16_scalar"});
  std::vector<ds::Variable<ds::Tensor<ds::bfloat16>>> shards{
      ds::Variable<ds::Tensor<ds::bfloat16>>(ds::Tensor<ds::bfloat16>({4, 2}, {bf16.begin(), bf16.begin() + 8}),
                                             {.name = "part_0"}),
      ds::Variable<ds::Tensor<ds::bfloat16>>(ds::Tensor<ds::bfloat16>({2, 2}, {bf16.begin() + 8, bf16.end()}),
                                             {.name = "part_1"})};
  ds::Checkpoint ckpt;
  ckpt.track("f16/tensor", tensor)
      .track("bf16/vector", vector)
      .track("f16/scalar", f16_scalar)
      .track("bf16/scalar", bf16_scalar)
      .track_sharded("bf16/sharded", shards);
  const fs::path path = ckpt.save(dir / "ckpt");

  {
    const st::File file = st::read(path);
    auto check = [&](const char* name, ds::DType dtype, ds::Shape shape, std::vector<std::uint16_t> bits) {
      CAPTURE(name);
      const st::StoredTensor& t = file.at(name);
      CHECK(t.dtype == dtype);
      CHECK(t.shape == shape);
      std::vector<std::uint16_t> got(t.bytes.size() / 2);
      std::memcpy(got.data(), t.bytes.data(), t.bytes.size());
      CHECK(got == bits);
    };
    check("f16/tensor", ds::DType::F16, {3, 4}, f16_bits);
    check("bf16/vector", ds::DType::BF16, {12}, bf16_bits);
    check("f16/scalar", ds::DType::F16, {}, {0xbe00});
    check("bf16/scalar", ds::DType::BF16, {}, {0x3f00});
    check("bf16/sharded", ds::DType::BF16, {6, 2}, bf16_bits);
  }

  tensor.assign(ds::Tensor<ds::float16>::zeros({3, 4}));
  vector.assign(std::vector<ds::bfloat16>(12));
  f16_scalar.assign(ds::float16(0.0f));
  bf16_scalar.assign(ds::bfloat16(0.0f));
  for (auto& shard : shards) shard.assign(ds::Tensor<ds::bfloat16>::zeros(shard.shape()));
  ckpt.restore(path);
  CHECK(bits_of(tensor.read_value().values()) == f16_bits);
  CHECK(tensor.read_value().shape() == ds::Shape{3, 4});
  CHECK(bits_of(vector.read_value()) == bf16_bits);
  CHECK(ds::to_bits(f16_scalar.read_value()) == 0xbe00);
  CHECK(ds::to_bits(bf16_scalar.read_value()) == 0x3f00);
  std::vector<std::uint16_t> sharded;
  for (const auto& shard : shards) {
    const auto bits = bits_of(shard.read_value().values());
    sharded.insert(sharded.end(), bits.begin(), bits.end());
  }
  CHECK(sharded == bf16_bits);

  // A mirrored variable: saved once, restored into every copy.
  ds::MirroredStrategy<> strategy(2);
  auto scope = strategy.scope();
  ds::Variable<std::vector<ds::bfloat16>> mirrored(bf16, {.name = "mirrored"});
  ds::Checkpoint mirrored_ckpt;
  mirrored_ckpt.track("m", mirrored);
  const fs::path mirrored_path = mirrored_ckpt.save(dir / "mirrored");
  mirrored.assign(std::vector<ds::bfloat16>(12));
  mirrored_ckpt.restore(mirrored_path);
  REQUIRE(mirrored.values().size() == 2);
  for (const auto& copy : mirrored.values()) CHECK(bits_of(copy) == bf16_bits);
}

TEST_CASE("restore rejects a missing tensor or a dtype/shape mismatch, naming the tensor, and changes nothing") {
  TempDir dir;
  ds::Variable<ds::Tensor<float>> w(ds::Tensor<float>({2, 3}, {1, 2, 3, 4, 5, 6}), {.name = "w"});
  ds::Variable<double> b(0.5, {.name = "b"});
  ds::Checkpoint saver;
  saver.track("dense/w", w).track("dense/b", b);
  const auto path = saver.save(dir / "ckpt");

  {  // shape
    ds::Variable<ds::Tensor<float>> w2(ds::Tensor<float>::zeros({3, 2}), {.name = "w2"});
    ds::Variable<double> b2(9.0, {.name = "b2"});
    ds::Checkpoint c;
    c.track("dense/w", w2).track("dense/b", b2);
    CHECK_THROWS_WITH_AS(c.restore(path),
                         doctest::Contains("tensor 'dense/w' is F32 (float32) with shape (2, 3) in the file, but the "
                                           "tracked variable 'w2' is F32 (float32) with shape (3, 2)"),
                         ds::CheckpointError);
    CHECK(b2.read_value() == 9.0);  // validated first: nothing was assigned
  }
  {  // dtype
    ds::Variable<ds::Tensor<double>> w2(ds::Tensor<double>::zeros({2, 3}), {.name = "w2"});
    ds::Checkpoint c;
    c.track("dense/w", w2);
    CHECK_THROWS_WITH_AS(c.restore(path),
                         doctest::Contains("tensor 'dense/w' is F32 (float32) with shape (2, 3) in the file, but the "
                                           "tracked variable 'w2' is F64 (float64) with shape (2, 3)"),
                         ds::CheckpointError);
  }
  {  // missing, and several problems in one message
    ds::Variable<float> x(0.0f, {.name = "x"});
    ds::Variable<std::int32_t> b2(0, {.name = "b2"});
    ds::Checkpoint c;
    c.track("nope", x).track("dense/b", b2);
    const std::string err = error_of([&] { c.restore(path); });
    CHECK(err.find(fmt::format("cannot restore from '{}'", path.string())) != std::string::npos);
    CHECK(err.find("tensor 'nope' (for variable 'x') is not in the file") != std::string::npos);
    CHECK(err.find("tensor 'dense/b' is F64 (float64) with shape () in the file") != std::string::npos);
  }
  {  // F16 in the file is not read into a float32 variable, nor BF16 into a float16 one
    const std::vector<ds::float16> halves(2, ds::float16(1.0f));
    const std::vector<ds::bfloat16> bhalves(2, ds::bfloat16(1.0f));
    const auto f16 = dir / "f16.safetensors";
    st::write(f16, {{"h", st::view_of(halves)}, {"b", st::view_of(bhalves)}});
    ds::Variable<std::vector<float>> h(std::vector<float>(2, 3.0f), {.name = "h"});
    ds::Checkpoint c;
    c.track("h", h);
    CHECK_THROWS_WITH_AS(c.restore(f16),
                         doctest::Contains("tensor 'h' is F16 (float16) with shape (2,) in the file, but the tracked "
                                           "variable 'h' is F32 (float32) with shape (2,)"),
                         ds::CheckpointError);
    CHECK(h.read_value() == std::vector<float>(2, 3.0f));
    ds::Variable<ds::Tensor<ds::float16>> b(ds::Tensor<ds::float16>::zeros({2}), {.name = "b16"});
    ds::Checkpoint c2;
    c2.track("b", b);
    CHECK_THROWS_WITH_AS(c2.restore(f16),
                         doctest::Contains("tensor 'b' is BF16 (bfloat16) with shape (2,) in the file, but the "
                                           "tracked variable 'b16' is F16 (float16) with shape (2,)"),
                         ds::CheckpointError);
  }
}

TEST_CASE("a mirrored variable is saved once and restored into every copy") {
  TempDir dir;
  fs::path path;
  {
    ds::MirroredStrategy<> strategy(3);
    auto scope = strategy.scope();
    ds::Variable<ds::Tensor<float>> w(ds::Tensor<float>({2, 2}, {1, 2, 3, 4}), {.name = "w"});
    REQUIRE(w.values().size() == 3);
    ds::Checkpoint ckpt;
    ckpt.track("w", w);
    path = ckpt.save(dir / "ckpt");
    const auto file = st::read(path);
    CHECK(file.tensors.size() == 1);
    CHECK(file.at("w").to_tensor<float>() == ds::Tensor<float>({2, 2}, {1, 2, 3, 4}));

    w.assign(ds::Tensor<float>::zeros({2, 2}));
    ckpt.restore(path);
    for (const auto& copy : w.values()) CHECK(copy == ds::Tensor<float>({2, 2}, {1, 2, 3, 4}));

    // Inside a step function saving is refused: each replica would write its own copy.
    CHECK_THROWS_WITH_AS(strategy.run([&] { ckpt.save(dir / "inside"); }),
                         doctest::Contains("Checkpoint::save was called inside a step function"), ds::InvalidArgument);
  }
  {  // into another number of replicas
    ds::MirroredStrategy<> strategy(2);
    auto scope = strategy.scope();
    ds::Variable<ds::Tensor<float>> w(ds::Tensor<float>::zeros({2, 2}), {.name = "w"});
    ds::Checkpoint ckpt;
    ckpt.track("w", w);
    ckpt.restore(path);
    REQUIRE(w.values().size() == 2);
    for (const auto& copy : w.values()) CHECK(copy == ds::Tensor<float>({2, 2}, {1, 2, 3, 4}));
  }
  {  // into a plain variable
    ds::Variable<ds::Tensor<float>> w(ds::Tensor<float>::zeros({2, 2}), {.name = "w"});
    ds::Checkpoint ckpt;
    ckpt.track("w", w);
    ckpt.restore(path);
    CHECK(w.read_value() == ds::Tensor<float>({2, 2}, {1, 2, 3, 4}));
  }
}

TEST_CASE("a sync-on-read variable is saved aggregated and restored with a cross-replica assign") {
  TempDir dir;
  using ds::VariableAggregation;
  using ds::VariableSynchronization;
  fs::path path;
  {
    ds::MirroredStrategy<> strategy(3);
    auto scope = strategy.scope();
    ds::Variable<float> total(0.0f, {.name = "total", .synchronization = VariableSynchronization::OnRead,
                                     .aggregation = VariableAggregation::Sum});
    ds::Variable<double> mean(0.0, {.name = "mean", .synchronization = VariableSynchronization::OnRead,
                                    .aggregation = VariableAggregation::Mean});
    ds::Variable<std::int64_t> count(0, {.name = "count", .synchronization = VariableSynchronization::OnRead,
                                         .aggregation = VariableAggregation::Sum});
    strategy.run([&](ds::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      total.assign_add(static_cast<float>(r + 1));  // 1 + 2 + 3
      mean.assign(static_cast<double>(r));           // mean 1
      count.assign_add(r == 0 ? 7 : 0);              // 7 on one replica only
    });
    ds::Checkpoint ckpt;
    ckpt.track("total", total).track("mean", mean).track("count", count);
    path = ckpt.save(dir / "ckpt");
    const auto file = st::read(path);
    CHECK(file.at("total").values<float>() == std::vector<float>{6.0f});
    CHECK(file.at("mean").values<double>() == std::vector<double>{1.0});
    CHECK(file.at("count").values<std::int64_t>() == std::vector<std::int64_t>{7});

    ds::Variable<float> no_aggregation(0.0f, {.name = "no_agg", .synchronization = VariableSynchronization::OnRead});
    ds::Checkpoint bad;
    bad.track("no_agg", no_aggregation);
    CHECK_THROWS_WITH_AS(bad.save(dir / "bad"), doctest::Contains("cannot save tensor 'no_agg'"), ds::CheckpointError);
    CHECK(!fs::exists(dir / "bad-1.safetensors"));
    CHECK(bad.save_counter() == 0);  // a failed save does not count
  }
  {
    ds::MirroredStrategy<> strategy(3);
    auto scope = strategy.scope();
    ds::Variable<float> total(0.0f, {.name = "total", .synchronization = VariableSynchronization::OnRead,
                                     .aggregation = VariableAggregation::Sum});
    ds::Variable<double> mean(0.0, {.name = "mean", .synchronization = VariableSynchronization::OnRead,
                                    .aggregation = VariableAggregation::Mean});
    ds::Variable<std::int64_t> count(0, {.name = "count", .synchronization = VariableSynchronization::OnRead,
                                         .aggregation = VariableAggregation::Sum});
    ds::Checkpoint ckpt;
    ckpt.track("total", total).track("mean", mean).track("count", count);
    ckpt.restore(path);
    CHECK(total.values() == std::vector<float>{2, 2, 2});  // SUM: value / N per copy
    CHECK(total.read_value() == 6.0f);
    CHECK(mean.values() == std::vector<double>{1, 1, 1});
    CHECK(count.read_value() == 7);  // the integer remainder is kept: 3 + 2 + 2
  }
}

TEST_CASE("a sharded variable is saved as one tensor and restores into 1, 2 or 3 shards") {
  TempDir dir;
  auto rows = [](std::int64_t first, std::int64_t n) {
    std::vector<float> v;
    for (std::int64_t r = first; r < first + n; ++r) {
      v.push_back(static_cast<float>(r * 10));
      v.push_back(static_cast<float>(r * 10 + 1));
    }
    return ds::Tensor<float>({n, 2}, v);
  };
  auto shard = [&](std::int64_t first, std::int64_t n, int i) {
    return ds::Variable<ds::Tensor<float>>(rows(first, n), {.name = fmt::format("emb/part_{}", i)});
  };
  // 7 rows over 3 shards: 3, 2, 2.
  ds::Checkpoint saver;
  saver.track_sharded("embedding", std::vector{shard(0, 3, 0), shard(3, 2, 1), shard(5, 2, 2)});
  const auto path = saver.save(dir / "ckpt");
  const auto file = st::read(path);
  REQUIRE(file.tensors.size() == 1);
  CHECK(file.at("embedding").to_tensor<float>() == rows(0, 7));

  for (const std::vector<std::int64_t>& split :
       {std::vector<std::int64_t>{7}, std::vector<std::int64_t>{4, 3}, std::vector<std::int64_t>{3, 2, 2},
        std::vector<std::int64_t>{1, 5, 1}}) {
    CAPTURE(split.size());
    std::vector<ds::Variable<ds::Tensor<float>>> shards;
    for (std::size_t i = 0; i < split.size(); ++i) {
      shards.emplace_back(ds::Tensor<float>::zeros({split[i], 2}), ds::VariableOptions{.name = fmt::format("s{}", i)});
    }
    ds::Checkpoint ckpt;
    ckpt.track_sharded("embedding", shards);
    ckpt.restore(path);
    std::int64_t first = 0;
    for (std::size_t i = 0; i < split.size(); ++i) {
      CHECK(shards[i].read_value() == rows(first, split[i]));
      first += split[i];
    }
  }
  {  // into one plain variable of the full shape, and back from a plain save into shards
    ds::Variable<ds::Tensor<float>> whole(ds::Tensor<float>::zeros({7, 2}), {.name = "whole"});
    ds::Checkpoint ckpt;
    ckpt.track("embedding", whole);
    ckpt.restore(path);
    CHECK(whole.read_value() == rows(0, 7));
  }
  {  // rows that do not add up
    std::vector<ds::Variable<ds::Tensor<float>>> shards{
        ds::Variable<ds::Tensor<float>>(ds::Tensor<float>::zeros({3, 2})),
        ds::Variable<ds::Tensor<float>>(ds::Tensor<float>::zeros({3, 2}))};
    ds::Checkpoint ckpt;
    ckpt.track_sharded("embedding", shards);
    CHECK_THROWS_WITH_AS(ckpt.restore(path),
                         doctest::Contains("tensor 'embedding' is F32 (float32) with shape (7, 2) in the file, but the "
                                           "tracked sharded variable (2 shards: (3, 2), (3, 2)) is F32 (float32) with "
                                           "shape (6, 2)"),
                         ds::CheckpointError);
  }
  {  // shards that do not stack
    std::vector<ds::Variable<ds::Tensor<float>>> shards{
        ds::Variable<ds::Tensor<float>>(ds::Tensor<float>::zeros({3, 2}), {.name = "a"}),
        ds::Variable<ds::Tensor<float>>(ds::Tensor<float>::zeros({3, 4}), {.name = "b"})};
    ds::Checkpoint ckpt;
    CHECK_THROWS_WITH_AS(ckpt.track_sharded("t", shards),
                         doctest::Contains("shard 1 ('b') of 't' has shape (3, 4), which does not stack"),
                         ds::InvalidArgument);
    CHECK_THROWS_AS(ckpt.track_sharded("t", std::vector<ds::Variable<float>>{ds::Variable<float>(1.0f)}),
                    ds::InvalidArgument);  // rank 0 cannot be split by rows
  }
}

TEST_CASE("a ShardedVariable is tracked as one tensor and restores into another number of shards") {
  TempDir dir;
  std::vector<float> values(13 * 3);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  const ds::Tensor<float> full({13, 3}, values);
  ds::ShardedVariable<ds::Tensor<float>> five(full, 5, {.name = "table"});  // rows 3,3,3,2,2
  ds::Checkpoint saver;
  saver.track("table", five);
  const auto path = saver.save(dir / "ckpt");
  CHECK(st::read(path).at("table").to_tensor<float>() == full);

  ds::ShardedVariable<ds::Tensor<float>> two(ds::Tensor<float>::zeros({13, 3}), 2, {.name = "table"});
  ds::Checkpoint loader;
  loader.track("table", two);
  loader.restore(path);
  CHECK(two.variables().size() == 2);
  CHECK(two.to_tensor() == full);
}

// ---- values of any TensorLike type ----------------------------------------------------------

namespace {

// A value's bytes in row-major logical order, whatever its layout.
std::vector<std::byte> row_major_bytes(const DynTensor& t) {
  const ds::TensorView v = ds::view_of(t);
  std::vector<std::byte> out(v.bytes());
  ds::copy_to_contiguous(v, out.data());
  return out;
}

// A DynTensor whose view says its elements are in device memory (as a CUDA torch::Tensor's would).
struct DeviceDyn {
  DynTensor t;
};

}  // namespace

template <>
struct distribute::tensor_traits<DeviceDyn> {
  static TensorView view(const DeviceDyn& d) {
    TensorView v = tensor_traits<DynTensor>::view(d.t);
    v.memory = MemorySpace::device;
    return v;
  }
  static DeviceDyn make(DType dtype, const Shape& shape) { return {tensor_traits<DynTensor>::make(dtype, shape)}; }
};

TEST_CASE("run-time dtype variables (float32, bfloat16) are saved with their dtype and restored bit for bit into every "
          "copy") {
  TempDir dir;
  const float nan_payload = std::bit_cast<float>(0x7fc01234u);
  const DynTensor f32 = DynTensor::of<float>(
      {2, 3}, {nan_payload, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::infinity(),
               1.5f, -2.25f});
  const DynTensor b16 = DynTensor::of<ds::bfloat16>(
      {4}, {std::bit_cast<ds::bfloat16>(std::uint16_t{0x7fc1}), std::bit_cast<ds::bfloat16>(std::uint16_t{0x8000}),
            std::bit_cast<ds::bfloat16>(std::uint16_t{0x0001}), ds::bfloat16(3.0f)});
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  ds::Variable<DynTensor> w(f32, {.name = "w"});
  ds::Variable<DynTensor> b(b16, {.name = "b"});
  REQUIRE(w.values().size() == 2);
  ds::Checkpoint ckpt;
  ckpt.track("w", w).track("b", b);
  const auto path = ckpt.save(dir / "ckpt");

  const auto file = st::read(path);
  CHECK(file.at("w").dtype == ds::DType::F32);
  CHECK(file.at("w").shape == ds::Shape{2, 3});
  CHECK(file.at("w").bytes == row_major_bytes(f32));
  CHECK(file.at("b").dtype == ds::DType::BF16);
  CHECK(file.at("b").shape == ds::Shape{4});
  CHECK(file.at("b").bytes == row_major_bytes(b16));

  w.assign(DynTensor::of<float>({2, 3}, {9, 9, 9, 9, 9, 9}));
  b.assign(DynTensor::of<ds::bfloat16>({4}, {ds::bfloat16(9.0f), ds::bfloat16(9.0f), ds::bfloat16(9.0f),
                                             ds::bfloat16(9.0f)}));
  ckpt.restore(path);
  for (const DynTensor& copy : w.values()) CHECK(row_major_bytes(copy) == row_major_bytes(f32));
  for (const DynTensor& copy : b.values()) CHECK(row_major_bytes(copy) == row_major_bytes(b16));

  // Each copy got bytes of its own: changing one leaves the other as restored.
  CHECK(w.values()[0].storage != w.values()[1].storage);
  std::memset(w.values()[0].data(), 0, 4);
  CHECK(w.values()[0].get<float>(0) == 0.0f);
  CHECK(row_major_bytes(w.values()[1]) == row_major_bytes(f32));
}

TEST_CASE("a run-time dtype SUM sync-on-read integer keeps the remainder on restore") {
  TempDir dir;
  const auto path = dir / "count.safetensors";
  st::write(path, {{"count", st::view_of(DynTensor::of<std::int32_t>({2}, {7, -5}))}});
  ds::MirroredStrategy<ds::host> strategy(3);
  auto scope = strategy.scope();
  ds::Variable<DynTensor> count(DynTensor::of<std::int32_t>({2}, {0, 0}),
                                {.name = "count", .synchronization = ds::VariableSynchronization::OnRead,
                                 .aggregation = ds::VariableAggregation::Sum});
  ds::Checkpoint ckpt;
  ckpt.track("count", count);
  ckpt.restore(path);
  REQUIRE(count.values().size() == 3);
  CHECK(count.values()[0].get<std::int32_t>(0) == 3);  // 3 + 2 + 2
  CHECK(count.values()[1].get<std::int32_t>(0) == 2);
  CHECK(count.values()[2].get<std::int32_t>(1) == -1);  // -3 + -1 + -1
  const DynTensor total = count.read_value();
  CHECK(total.get<std::int32_t>(0) == 7);
  CHECK(total.get<std::int32_t>(1) == -5);
}

TEST_CASE("a column-major variable is saved in row-major order and restored into its own layout") {
  TempDir dir;
  const ColMajor m = ColMajor::from_rows({{1, 2, 3}, {4, 5, 6}});
  REQUIRE(m.data == std::vector<float>{1, 4, 2, 5, 3, 6});
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  ds::Variable<ColMajor> w(m, {.name = "w"});
  ds::Checkpoint ckpt;
  ckpt.track("w", w);
  const auto path = ckpt.save(dir / "ckpt");
  const auto stored = st::read(path).at("w");
  CHECK(stored.shape == ds::Shape{2, 3});
  CHECK(stored.values<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});

  w.assign(ColMajor::from_rows({{0, 0, 0}, {0, 0, 0}}));
  ckpt.restore(path);
  REQUIRE(w.values().size() == 2);
  for (const ColMajor& copy : w.values()) CHECK(copy.data == std::vector<float>{1, 4, 2, 5, 3, 6});

  // Sharded by rows: each shard's rows go into the file in row-major order, and back.
  ds::Variable<ColMajor> top(ColMajor::from_rows({{1, 2, 3}}), {.name = "top"});
  ds::Variable<ColMajor> bottom(ColMajor::from_rows({{4, 5, 6}, {7, 8, 9}}), {.name = "bottom"});
  ds::Checkpoint sharded;
  sharded.track_sharded("s", std::vector{top, bottom});
  const auto spath = sharded.save(dir / "sharded");
  CHECK(st::read(spath).at("s").values<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  ds::Variable<ColMajor> whole(ColMajor::from_rows({{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}), {.name = "whole"});
  ds::Checkpoint one;
  one.track_sharded("s", std::vector{whole});
  one.restore(spath);
  for (const ColMajor& copy : whole.values()) CHECK(copy.data == std::vector<float>{1, 4, 7, 2, 5, 8, 3, 6, 9});
}

TEST_CASE("run-time dtype variables: a dtype or shape mismatch on restore names both and changes nothing") {
  TempDir dir;
  ds::Variable<DynTensor> w(DynTensor::of<float>({2, 3}, {1, 2, 3, 4, 5, 6}), {.name = "w"});
  ds::Checkpoint saver;
  saver.track("w", w);
  const auto path = saver.save(dir / "ckpt");

  const DynTensor halves = DynTensor::of<ds::bfloat16>(
      {2, 3}, {ds::bfloat16(7.0f), ds::bfloat16(7.0f), ds::bfloat16(7.0f), ds::bfloat16(7.0f), ds::bfloat16(7.0f),
               ds::bfloat16(7.0f)});
  ds::MirroredStrategy<ds::host> strategy(2);
  auto scope = strategy.scope();
  ds::Variable<DynTensor> w16(halves, {.name = "w16"});
  ds::Checkpoint c;
  c.track("w", w16);
  CHECK_THROWS_WITH_AS(c.restore(path),
                       doctest::Contains("tensor 'w' is F32 (float32) with shape (2, 3) in the file, but the tracked "
                                         "variable 'w16' is BF16 (bfloat16) with shape (2, 3)"),
                       ds::CheckpointError);
  for (const DynTensor& copy : w16.values()) CHECK(row_major_bytes(copy) == row_major_bytes(halves));

  const DynTensor wide = DynTensor::of<float>({3, 2}, {0, 0, 0, 0, 0, 0});
  ds::Variable<DynTensor> w32(wide, {.name = "w32"});
  ds::Checkpoint c2;
  c2.track("w", w32);
  CHECK_THROWS_WITH_AS(c2.restore(path),
                       doctest::Contains("tensor 'w' is F32 (float32) with shape (2, 3) in the file, but the tracked "
                                         "variable 'w32' is F32 (float32) with shape (3, 2)"),
                       ds::CheckpointError);
  for (const DynTensor& copy : w32.values()) CHECK(row_major_bytes(copy) == row_major_bytes(wide));
}

TEST_CASE("values Checkpoint and safetensors::view_of cannot take are refused with a message") {
  {  // shards of one tensor with different run-time dtypes
    ds::Variable<DynTensor> a(DynTensor::of<float>({1, 2}, {1, 2}), {.name = "a"});
    ds::Variable<DynTensor> b(DynTensor::of<ds::bfloat16>({1, 2}, {ds::bfloat16(1.0f), ds::bfloat16(2.0f)}),
                              {.name = "b"});
    ds::Checkpoint c;
    CHECK_THROWS_WITH_AS(c.track_sharded("s", std::vector{a, b}),
                         "Checkpoint: shard 1 ('b') of 's' is bfloat16, but shard 0 is float32; the shards of one "
                         "tensor share a dtype",
                         ds::InvalidArgument);
    CHECK(!c.is_tracking("s"));
  }
  {  // a run-time type whose values are in device memory
    ds::Variable<DeviceDyn> d(DeviceDyn{DynTensor::of<float>({2}, {1, 2})}, {.name = "d"});
    ds::Checkpoint c;
    CHECK_THROWS_WITH_AS(c.track("dev", d),
                         "Checkpoint::track: 'dev' (variable 'd') holds float32 (2,) values in device memory, which "
                         "cannot be checkpointed yet; track a host copy",
                         ds::InvalidArgument);
    CHECK_THROWS_WITH_AS(c.track_sharded("dev", std::vector{d}),
                         "Checkpoint::track: 'dev' (variable 'd') holds float32 (2,) values in device memory, which "
                         "cannot be checkpointed yet; track a host copy",
                         ds::InvalidArgument);
    CHECK_THROWS_WITH_AS(st::view_of(d.values().front()),
                         "safetensors::view_of: the float32 (2,) value lives in device memory; copy it to the host "
                         "first",
                         ds::InvalidArgument);
  }
  {  // safetensors::view_of borrows row-major bytes only
    const DynTensor t = DynTensor::of<float>({2, 3}, {1, 2, 3, 4, 5, 6});
    CHECK_THROWS_WITH_AS(st::view_of(t.transposed()),
                         "safetensors::view_of: the float32 (3, 2) strides (1, 3) value is not row-major contiguous, "
                         "as a safetensors file stores tensors; pass a contiguous copy",
                         ds::InvalidArgument);
    CHECK_THROWS_WITH_AS(st::view_of(ColMajor::from_rows({{1, 2}, {3, 4}})),
                         "safetensors::view_of: the float32 (2, 2) strides (1, 2) value is not row-major contiguous, "
                         "as a safetensors file stores tensors; pass a contiguous copy",
                         ds::InvalidArgument);
    const st::TensorView v = st::view_of(t);
    CHECK(v.dtype == ds::DType::F32);
    CHECK(v.shape == ds::Shape{2, 3});
    CHECK(static_cast<const void*>(v.bytes.data()) == t.data());  // borrowed, not copied
  }
}

// ---- atomic writes -----------------------------------------------------------------------------

TEST_CASE("a process killed (SIGKILL) while saving leaves the previous checkpoint loadable") {
  TempDir dir;
  const fs::path path = dir / "model.safetensors";
  constexpr std::int64_t kElements = std::int64_t{1} << 20;  // 4 MiB per tensor, 8 MiB per file
  ds::Variable<ds::Tensor<float>> a(ds::Tensor<float>::full({kElements}, 1.0f), {.name = "a"});
  ds::Variable<ds::Tensor<float>> b(ds::Tensor<float>::full({kElements}, 1.0f), {.name = "b"});
  ds::Checkpoint ckpt;
  ckpt.track("a", a).track("b", b);
  ckpt.write(path);

  auto temp_files = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) n += e.path().filename().string().rfind(".model.", 0) == 0;
    return n;
  };
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> delay_us(0, 250'000);
  int killed_mid_write = 0;
  int saw_new_version = 0;
  float last_version = 1.0f;
  for (int attempt = 0; attempt < 20; ++attempt) {
    const float base = static_cast<float>(100 * (attempt + 1));
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: rewrite the checkpoint forever with new values, slowly (a pause after the header
      // and after each 4 MiB chunk, so that most of its time is spent mid-write), until killed.
      try {
        ds::CheckpointOptions options;
        options.on_progress = [](std::uint64_t, std::uint64_t) { ::usleep(15'000); };
        ds::Checkpoint child(options);
        child.track("a", a).track("b", b);
        for (float v = base;; v += 1.0f) {
          a.assign(ds::Tensor<float>::full({kElements}, v));
          b.assign(ds::Tensor<float>::full({kElements}, v));
          child.write(path);
        }
      } catch (...) {
      }
      ::_exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    killed_mid_write += temp_files() > 0;

    // Whatever the moment of the kill: a complete checkpoint, one version throughout.
    ds::Variable<ds::Tensor<float>> a2(ds::Tensor<float>::zeros({kElements}), {.name = "a"});
    ds::Variable<ds::Tensor<float>> b2(ds::Tensor<float>::zeros({kElements}), {.name = "b"});
    ds::Checkpoint loader;
    loader.track("a", a2).track("b", b2);
    REQUIRE_NOTHROW(loader.restore(path));
    const auto va = a2.read_value();
    const auto vb = b2.read_value();
    const float version = va[0];
    CHECK((version == last_version || (version >= base && version < base + 100)));
    CHECK(std::all_of(va.begin(), va.end(), [&](float x) { return x == version; }));
    CHECK(std::all_of(vb.begin(), vb.end(), [&](float x) { return x == version; }));
    saw_new_version += version != last_version;
    last_version = version;
  }
  MESSAGE(fmt::format("{} of 20 kills landed mid-write; {} left a newer complete checkpoint", killed_mid_write,
                      saw_new_version));
  CHECK(killed_mid_write > 0);
  // The next write removes the dead writers' temp files.
  ckpt.write(path);
  CHECK(temp_files() == 0);
}

TEST_CASE("a failed write leaves the target untouched and no temp file") {
  TempDir dir;
  const fs::path path = dir / "x.safetensors";
  std::vector<float> v{1, 2, 3};
  st::write(path, {{"v", st::view_of(v)}});
  const auto before = read_bytes(path);
  st::WriteOptions options;
  options.on_progress = [](std::uint64_t, std::uint64_t) { throw std::runtime_error("disk full (simulated)"); };
  std::vector<float> w{4, 5, 6};
  CHECK_THROWS_WITH(st::write(path, {{"v", st::view_of(w)}}, {}, options), "disk full (simulated)");
  CHECK(read_bytes(path) == before);
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}) == 1);
}

// ---- CheckpointManager -------------------------------------------------------------------------

TEST_CASE("CheckpointManager: save, max_to_keep, latest_checkpoint, the index file") {
  TempDir dir;
  const fs::path run = dir / "run";
  ds::Variable<std::int64_t> step(0, {.name = "step"});
  ds::Checkpoint ckpt;
  ckpt.track("step", step);
  ds::CheckpointManager manager(ckpt, run, 2);
  CHECK(!manager.latest_checkpoint());
  CHECK(!ds::latest_checkpoint(run));
  for (int i = 1; i <= 4; ++i) {
    step.assign(i * 10);
    CHECK(manager.save() == run / fmt::format("ckpt-{}.safetensors", i));
  }
  CHECK(manager.checkpoints() == std::vector<fs::path>{run / "ckpt-3.safetensors", run / "ckpt-4.safetensors"});
  CHECK(!fs::exists(run / "ckpt-1.safetensors"));
  CHECK(!fs::exists(run / "ckpt-2.safetensors"));
  CHECK(manager.latest_checkpoint() == run / "ckpt-4.safetensors");
  std::ifstream index(manager.index_path());
  const std::string text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  CHECK(text ==
        "model_checkpoint_path: \"ckpt-4.safetensors\"\n"
        "all_model_checkpoint_paths: \"ckpt-3.safetensors\"\n"
        "all_model_checkpoint_paths: \"ckpt-4.safetensors\"\n");

  // Files that only look like checkpoints are ignored; numbers compare as numbers.
  for (const char* name : {"ckpt-x.safetensors", "ckpt-99.safetensors.tmp", "other-100.safetensors", "ckpt-+7.safetensors",
                           "ckpt-.safetensors"}) {
    std::ofstream(run / name) << "junk";
  }
  CHECK(ds::latest_checkpoint(run) == run / "ckpt-4.safetensors");
  CHECK(ds::latest_checkpoint(run, "other") == run / "other-100.safetensors");

  // Explicit numbers (e.g. the global step) may not go back.
  CHECK(manager.save(1000) == run / "ckpt-1000.safetensors");
  CHECK_THROWS_WITH_AS(manager.save(999), doctest::Contains("checkpoint number 999 is older than ckpt-1000"),
                       ds::InvalidArgument);
  CHECK(manager.checkpoints().size() == 2);

  CHECK_THROWS_AS(ds::CheckpointManager(ckpt, run, 0), ds::InvalidArgument);
}

TEST_CASE("CheckpointManager: restore_or_initialize resumes from the latest checkpoint") {
  TempDir dir;
  auto make = [](ds::Variable<ds::Tensor<float>>& w, ds::Variable<std::int64_t>& step) {
    auto c = std::make_unique<ds::Checkpoint>();
    c->track("w", w).track("step", step);
    return c;
  };
  {  // a first run: nothing to restore, so initialize
    ds::Variable<ds::Tensor<float>> w(ds::Tensor<float>::zeros({3}), {.name = "w"});
    ds::Variable<std::int64_t> step(0, {.name = "step"});
    auto ckpt = make(w, step);
    ds::CheckpointManager manager(*ckpt, dir / "run", 3);
    bool initialized = false;
    CHECK(!manager.restore_or_initialize([&] { initialized = true; }));
    CHECK(initialized);
    for (int i = 1; i <= 5; ++i) {
      w.assign(ds::Tensor<float>::full({3}, static_cast<float>(i)));
      step.assign(i);
      manager.save();
    }
    CHECK(manager.checkpoints().size() == 3);
  }
  {  // a second run picks up where it stopped, counter included
    ds::Variable<ds::Tensor<float>> w(ds::Tensor<float>::zeros({3}), {.name = "w"});
    ds::Variable<std::int64_t> step(0, {.name = "step"});
    auto ckpt = make(w, step);
    ds::CheckpointManager manager(*ckpt, dir / "run", 3);
    bool initialized = false;
    CHECK(manager.restore_or_initialize([&] { initialized = true; }) == dir / "run" / "ckpt-5.safetensors");
    CHECK(!initialized);
    CHECK(w.read_value() == ds::Tensor<float>::full({3}, 5.0f));
    CHECK(step.read_value() == 5);
    CHECK(ckpt->save_counter() == 5);
    CHECK(manager.save() == dir / "run" / "ckpt-6.safetensors");
  }
  {  // a run that forgets to restore continues the numbering instead of overwriting ckpt-1
    ds::Variable<ds::Tensor<float>> w(ds::Tensor<float>::zeros({3}), {.name = "w"});
    ds::Variable<std::int64_t> step(0, {.name = "step"});
    auto ckpt = make(w, step);
    ds::CheckpointManager manager(*ckpt, dir / "run", 3);
    CHECK(manager.save() == dir / "run" / "ckpt-7.safetensors");
    CHECK(manager.latest_checkpoint() == dir / "run" / "ckpt-7.safetensors");
    CHECK(ckpt->save_counter() == 7);
  }
}

TEST_CASE("CheckpointManager on a non-chief worker writes to a temporary directory and removes it") {
  TempDir dir;
  ds::Variable<float> x(1.0f, {.name = "x"});
  ds::Checkpoint ckpt;
  ckpt.track("x", x);
  ds::CheckpointManager chief(ckpt, dir / "run", 2);
  chief.save();
  ds::Checkpoint worker_ckpt;
  worker_ckpt.track("x", x);
  ds::CheckpointManager worker(worker_ckpt, dir / "run", 2, {.is_chief = false, .task_id = 1});
  const fs::path written = worker.save();
  CHECK(written.parent_path() == dir / "run" / "workertemp_1");
  CHECK(!fs::exists(dir / "run" / "workertemp_1"));
  CHECK(worker.checkpoints() == std::vector<fs::path>{dir / "run" / "ckpt-1.safetensors"});
  CHECK(worker.latest_checkpoint() == dir / "run" / "ckpt-1.safetensors");
}

namespace {

/// A link to other worker processes that is never used: what a multi-worker strategy's placement
/// tells about this worker (index and count) without a cluster.
class FakeWorkerLink final : public ds::core::CrossWorkerLink {
 public:
  FakeWorkerLink(int index, int count) : index_(index), count_(count) {}
  int num_workers() const noexcept override { return count_; }
  int worker_index() const noexcept override { return index_; }
  void all_reduce(void*, std::size_t, ds::DType, ds::ReduceOp, std::uint32_t) override { FAIL("no collective expected"); }
  void all_gather(const void*, std::size_t, std::vector<std::byte>&, std::vector<std::size_t>&) override {
    FAIL("no collective expected");
  }
  void broadcast(void*, std::size_t, int) override { FAIL("no collective expected"); }
  void barrier() override { FAIL("no collective expected"); }

 private:
  int index_, count_;
};

/// Worker `index` of `count` workers with one replica each, as a MultiWorkerMirroredStrategy
/// looks to the rest of the library, in one process.
class FakeMultiWorkerStrategy final : public ds::AnyStrategy {
 public:
  FakeMultiWorkerStrategy(int index, int count) : link_(index, count) {}
  std::string_view name() const noexcept override { return "FakeMultiWorkerStrategy"; }
  int num_replicas_in_sync() const noexcept override { return link_.num_workers(); }
  int num_local_replicas() const noexcept override { return 1; }
  std::vector<std::string> worker_devices() const override {
    return {fmt::format("/job:worker/replica:0/task:{}/device:CPU:0", link_.worker_index())};
  }
  ds::core::VariablePlacement variable_placement() const override {
    return {ds::core::PlacementKind::Replicated, worker_devices(), num_replicas_in_sync(), id(), {},
            const_cast<FakeWorkerLink*>(&link_)};
  }
  [[nodiscard]] ds::ScopeGuard scope() { return ds::ScopeGuard(*this); }

 private:
  FakeWorkerLink link_;
};

}  // namespace

TEST_CASE("CheckpointManager without options takes chief/non-chief from the multi-worker strategy in scope") {
  TempDir dir;
  ds::Variable<float> x(2.5f, {.name = "x"});  // plain: created outside any scope
  ds::Checkpoint chief_ckpt, worker_ckpt;
  chief_ckpt.track("x", x);
  worker_ckpt.track("x", x);

  SUBCASE("outside any scope, and in a single-process strategy's scope: the chief") {
    CHECK(ds::CheckpointManager(chief_ckpt, dir / "run", 2).options().is_chief);
    ds::MirroredStrategy<ds::host> mirrored(2);
    auto scope = mirrored.scope();
    const ds::CheckpointManager manager(chief_ckpt, dir / "run", 2);
    CHECK(manager.options().is_chief);
    CHECK(manager.options().task_id == 0);
  }

  SUBCASE("worker 2 of 3 writes workertemp_2/, which is removed; worker 0 of 3 is the chief") {
    // As in a real run, every worker saves the same step (here one after the other).
    {
      FakeMultiWorkerStrategy worker2(2, 3);
      auto scope = worker2.scope();
      ds::CheckpointManager manager(worker_ckpt, dir / "run", 2);
      CHECK_FALSE(manager.options().is_chief);
      CHECK(manager.options().task_id == 2);
      CHECK(manager.save() == dir / "run" / "workertemp_2" / "ckpt-1.safetensors");
      CHECK(!fs::exists(dir / "run" / "workertemp_2"));
      CHECK(manager.checkpoints().empty());
      CHECK(!fs::exists(manager.index_path()));
      CHECK(worker_ckpt.save_counter() == 1);

      // Explicit options win over the scope.
      ds::CheckpointManager explicit_chief(worker_ckpt, dir / "run", 2, {.is_chief = true});
      CHECK(explicit_chief.options().is_chief);
    }
    FakeMultiWorkerStrategy worker0(0, 3);
    auto scope = worker0.scope();
    ds::CheckpointManager manager(chief_ckpt, dir / "run", 2);
    CHECK(manager.options().is_chief);
    CHECK(manager.options().task_id == 0);
    CHECK(manager.save() == dir / "run" / "ckpt-1.safetensors");
    CHECK(manager.checkpoints() == std::vector<fs::path>{dir / "run" / "ckpt-1.safetensors"});
    CHECK(fs::exists(manager.index_path()));
  }
}

#else

TEST_CASE("checkpoint tests need Boost.JSON") {
  MESSAGE("skipped: <boost/json.hpp> is not available, so distribute/checkpoint/ is not compiled");
}

#endif
