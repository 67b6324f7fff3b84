// The header of a safetensors file: parsing and checking it (every offset, shape and checksum of
// a file from anywhere), and planning the one a write produces (checkpoint/safetensors.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/crc.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

#include <distribute/checkpoint/safetensors_types.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace checkpoint::detail {

inline constexpr std::string_view kFormatKey = "distribute.format";
inline constexpr std::string_view kFormatVersion = "1";
inline constexpr std::string_view kHeaderCrcKey = "distribute.header_crc32";
inline constexpr std::string_view kTensorCrcPrefix = "distribute.crc32.";
inline constexpr std::string_view kMetadataKey = "__metadata__";
// The Rust reference implementation refuses larger headers too; it bounds what a corrupted
// length prefix can make us allocate.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr std::size_t kWriteChunk = std::size_t{4} << 20;

inline std::uint32_t crc32(std::span<const std::byte> bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}
inline std::string crc_hex(std::uint32_t crc) { return fmt::format("{:08x}", crc); }

inline bool is_reserved_key(std::string_view key) {
  return key == kFormatKey || key == kHeaderCrcKey || key.substr(0, kTensorCrcPrefix.size()) == kTensorCrcPrefix;
}

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// The header's meaning in a canonical form: tensors by name, then metadata by key (without the
// header checksum itself). The JSON text is not hashed, so formatting and key order are free.
//   "T" name NUL dtype NUL dims,joined,by,commas NUL begin NUL end "\n"
//   "M" key NUL value "\n"
inline std::uint32_t header_digest(std::vector<const Entry*> entries, const safetensors::Metadata& metadata) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  std::string text;
  for (const Entry* e : entries) {
    text += 'T';
    text += e->name;
    text += '\0';
    text += safetensors::dtype_name(e->dtype);
    text += '\0';
    text += fmt::format("{}", fmt::join(e->shape, ","));
    text += '\0';
    text += fmt::format("{}", e->begin);
    text += '\0';
    text += fmt::format("{}\n", e->end);
  }
  for (const auto& [key, value] : metadata) {
    if (key == kHeaderCrcKey) continue;
    text += 'M';
    text += key;
    text += '\0';
    text += value;
    text += '\n';
  }
  return crc32(std::as_bytes(std::span(text.data(), text.size())));
}

inline std::uint64_t checked_size(const std::string& origin, const Entry& e) {
  const std::optional<std::uint64_t> count = checked_count(e.shape);  // 0 when a dimension is 0
  std::uint64_t n = 0;
  if (!count || !checked_mul(*count, size_of(e.dtype), n)) {
    throw CheckpointError(fmt::format("'{}': tensor '{}' has shape {}, whose byte size overflows 64 bits", origin, e.name,
                                      shape_string(e.shape)));
  }
  return n;
}

inline std::uint64_t json_unsigned(const boost::json::value& v, const std::string& origin, const std::string& name,
                                   const char* field) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64() && v.get_int64() >= 0) return static_cast<std::uint64_t>(v.get_int64());
  throw CheckpointError(fmt::format("'{}': tensor '{}': {} must hold non-negative integers, not {}", origin, name, field,
                                    boost::json::serialize(v)));
}

// A parsed and validated header: entries in payload order, the metadata, and whether the file
// carries distribute's checksums.
struct Header {
  std::vector<Entry> entries;  // in payload order
  safetensors::Metadata metadata;
  bool has_checksums = false;
};

