// safetensors files: read, write, validate.
//
// Layout (https://github.com/huggingface/safetensors):
//   8 bytes   N, little-endian u64
//   N bytes   JSON header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//                           "__metadata__": {"key": "value", ...}}
//             padded with spaces so that the payload starts 8-byte aligned
//   payload   the tensors' bytes, row-major, little-endian; offsets are relative to the payload
//
// What distribute adds, inside __metadata__ (so any safetensors reader still reads the file):
//   "distribute.format": "1"
//   "distribute.crc32.<tensor>": CRC-32 (IEEE, as zlib.crc32) of that tensor's bytes, 8 hex digits
//   "distribute.header_crc32": CRC-32 of a canonical form of the header (see checkpoint::detail::header_digest),
//                              so that a corrupted shape, offset, name or metadata value is caught too
// A file carrying any of these must carry all of them. Files without them (written by Python's
// safetensors, say) are read with the structural checks only.
//
// Every problem is a ds::CheckpointError naming the file and, where there is one, the tensor.
// The file's data model is in safetensors_types.hpp, its header's parser in detail/safetensors_header.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/checkpoint/detail/posix_file.hpp>
#include <distribute/checkpoint/detail/safetensors_header.hpp>
#include <distribute/checkpoint/safetensors_types.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace safetensors {

/// The bytes of a safetensors file holding `tensors` and `metadata` (with distribute's checksums).
inline std::vector<std::byte> serialize(const TensorMap& tensors, const Metadata& metadata = {}) {
  const checkpoint::detail::Layout layout = checkpoint::detail::plan(tensors, metadata);
  std::vector<std::byte> out;
  out.reserve(layout.header.size() + layout.payload_size);
  const auto* h = reinterpret_cast<const std::byte*>(layout.header.data());
  out.insert(out.end(), h, h + layout.header.size());
  for (const auto& [name, view] : layout.order) out.insert(out.end(), view->bytes.begin(), view->bytes.end());
  return out;
}

/// Writes `path` atomically: it holds either its previous contents or the complete new file,
/// whatever happens during the write (see checkpoint::detail::AtomicFile).
inline void write(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata = {},
                  const WriteOptions& options = {}) {
  const checkpoint::detail::Layout layout = checkpoint::detail::plan(tensors, metadata);
  const std::uint64_t total = layout.header.size() + layout.payload_size;
  std::uint64_t written = 0;
  distribute::checkpoint::detail::AtomicFile file(path, options.durable);
  auto put = [&](std::span<const std::byte> bytes) {
    file.write(bytes);
    written += bytes.size();
    if (options.on_progress) options.on_progress(written, total);
  };
  put(std::as_bytes(std::span(layout.header.data(), layout.header.size())));
  for (const auto& [name, view] : layout.order) {
    for (std::size_t at = 0; at < view->bytes.size(); at += checkpoint::detail::kWriteChunk) {
      put(view->bytes.subspan(at, std::min(checkpoint::detail::kWriteChunk, view->bytes.size() - at)));
    }
  }
  file.commit();
}

/// Parses and validates a whole file held in memory; `origin` names it in errors.
inline File parse(std::span<const std::byte> bytes, std::string origin = "<memory>", const ReadOptions& options = {}) {
  checkpoint::detail::check_prefix(bytes.size(), origin);
  const std::uint64_t n = checkpoint::detail::read_le64(bytes.data());
  checkpoint::detail::check_header_length(n, bytes.size(), origin);
  const std::string_view json(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n));
  const std::uint64_t payload_start = 8 + n;
  checkpoint::detail::Header h = checkpoint::detail::parse_header(json, bytes.size() - payload_start, origin);
  File file;
  file.origin = std::move(origin);
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, {}};
    auto src = bytes.subspan(static_cast<std::size_t>(payload_start + e.begin), static_cast<std::size_t>(e.end - e.begin));
    t.bytes.assign(src.begin(), src.end());
    checkpoint::detail::check_tensor_bytes(h, t, file.origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

/// Reads and validates a safetensors file; every problem is a CheckpointError naming the file.
inline File read(const std::filesystem::path& path, const ReadOptions& options = {}) {
  const std::string origin = path.string();
  auto fd = distribute::checkpoint::detail::open_for_reading(path);
  const std::uint64_t size = distribute::checkpoint::detail::file_size(fd, path);
  checkpoint::detail::check_prefix(size, origin);
  std::array<std::byte, 8> prefix{};
  distribute::checkpoint::detail::read_exact(fd, prefix, 0, path, "the header length");
  const std::uint64_t n = checkpoint::detail::read_le64(prefix.data());
  checkpoint::detail::check_header_length(n, size, origin);
  std::string json(static_cast<std::size_t>(n), '\0');
  distribute::checkpoint::detail::read_exact(fd, std::as_writable_bytes(std::span(json.data(), json.size())), 8, path,
                                 "the JSON header");
  const std::uint64_t payload_start = 8 + n;
  checkpoint::detail::Header h = checkpoint::detail::parse_header(json, size - payload_start, origin);
  File file;
  file.origin = origin;
  for (auto& e : h.entries) {
    StoredTensor t{e.name, e.dtype, e.shape, std::vector<std::byte>(static_cast<std::size_t>(e.end - e.begin))};
    distribute::checkpoint::detail::read_exact(fd, t.bytes, payload_start + e.begin, path, fmt::format("tensor '{}'", e.name));
    checkpoint::detail::check_tensor_bytes(h, t, origin, options);
    file.tensors.push_back(std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
}

}  // namespace safetensors

DISTRIBUTE_END_NAMESPACE
