// The few pieces of the protocol-buffer wire format that event files need (varints, 64- and 32-bit
// fixed fields, length-delimited fields), by hand: the messages are three small ones with five
// scalar fields, and protobuf's own library would mean code generation and a large dependency.
// https://protobuf.dev/programming-guides/encoding/
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace summary::detail {

enum class WireType : std::uint8_t { Varint = 0, Fixed64 = 1, LengthDelimited = 2, Fixed32 = 5 };

/// Appends fields to a message's bytes (little-endian, as the format is on every host).
class WireWriter {
 public:
  void varint_field(int field, std::uint64_t v) {
    key(field, WireType::Varint);
    varint(v);
  }
  /// int64 fields are varints of the two's complement (a negative value takes ten bytes).
  void int64_field(int field, std::int64_t v) { varint_field(field, static_cast<std::uint64_t>(v)); }
  void double_field(int field, double v) {
    key(field, WireType::Fixed64);
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    fixed(bits, 8);
  }
  void float_field(int field, float v) {
    key(field, WireType::Fixed32);
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    fixed(bits, 4);
  }
  /// A string, bytes or embedded message (its bytes).
  void bytes_field(int field, std::string_view bytes) {
    key(field, WireType::LengthDelimited);
    varint(bytes.size());
    out_.append(bytes);
  }

  const std::string& bytes() const& noexcept { return out_; }
  std::string bytes() && noexcept { return std::move(out_); }

 private:
  void key(int field, WireType type) { varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint64_t>(type)); }
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void fixed(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }

  std::string out_;
};

/// One field read from a message: its number, wire type and value (`number` for varints and fixed
/// fields, `bytes` for length-delimited ones).
struct WireField {
  int field = 0;
  WireType type = WireType::Varint;
  std::uint64_t number = 0;
  std::string_view bytes;

  double as_double() const noexcept {
    double d;
    std::memcpy(&d, &number, sizeof d);
    return d;
  }
  float as_float() const noexcept {
    const auto bits = static_cast<std::uint32_t>(number);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

/// Reads a message's fields in order. next() gives nullopt at the end; `error()` says why it
/// stopped early on malformed input (a truncated field, an overlong varint, a group or an unknown
/// wire type), empty otherwise.
class WireReader {
 public:
  explicit WireReader(std::string_view message) : in_(message) {}

  std::optional<WireField> next() {
    if (in_.empty() || !error_.empty()) return std::nullopt;
    std::uint64_t key = 0;
    if (!varint(key)) return fail("truncated or overlong field key");
    WireField f;
    f.field = static_cast<int>(key >> 3);
    if (f.field == 0 || (key >> 3) > 0x1FFFFFFF) return fail("field number 0 or out of range");
    switch (key & 7) {
      case 0:
        f.type = WireType::Varint;
        if (!varint(f.number)) return fail("truncated or overlong varint");
        break;
      case 1:
        f.type = WireType::Fixed64;
        if (!fixed(f.number, 8)) return fail("truncated 64-bit field");
        break;
      case 5:
        f.type = WireType::Fixed32;
        if (!fixed(f.number, 4)) return fail("truncated 32-bit field");
        break;
      case 2: {
        f.type = WireType::LengthDelimited;
        std::uint64_t length = 0;
        if (!varint(length)) return fail("truncated length");
        if (length > in_.size()) return fail("length-delimited field longer than the message");
        f.bytes = in_.substr(0, static_cast<std::size_t>(length));
        in_.remove_prefix(static_cast<std::size_t>(length));
        break;
      }
      default: return fail("unsupported wire type " + std::to_string(key & 7));
    }
    return f;
  }

  const std::string& error() const noexcept { return error_; }

 private:
  std::nullopt_t fail(std::string why) {
    error_ = std::move(why);
    return std::nullopt;
  }
  bool varint(std::uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (in_.empty()) return false;
      const auto byte = static_cast<unsigned char>(in_.front());
      in_.remove_prefix(1);
      v |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  }
  bool fixed(std::uint64_t& v, std::size_t n) {
    if (in_.size() < n) return false;
    v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in_[i])) << (8 * i);
    in_.remove_prefix(n);
    return true;
  }

  std::string_view in_;
  std::string error_;
};

}  // namespace summary::detail
DISTRIBUTE_END_NAMESPACE