inline Header parse_header(std::string_view json, std::uint64_t payload_size, const std::string& origin) {
  if (json.empty() || json.front() != '{') {
    throw CheckpointError(fmt::format("'{}': the header does not start with '{{': not a safetensors file, or a "
                                      "corrupted one",
                                      origin));
  }
  boost::system::error_code ec;
  boost::json::value root = boost::json::parse(json, ec);
  if (ec) {
    throw CheckpointError(fmt::format("'{}': the JSON header ({} bytes) is invalid: {}", origin, json.size(),
                                      ec.message()));
  }
  if (!root.is_object()) throw CheckpointError(fmt::format("'{}': the JSON header is not an object", origin));

  Header h;
  for (const auto& kv : root.get_object()) {
    const std::string name(kv.key());
    const boost::json::value& v = kv.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ must be an object of strings, not {}", origin,
                                          boost::json::serialize(v)));
      }
      for (const auto& m : v.get_object()) {
        if (!m.value().is_string()) {
          throw CheckpointError(fmt::format("'{}': __metadata__ value of '{}' must be a string, not {}", origin,
                                            std::string_view(m.key()), boost::json::serialize(m.value())));
        }
        h.metadata.emplace(std::string(m.key()), std::string(m.value().get_string()));
      }
      continue;
    }
    if (!v.is_object()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' must be described by an object, not {}", origin, name,
                                        boost::json::serialize(v)));
    }
    const auto& obj = v.get_object();
    Entry e;
    e.name = name;
    const boost::json::value* dtype = obj.if_contains("dtype");
    const boost::json::value* shape = obj.if_contains("shape");
    const boost::json::value* offsets = obj.if_contains("data_offsets");
    if (!dtype || !shape || !offsets) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' lacks {}", origin, name,
                                        !dtype ? "\"dtype\"" : !shape ? "\"shape\"" : "\"data_offsets\""));
    }
    for (const auto& field : obj) {
      if (field.key() != "dtype" && field.key() != "shape" && field.key() != "data_offsets") {
        throw CheckpointError(fmt::format("'{}': tensor '{}' has an unknown field \"{}\"", origin, name,
                                          std::string_view(field.key())));
      }
    }
    if (!dtype->is_string()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': dtype must be a string, not {}", origin, name,
                                        boost::json::serialize(*dtype)));
    }
    auto d = safetensors::parse_dtype(dtype->get_string());
    if (!d) {
      std::string known;
      for (std::uint8_t code = 0; code < kNumDTypes; ++code) {
        const std::string_view n = safetensors::dtype_name(static_cast<DType>(code));
        if (!n.empty()) known += fmt::format("{}{}", known.empty() ? "" : ", ", n);
      }
      throw CheckpointError(fmt::format("'{}': tensor '{}' has dtype \"{}\", which distribute does not know (known: "
                                        "{})",
                                        origin, name, std::string_view(dtype->get_string()), known));
    }
    e.dtype = *d;
    if (!shape->is_array()) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': shape must be an array, not {}", origin, name,
                                        boost::json::serialize(*shape)));
    }
    for (const auto& dim : shape->get_array()) {
      const std::uint64_t u = json_unsigned(dim, origin, name, "shape");
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        throw CheckpointError(fmt::format("'{}': tensor '{}': dimension {} is too large", origin, name, u));
      }
      e.shape.push_back(static_cast<std::int64_t>(u));
    }
    if (!offsets->is_array() || offsets->get_array().size() != 2) {
      throw CheckpointError(fmt::format("'{}': tensor '{}': data_offsets must be [begin, end], not {}", origin, name,
                                        boost::json::serialize(*offsets)));
    }
    e.begin = json_unsigned(offsets->get_array()[0], origin, name, "data_offsets");
    e.end = json_unsigned(offsets->get_array()[1], origin, name, "data_offsets");
    if (e.begin > e.end) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}]: begin is after end", origin,
                                        name, e.begin, e.end));
    }
    const std::uint64_t expected = checked_size(origin, e);
    if (e.end - e.begin != expected) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' of dtype {} and shape {} needs {} bytes, but its "
                                        "data_offsets [{}, {}] span {}",
                                        origin, name, safetensors::dtype_name(e.dtype), shape_string(e.shape), expected, e.begin,
                                        e.end, e.end - e.begin));
    }
    if (e.end > payload_size) {
      throw CheckpointError(fmt::format("'{}': tensor '{}' has data_offsets [{}, {}] but the payload holds only {} "
                                        "bytes: the file is truncated or the offsets are corrupted",
                                        origin, name, e.begin, e.end, payload_size));
    }
    h.entries.push_back(std::move(e));
  }

  // The tensors must tile the payload exactly: no overlap (two tensors aliasing bytes), no gap
  // (bytes nobody owns), nothing after the last one.
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin != cursor) {
      if (previous) {
        throw CheckpointError(fmt::format("'{}': tensor '{}' (data_offsets [{}, {}]) {} tensor '{}' (data_offsets "
                                          "[{}, {}]); tensors must be contiguous and must not overlap",
                                          origin, e.name, e.begin, e.end,
                                          e.begin < cursor ? "overlaps" : "leaves a gap after", previous->name,
                                          previous->begin, previous->end));
      }
      throw CheckpointError(fmt::format("'{}': the first tensor '{}' starts at payload byte {}, not 0", origin, e.name,
                                        e.begin));
    }
    cursor = e.end;
    previous = &e;
  }
  if (cursor != payload_size) {
    throw CheckpointError(fmt::format("'{}': the tensors cover {} bytes but the payload has {}: the file has "
                                      "trailing bytes or its header length is corrupted",
                                      origin, cursor, payload_size));
  }

  // distribute's checksums: all or nothing, so that corrupting one key cannot switch them off.
  bool any = false;
  for (const auto& [key, value] : h.metadata) any = any || is_reserved_key(key);
  h.has_checksums = any;
  if (any) {
    auto need = [&](std::string_view key) -> const std::string& {
      auto it = h.metadata.find(key);
      if (it == h.metadata.end()) {
        throw CheckpointError(fmt::format("'{}': __metadata__ has distribute checksums but lacks \"{}\": the header "
                                          "is corrupted",
                                          origin, key));
      }
      return it->second;
    };
    if (need(kFormatKey) != kFormatVersion) {
      throw CheckpointError(fmt::format("'{}': distribute.format is \"{}\"; this version reads format {}", origin,
                                        need(kFormatKey), kFormatVersion));
    }
    std::vector<const Entry*> all;
    for (const Entry& e : h.entries) {
      all.push_back(&e);
      need(fmt::format("{}{}", kTensorCrcPrefix, e.name));
    }
    for (const auto& [key, value] : h.metadata) {
      if (key.rfind(kTensorCrcPrefix, 0) == 0) {
        const std::string tensor = key.substr(kTensorCrcPrefix.size());
        if (std::none_of(h.entries.begin(), h.entries.end(), [&](const Entry& e) { return e.name == tensor; })) {
          throw CheckpointError(fmt::format("'{}': __metadata__ has a checksum for tensor '{}', which the header "
                                            "does not list: the header is corrupted",
                                            origin, tensor));
        }
      }
    }
    const std::string stored = need(kHeaderCrcKey);
    const std::string computed = crc_hex(header_digest(std::move(all), h.metadata));
    if (stored != computed) {
      throw CheckpointError(fmt::format("'{}': header checksum mismatch (stored {}, computed {}): the header is "
                                        "corrupted",
                                        origin, stored, computed));
    }
  }
  return h;
}

