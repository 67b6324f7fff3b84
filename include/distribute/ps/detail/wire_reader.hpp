// The input archive for bytes that arrive from the wire: reads what cereal's BinaryOutputArchive
// writes (the same format), but never allocates on the strength of a length field alone. Every
// size tag is checked against the bytes left (each element takes at least one byte on the wire),
// vectors of arithmetic types and strings against their exact byte count, and other vectors grow
// as their elements decode. A bogus size is a cereal::Exception that names it, which the decoders
// turn into InvalidArgument; std::length_error and std::bad_alloc never get that far.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <span>
#include <streambuf>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <cereal/cereal.hpp>
#include <fmt/format.h>

#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

/// cereal's archives read a stream; this one reads bytes where they are, without a copy, and can
/// hand out a view of the next bytes (WireBytes).
class SpanReadBuffer : public std::streambuf {
 public:
  explicit SpanReadBuffer(std::span<const std::byte> bytes) {
    char* p = const_cast<char*>(reinterpret_cast<const char*>(bytes.data()));  // only read
    setg(p, p, p + bytes.size());
  }
  /// The next `n` bytes, skipped; fewer left is an error of the caller's to check first.
  std::span<const std::byte> take(std::size_t n) {
    const auto* at = reinterpret_cast<const std::byte*>(gptr());
    gbump(static_cast<int>(n));
    return {at, n};
  }
};

/// Bytes of a message read where they lie in the bytes being decoded (a request, which outlives
/// the decoded message) instead of copied into a string; written like a std::string (a size, then
/// the bytes), so a message holding them has the layout of one holding a string.
struct WireBytes {
  std::span<const std::byte> bytes;
  std::string_view chars() const noexcept { return {reinterpret_cast<const char*>(bytes.data()), bytes.size()}; }
};

class WireReader : public cereal::InputArchive<WireReader, cereal::AllowEmptyClassElision> {
 public:
  /// `stream` reads from a buffer that can seek or whose get area holds all it has (a span's, a string's).
  explicit WireReader(std::istream& stream)
      : cereal::InputArchive<WireReader, cereal::AllowEmptyClassElision>(this), stream_(stream) {}

  void loadBinary(void* data, std::streamsize size) {
    const auto got = stream_.rdbuf()->sgetn(static_cast<char*>(data), size);
    if (got != size) throw cereal::Exception(fmt::format("{} bytes claimed, {} left", size, got));
  }

  /// Bytes not read yet: from seeking where the buffer can seek (a string buffer's get area may
  /// lag behind what it holds), else what its get area holds (a span's buffer holds all of it).
  std::uint64_t remaining() const {
    std::streambuf* b = stream_.rdbuf();
    const auto here = b->pubseekoff(0, std::ios::cur, std::ios::in);
    if (here != std::streampos(-1)) {
      const auto end = b->pubseekoff(0, std::ios::end, std::ios::in);
      b->pubseekpos(here, std::ios::in);
      if (end != std::streampos(-1) && end >= here) return static_cast<std::uint64_t>(end - here);
    }
    const auto n = b->in_avail();
    return n > 0 ? static_cast<std::uint64_t>(n) : 0;
  }

  /// The next `n` bytes where they lie (they fit: check_fits first); only from a SpanReadBuffer.
  std::span<const std::byte> view(std::size_t n) {
    auto* span = dynamic_cast<SpanReadBuffer*>(stream_.rdbuf());
    if (span == nullptr || n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw cereal::Exception(fmt::format("a block of {} bytes cannot be read in place here", n));
    }
    return span->take(n);
  }

  /// Throws unless `count` elements of at least `min_bytes` each fit in what is left.
  void check_fits(std::uint64_t count, std::uint64_t min_bytes, const char* what) const {
    std::uint64_t need = 0;
    if (!checked_mul(count, min_bytes, need) || need > remaining()) {
      throw cereal::Exception(
          fmt::format("{} of {} elements claimed with {} bytes left", what, count, remaining()));
    }
  }

 private:
  std::istream& stream_;
};

template <class T>
  requires std::is_arithmetic_v<T>
void CEREAL_LOAD_FUNCTION_NAME(WireReader& ar, T& t) {
  if constexpr (std::is_same_v<T, bool>) {
    // A byte other than 0 or 1 copied into a bool is undefined behaviour (found by tests/fuzz/fuzz_ps).
    std::uint8_t b = 0;
    ar.loadBinary(&b, 1);
    if (b > 1) throw cereal::Exception(fmt::format("a bool holds the byte {}", b));
    t = b == 1;
  } else {
    ar.loadBinary(std::addressof(t), sizeof(t));
  }
}

template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(WireReader& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}

template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(WireReader& ar, cereal::SizeTag<T>& t) {
  ar(t.size);
  ar.check_fits(static_cast<std::uint64_t>(t.size), 1, "a container");
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(WireReader& ar, cereal::BinaryData<T>& bd) {
  ar.check_fits(bd.size, 1, "a block");
  ar.loadBinary(bd.data, static_cast<std::streamsize>(bd.size));
}

template <class CharT, class Traits, class Alloc>
void CEREAL_LOAD_FUNCTION_NAME(WireReader& ar, std::basic_string<CharT, Traits, Alloc>& str) {
  cereal::size_type size = 0;
  ar(size);
  ar.check_fits(size, sizeof(CharT), "a string");
  str.resize(static_cast<std::size_t>(size));
  ar.loadBinary(str.data(), static_cast<std::streamsize>(size * sizeof(CharT)));
}

inline void CEREAL_LOAD_FUNCTION_NAME(WireReader& ar, WireBytes& b) {
  cereal::size_type size = 0;
  ar(size);
  ar.check_fits(size, 1, "a string");
  b.bytes = ar.view(static_cast<std::size_t>(size));
}

template <class Archive>
void CEREAL_SAVE_FUNCTION_NAME(Archive& ar, const WireBytes& b) {
  ar(cereal::make_size_tag(static_cast<cereal::size_type>(b.bytes.size())));
  ar(cereal::binary_data(b.bytes.data(), b.bytes.size()));
}

template <class T, class A>
  requires(!std::is_same_v<T, bool>)
void CEREAL_LOAD_FUNCTION_NAME(WireReader& ar, std::vector<T, A>& v) {
  cereal::size_type size = 0;
  ar(size);
  if constexpr (std::is_arithmetic_v<T>) {
    ar.check_fits(size, sizeof(T), "a vector");
    v.resize(static_cast<std::size_t>(size));
    ar.loadBinary(v.data(), static_cast<std::streamsize>(size * sizeof(T)));
  } else {
    ar.check_fits(size, 1, "a vector");
    v.clear();
    for (cereal::size_type i = 0; i < size; ++i) {  // grows as elements decode
      v.emplace_back();
      ar(v.back());
    }
  }
}

template <class A>
void CEREAL_LOAD_FUNCTION_NAME(WireReader& ar, std::vector<bool, A>& v) {
  cereal::size_type size = 0;
  ar(size);
  ar.check_fits(size, 1, "a vector");
  v.clear();
  for (cereal::size_type i = 0; i < size; ++i) {
    bool b = false;
    ar(b);
    v.push_back(b);
  }
}

}  // namespace ps::detail
DISTRIBUTE_END_NAMESPACE

// Half of CEREAL_SETUP_ARCHIVE_TRAITS: the other half (output to input) belongs to BinaryInputArchive.
namespace cereal::traits::detail {
template <>
struct get_output_from_input<distribute::ps::detail::WireReader> {
  using type = cereal::BinaryOutputArchive;
};
}  // namespace cereal::traits::detail
