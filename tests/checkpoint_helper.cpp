// Helper for tests/check_safetensors.py, which checks with an independent (Python) reader that our
// files are valid safetensors, and that we read files written by someone else.
//
//   checkpoint_helper write <dir>   writes <dir>/tensors.safetensors (every dtype, ranks 0-4) and
//                                   <dir>/ckpt-1.safetensors (through ds::Checkpoint)
//   checkpoint_helper dump <file>   prints each tensor as  name|DTYPE|dims|values  (sorted by name;
//                                   floats in shortest round-trip form, F16/BF16 as bit patterns)
//   checkpoint_helper restore-half <file>
//                                   restores "f16" (float16, shape [2, 5]), "bf16" (bfloat16, [10])
//                                   and "bf16_scalar" (bfloat16, []) through ds::Checkpoint and
//                                   prints each as  name|bits,bits,...
//
// The values follow formulas that check_safetensors.py repeats (element index i):
//   F32, F64: (i - 5) * 0.25            I8: (i*37) % 256 - 128        U8: (i*37) % 256
//   I16: (i*1001) % 65536 - 32768       U16: (i*1001) % 65536
//   I32: i*100003 - 2^31 + 5            U32: 2^32 - 1 - i*100003
//   I64: i*1234567890123 - 2^62         U64: 2^64 - 1 - i*1234567890123
//   BOOL: i % 3 == 0                    F16 bits: 0x3c00 + i*0x111    BF16 bits: 0x3f80 + i*0x101
// with shapes [], [3], [2, 3], [2, 1, 4], [1, 2, 2, 3] for ranks 0-4, named "<DTYPE>_r<rank>".
// ckpt-1 also holds 16-bit float variables made from floats (check_safetensors_numpy.py repeats them):
//   half/f16  (float16, [2, 5])  1, -0, inf, -inf, NaN, 2^-24, 1023 * 2^-24, 65504, -2, 0.1
//   half/bf16 (bfloat16, [10])   1, -0, inf, -inf, NaN, 2^-133, 0x1.fep127, -2, 0.1, 3.14159265
//   half/f16_scalar -1.5         half/bf16_scalar 0.5
#define DISTRIBUTE_WITH_CHECKPOINT
#include <distribute/distribute.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ds = distribute;
namespace st = distribute::safetensors;