// After the bytes are in: BOOL must be 0/1 (anything else is not a bool in C++), and the CRC.
inline void check_tensor_bytes(const Header& h, const safetensors::StoredTensor& t, const std::string& origin,
                               const safetensors::ReadOptions& options) {
  if (t.dtype == DType::Bool) {
    for (std::size_t i = 0; i < t.bytes.size(); ++i) {
      if (static_cast<unsigned>(t.bytes[i]) > 1) {
        throw CheckpointError(fmt::format("'{}': BOOL tensor '{}' holds byte {} at element {}; only 0 and 1 are "
                                          "booleans",
                                          origin, t.name, static_cast<unsigned>(t.bytes[i]), i));
      }
    }
  }
  if (!h.has_checksums || !options.verify_checksums) return;
  const std::string& stored = h.metadata.find(fmt::format("{}{}", kTensorCrcPrefix, t.name))->second;
  const std::string computed = crc_hex(crc32(t.bytes));
  if (stored != computed) {
    throw CheckpointError(fmt::format("'{}': tensor '{}' is corrupted: the CRC-32 of its {} bytes is {}, the file "
                                      "recorded {}",
                                      origin, t.name, t.bytes.size(), computed, stored));
  }
}

inline std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;  // little-endian host (static_assert above)
}

inline void check_prefix(std::uint64_t file_size, const std::string& origin) {
  if (file_size < 8) {
    throw CheckpointError(fmt::format("'{}' is {} bytes long, too short for the 8-byte header length of a "
                                      "safetensors file: truncated, or not a safetensors file",
                                      origin, file_size));
  }
}
inline void check_header_length(std::uint64_t n, std::uint64_t file_size, const std::string& origin) {
  if (n > file_size - 8) {
    throw CheckpointError(fmt::format("'{}': the header length {} runs past the end of the file ({} bytes follow "
                                      "the length): truncated or corrupted",
                                      origin, n, file_size - 8));
  }
  if (n > kMaxHeaderBytes) {
    throw CheckpointError(fmt::format("'{}': the header length {} exceeds the limit of {} bytes: corrupted", origin, n,
                                      kMaxHeaderBytes));
  }
}

