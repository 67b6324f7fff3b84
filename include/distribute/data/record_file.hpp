// Record files: TensorFlow's TFRecord format (a length-prefixed record per entry, each length
// and payload guarded by a masked CRC-32C), so that files written here are read by
// tf.data.TFRecordDataset and the other way round. Read with data::from_record_files.
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace data {

/// A record file is truncated or its checksums do not match (TF's DataLossError).
class DataLossError : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// CRC-32C (Castagnoli), the checksum of the TFRecord format; crc32c("123456789") == 0xE3069283.
inline std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept {
  static constexpr auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

/// TFRecord stores CRCs masked, so that a CRC of data that itself holds CRCs stays robust.
inline std::uint32_t masked_crc32c(const void* data, std::size_t size) noexcept {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

// The format is little-endian whatever the host's byte order.
inline void store_le(unsigned char* out, std::uint64_t v, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t load_le(const unsigned char* in, std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

/// "what: cannot open 'path' (strerror(errno))".
DISTRIBUTE_DECL std::string open_error(std::string_view what, const std::string& path);

}  // namespace detail

/// Reads a record file (TFRecord format) front to back, checking both CRCs of every record (TF's
/// tf_record_iterator). `who` names the caller in the error for a file that cannot be opened.
class RecordReader {
 public:
  explicit RecordReader(std::string path, std::string_view who = "from_record_files");

  /// The next record, nullopt at a clean end of file; DataLossError on a truncated or corrupted one.
  std::optional<std::string> next();

 private:
  [[noreturn]] void fail(const std::string& why) const;

  std::string path_;
  std::ifstream in_;
  std::uint64_t offset_ = 0;
};

/// Writes a record file (TFRecord format) record by record; close() or the destructor flushes it.
class RecordWriter {
 public:
  explicit RecordWriter(std::string path);

  void write(std::string_view record);

  /// Hands what was written to the operating system (readers see every whole record written).
  void flush();

  const std::string& path() const noexcept { return path_; }

  void close();

 private:
  std::string path_;
  std::ofstream out_;
};

/// Writes `records` to a new record file at `path`.
DISTRIBUTE_DECL void write_record_file(const std::string& path, const std::vector<std::string>& records);

#if DISTRIBUTE_DETAIL_DEFINE  // compiled apart with DISTRIBUTE_SEPARATE_COMPILATION (version.hpp)
DISTRIBUTE_DECL std::string detail::open_error(std::string_view what, const std::string& path) {
  return fmt::format("{}: cannot open '{}' ({})", what, path, std::strerror(errno));
}

DISTRIBUTE_DECL RecordReader::RecordReader(std::string path, std::string_view who)
    : path_(std::move(path)), in_(path_, std::ios::binary) {
  if (!in_) throw InvalidArgument(detail::open_error(who, path_));
}

DISTRIBUTE_DECL std::optional<std::string> RecordReader::next() {
  unsigned char header[12];
  in_.read(reinterpret_cast<char*>(header), sizeof header);
  const auto got = static_cast<std::size_t>(in_.gcount());
  if (got == 0) return std::nullopt;
  if (got < sizeof header) fail("truncated record header");
  using detail::load_le;
  using detail::masked_crc32c;
  if (load_le(header + 8, 4) != masked_crc32c(header, 8)) fail("corrupted record length (checksum mismatch)");
  const std::uint64_t length = load_le(header, 8);
  // A header may claim any length: the payload grows as its bytes come, a piece at a time, so that
  // a false length costs no more memory than the file holds.
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  std::string payload;
  while (payload.size() < length) {
    const auto at = payload.size();
    const auto piece = static_cast<std::size_t>(std::min(kPiece, length - at));
    payload.resize(at + piece);
    in_.read(payload.data() + at, static_cast<std::streamsize>(piece));
    if (static_cast<std::size_t>(in_.gcount()) != piece) fail(fmt::format("truncated record of {} bytes", length));
  }
  unsigned char footer[4];
  in_.read(reinterpret_cast<char*>(footer), sizeof footer);
  if (static_cast<std::size_t>(in_.gcount()) != sizeof footer) fail("truncated record checksum");
  if (load_le(footer, 4) != masked_crc32c(payload.data(), payload.size())) {
    fail("corrupted record data (checksum mismatch)");
  }
  offset_ += sizeof header + length + sizeof footer;
  return payload;
}

DISTRIBUTE_DECL void RecordReader::fail(const std::string& why) const {
  throw DataLossError(fmt::format("record file '{}': {} at byte offset {}", path_, why, offset_));
}

DISTRIBUTE_DECL RecordWriter::RecordWriter(std::string path)
    : path_(std::move(path)), out_(path_, std::ios::binary | std::ios::trunc) {
  if (!out_) throw InvalidArgument(detail::open_error("RecordWriter", path_));
}

DISTRIBUTE_DECL void RecordWriter::write(std::string_view record) {
  unsigned char header[12];
  detail::store_le(header, record.size(), 8);
  detail::store_le(header + 8, detail::masked_crc32c(header, 8), 4);
  unsigned char footer[4];
  detail::store_le(footer, detail::masked_crc32c(record.data(), record.size()), 4);
  out_.write(reinterpret_cast<const char*>(header), sizeof header);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.write(reinterpret_cast<const char*>(footer), sizeof footer);
  if (!out_) throw Error(fmt::format("RecordWriter: writing '{}' failed ({})", path_, std::strerror(errno)));
}

DISTRIBUTE_DECL void RecordWriter::flush() {
  out_.flush();
  if (!out_) throw Error(fmt::format("RecordWriter: writing '{}' failed ({})", path_, std::strerror(errno)));
}

DISTRIBUTE_DECL void RecordWriter::close() {
  out_.close();
  if (out_.fail()) throw Error(fmt::format("RecordWriter: closing '{}' failed ({})", path_, std::strerror(errno)));
}

DISTRIBUTE_DECL void write_record_file(const std::string& path, const std::vector<std::string>& records) {
  RecordWriter writer(path);
  for (const auto& r : records) writer.write(r);
  writer.close();
}
#endif  // DISTRIBUTE_DETAIL_DEFINE

}  // namespace data
DISTRIBUTE_END_NAMESPACE