namespace {

const std::vector<ds::Shape> kShapes = {{}, {3}, {2, 3}, {2, 1, 4}, {1, 2, 2, 3}};

template <class T>
T value_at(ds::DType d, std::uint64_t i) {
  switch (d) {
    case ds::DType::F32: case ds::DType::F64: return static_cast<T>((static_cast<double>(i) - 5.0) * 0.25);
    case ds::DType::I8: return static_cast<T>(static_cast<std::int64_t>((i * 37) % 256) - 128);
    case ds::DType::U8: return static_cast<T>((i * 37) % 256);
    case ds::DType::I16: return static_cast<T>(static_cast<std::int64_t>((i * 1001) % 65536) - 32768);
    case ds::DType::U16: return static_cast<T>((i * 1001) % 65536);
    case ds::DType::I32: return static_cast<T>(static_cast<std::int64_t>(i * 100003) - 2147483648LL + 5);
    case ds::DType::U32: return static_cast<T>(4294967295ULL - i * 100003);
    case ds::DType::I64:
      return static_cast<T>(static_cast<std::int64_t>(i * 1234567890123ULL) - (std::int64_t{1} << 62));
    case ds::DType::U64: return static_cast<T>(18446744073709551615ULL - i * 1234567890123ULL);
    case ds::DType::Bool: return static_cast<T>(i % 3 == 0);
    case ds::DType::F16: return static_cast<T>((0x3c00 + i * 0x111) % 65536);
    case ds::DType::BF16: return static_cast<T>((0x3f80 + i * 0x101) % 65536);
  }
  return T{};
}

template <class T>
std::vector<std::byte> sample_bytes(ds::DType d, std::size_t n) {
  std::vector<std::byte> out(n * sizeof(T));
  for (std::size_t i = 0; i < n; ++i) {
    const T v = value_at<T>(d, i);
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
  return out;
}

std::vector<std::byte> sample(ds::DType d, std::size_t n) {
  switch (d) {
    case ds::DType::F16: case ds::DType::BF16: case ds::DType::U16: return sample_bytes<std::uint16_t>(d, n);
    case ds::DType::F32: return sample_bytes<float>(d, n);
    case ds::DType::F64: return sample_bytes<double>(d, n);
    case ds::DType::I8: return sample_bytes<std::int8_t>(d, n);
    case ds::DType::I16: return sample_bytes<std::int16_t>(d, n);
    case ds::DType::I32: return sample_bytes<std::int32_t>(d, n);
    case ds::DType::I64: return sample_bytes<std::int64_t>(d, n);
    case ds::DType::U8: case ds::DType::Bool: return sample_bytes<std::uint8_t>(d, n);
    case ds::DType::U32: return sample_bytes<std::uint32_t>(d, n);
    case ds::DType::U64: return sample_bytes<std::uint64_t>(d, n);
  }
  return {};
}

template <class T>
ds::Tensor<T> sample_tensor(ds::DType d, ds::Shape shape) {
  std::vector<T> v(static_cast<std::size_t>(ds::num_elements(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = value_at<T>(d, i);
  return ds::Tensor<T>(std::move(shape), std::move(v));
}

void write(const std::string& dir) {
  std::vector<std::vector<std::byte>> storage;
  storage.reserve(ds::kNumDTypes * kShapes.size());
  st::TensorMap tensors;
  for (std::uint8_t code = 0; code < ds::kNumDTypes; ++code) {
    const auto d = static_cast<ds::DType>(code);
    for (std::size_t r = 0; r < kShapes.size(); ++r) {
      storage.push_back(sample(d, static_cast<std::size_t>(ds::num_elements(kShapes[r]))));
      tensors.emplace(fmt::format("{}_r{}", st::dtype_name(d), r), st::TensorView{d, kShapes[r], storage.back()});
    }
  }
  st::write(dir + "/tensors.safetensors", tensors, {{"format", "pt"}});

  // Through Checkpoint: a plain tensor, a scalar, a sharded variable (2 shards saved as one).
  ds::Variable<ds::Tensor<float>> kernel(sample_tensor<float>(ds::DType::F32, {3, 2}), {.name = "kernel"});
  ds::Variable<std::int64_t> step(42, {.name = "step"});
  const auto table = sample_tensor<double>(ds::DType::F64, {5, 2});
  std::vector<double> top(table.values().begin(), table.values().begin() + 6);
  std::vector<double> bottom(table.values().begin() + 6, table.values().end());
  std::vector<ds::Variable<ds::Tensor<double>>> shards{
      ds::Variable<ds::Tensor<double>>(ds::Tensor<double>({3, 2}, top), {.name = "emb/part_0"}),
      ds::Variable<ds::Tensor<double>>(ds::Tensor<double>({2, 2}, bottom), {.name = "emb/part_1"})};
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> f16_values = {1.0f, -0.0f, inf, -inf, nan, 0x1p-24f, 0x1.ff8p-15f, 65504.0f, -2.0f, 0.1f};
  const std::vector<float> bf16_values = {1.0f,  -0.0f, inf, -inf, nan, 0x1p-133f, 0x1.fep127f, -2.0f, 0.1f,
                                          3.14159265f};
  std::vector<ds::float16> f16;
  for (float v : f16_values) f16.push_back(ds::float16(v));
  std::vector<ds::bfloat16> bf16;
  for (float v : bf16_values) bf16.push_back(ds::bfloat16(v));
  ds::Variable<ds::Tensor<ds::float16>> half_tensor(ds::Tensor<ds::float16>({2, 5}, f16), {.name = "half/f16"});
  ds::Variable<std::vector<ds::bfloat16>> half_vector(bf16, {.name = "half/bf16"});
  ds::Variable<ds::float16> f16_scalar(ds::float16(-1.5f), {.name = "half/f16_scalar"});
  ds::Variable<ds::bfloat16> bf16_scalar(ds::bfloat16(0.5f), {.name = "half/bf16_scalar"});

  ds::Checkpoint ckpt;
  ckpt.track("dense/kernel", kernel).track("step", step).track_sharded("embedding", shards);
  ckpt.track("half/f16", half_tensor).track("half/bf16", half_vector);
  ckpt.track("half/f16_scalar", f16_scalar).track("half/bf16_scalar", bf16_scalar);
  ckpt.save(dir + "/ckpt");
}

template <class Range>
std::string join_bits(const Range& halves) {
  std::vector<std::uint16_t> bits;
  for (auto h : halves) bits.push_back(ds::to_bits(h));
  return fmt::format("{}", fmt::join(bits, ","));
}

void restore_half(const std::string& path) {
  ds::Variable<ds::Tensor<ds::float16>> f16(ds::Tensor<ds::float16>::zeros({2, 5}), {.name = "f16"});
  ds::Variable<std::vector<ds::bfloat16>> bf16(std::vector<ds::bfloat16>(10), {.name = "bf16"});
  ds::Variable<ds::bfloat16> bf16_scalar(ds::bfloat16(0.0f), {.name = "bf16_scalar"});
  ds::Checkpoint ckpt;
  ckpt.track("f16", f16).track("bf16", bf16).track("bf16_scalar", bf16_scalar);
  ckpt.restore(path);
  fmt::print("f16|{}\n", join_bits(f16.read_value().values()));
  fmt::print("bf16|{}\n", join_bits(bf16.read_value()));
  fmt::print("bf16_scalar|{}\n", ds::to_bits(bf16_scalar.read_value()));
}

template <class T>
std::string join_values(const st::StoredTensor& t) {
  std::vector<T> v(t.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  if constexpr (sizeof(T) == 1) {
    std::vector<int> ints(v.begin(), v.end());  // print bytes as numbers, not characters
    return fmt::format("{}", fmt::join(ints, ","));
  } else {
    return fmt::format("{}", fmt::join(v, ","));
  }
}

void dump(const std::string& path) {
  const st::File file = st::read(path);
  std::vector<const st::StoredTensor*> sorted;
  for (const auto& t : file.tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const st::StoredTensor* t : sorted) {
    std::string values;
    switch (t->dtype) {
      case ds::DType::F16: case ds::DType::BF16: case ds::DType::U16: values = join_values<std::uint16_t>(*t); break;
      case ds::DType::F32: values = join_values<float>(*t); break;
      case ds::DType::F64: values = join_values<double>(*t); break;
      case ds::DType::I8: values = join_values<std::int8_t>(*t); break;
      case ds::DType::I16: values = join_values<std::int16_t>(*t); break;
      case ds::DType::I32: values = join_values<std::int32_t>(*t); break;
      case ds::DType::I64: values = join_values<std::int64_t>(*t); break;
      case ds::DType::U8: case ds::DType::Bool: values = join_values<std::uint8_t>(*t); break;
      case ds::DType::U32: values = join_values<std::uint32_t>(*t); break;
      case ds::DType::U64: values = join_values<std::uint64_t>(*t); break;
    }
    fmt::print("{}|{}|{}|{}\n", t->name, st::dtype_name(t->dtype), fmt::join(t->shape, ","), values);
  }
  for (const auto& [key, value] : file.metadata) fmt::print("@{}={}\n", key, value);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s write <dir> | dump <file> | restore-half <file>\n", argv[0]);
    return 2;
  }
  try {
    const std::string command = argv[1];
    if (command == "write") {
      write(argv[2]);
    } else if (command == "dump") {
      dump(argv[2]);
    } else if (command == "restore-half") {
      restore_half(argv[2]);
    } else {
      std::fprintf(stderr, "unknown command '%s'\n", argv[1]);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