// The header JSON (padded) and the payload order, shared by serialize() and write().
struct Layout {
  std::string header;  // includes the 8-byte length prefix and the padding
  std::vector<std::pair<const std::string*, const safetensors::TensorView*>> order;
  std::uint64_t payload_size = 0;
};

inline Layout plan(const safetensors::TensorMap& tensors, const safetensors::Metadata& user_metadata) {
  Layout layout;
  for (const auto& [key, value] : user_metadata) {
    if (is_reserved_key(key)) {
      throw InvalidArgument(fmt::format("safetensors: metadata key '{}' is reserved; distribute computes it", key));
    }
  }
  for (const auto& [name, view] : tensors) {
    if (name.empty() || name == kMetadataKey) {
      throw InvalidArgument(fmt::format("safetensors: '{}' cannot be a tensor name", name));
    }
    if (safetensors::dtype_name(view.dtype).empty()) {
      throw InvalidArgument(fmt::format("safetensors: tensor '{}' has dtype code {}, which safetensors files cannot "
                                        "hold",
                                        name, static_cast<unsigned>(view.dtype)));
    }
    for (auto d : view.shape) {
      if (d < 0) {
        throw InvalidArgument(fmt::format("safetensors: tensor '{}' has a negative dimension in shape {}", name,
                                          shape_string(view.shape)));
      }
    }
    const std::uint64_t want = static_cast<std::uint64_t>(num_elements(view.shape)) * size_of(view.dtype);
    if (view.bytes.size() != want) {
      throw InvalidArgument(fmt::format("safetensors: tensor '{}' of dtype {} and shape {} needs {} bytes, but {} "
                                        "were given",
                                        name, safetensors::dtype_name(view.dtype), shape_string(view.shape), want,
                                        view.bytes.size()));
    }
    layout.order.emplace_back(&name, &view);
  }
  // Widest elements first: with an 8-aligned payload every tensor then starts at a multiple of
  // its element size, so a reader may map the file and use the data in place (as Python's does).
  std::stable_sort(layout.order.begin(), layout.order.end(),
                   [](const auto& a, const auto& b) { return size_of(a.second->dtype) > size_of(b.second->dtype); });

  std::vector<Entry> entries;
  entries.reserve(layout.order.size());
  safetensors::Metadata metadata = user_metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, view] : layout.order) {
    entries.push_back(Entry{*name, view->dtype, view->shape, offset, offset + view->bytes.size()});
    offset += view->bytes.size();
    metadata.emplace(fmt::format("{}{}", kTensorCrcPrefix, *name), crc_hex(crc32(view->bytes)));
  }
  layout.payload_size = offset;
  metadata.emplace(std::string(kFormatKey), std::string(kFormatVersion));
  std::vector<const Entry*> pointers;
  for (const auto& e : entries) pointers.push_back(&e);
  metadata.emplace(std::string(kHeaderCrcKey), crc_hex(header_digest(std::move(pointers), metadata)));

  boost::json::object root;
  boost::json::object meta;
  for (const auto& [key, value] : metadata) meta[key] = value;
  root[kMetadataKey] = std::move(meta);
  for (const Entry& e : entries) {
    boost::json::array shape;
    for (auto d : e.shape) shape.push_back(d);
    root[e.name] = boost::json::object{
        {"dtype", safetensors::dtype_name(e.dtype)},
        {"shape", std::move(shape)},
        {"data_offsets", boost::json::array{e.begin, e.end}}};
  }
  std::string json = boost::json::serialize(root);
  json.append((8 - json.size() % 8) % 8, ' ');
  const std::uint64_t n = json.size();
  layout.header.resize(8);
  std::memcpy(layout.header.data(), &n, 8);
  layout.header += json;
  return layout;
}

}  // namespace checkpoint::detail

DISTRIBUTE_END_NAMESPACE
