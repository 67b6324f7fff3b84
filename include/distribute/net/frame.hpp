// The wire unit of the TCP transport: a fixed 32-byte header, `pad` zero bytes, `length` payload
// bytes, then `tail` zero bytes.
//
//   offset  size  field
//        0     4  magic "DSNT"
//        4     1  protocol version (kProtocolVersion)
//        5     1  FrameType
//        6     1  pad: zero bytes between header and payload (Data, PointToPoint, Request and
//                 Reply frames only, below kMaxFramePad; zero for every other type)
//        7     1  tail: zero bytes after the payload (the frame types exchanged after the
//                 handshake, below kMaxFramePad; zero for the handshake's)
//        8     8  payload length
//       16     8  sequence number (collective number, point-to-point message number)
//       24     8  tag (chunk within a collective)
//
// Integers are little-endian whatever the host. Decoding is a pure function of the bytes, so it can
// be fuzzed: anything malformed throws FrameError and is never read past its end.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// Bytes that are not a well-formed frame (bad magic, version, type, reserved bits or length).
/// The transport answers it by closing the connection.
class FrameError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

inline constexpr std::uint32_t kFrameMagic = 0x544E5344;  // "DSNT" read as a little-endian u32
// Version 2 added the pad byte (version 1 had two reserved bytes there); version 3 the tail byte
// (reserved before); version 4 padding on Request and Reply frames, which travel on the transport's
// connections, and the service flag of the handshake.
inline constexpr std::uint8_t kProtocolVersion = 4;
inline constexpr std::size_t kFrameHeaderBytes = 32;
/// Frames other than Data and PointToPoint are small; a larger claim is malformed whatever the
/// configured limit, so a stranger cannot make a peer allocate much.
inline constexpr std::uint64_t kMaxControlPayload = 64 * 1024;
/// Before a peer has proved the cluster token, no frame may claim more than this (the handshake
/// frames of the collectives and of the ps service are far smaller): a stranger can make a task
/// hold a few KiB per connection at most.
inline constexpr std::uint64_t kMaxPreAuthPayload = 4 * 1024;
/// A sender pads a bulk payload so that its place in the byte stream has the same alignment mod 64
/// as its address, and ends every frame on a multiple of 64 in the stream: the kernel's copy into
/// the socket then meets a destination aligned like its source, which some CPUs copy many times
/// faster (docs/performance.md, multi-worker section). Both paddings are below this.
inline constexpr std::size_t kMaxFramePad = 64;

enum class FrameType : std::uint8_t {
  Hello = 1,         // connector → acceptor: who I am, my nonce
  Challenge = 2,     // acceptor → connector: who I am, my nonce, my proof of the token
  Response = 3,      // connector → acceptor: my proof of the token
  Welcome = 4,       // acceptor → connector: accepted
  Reject = 5,        // either way, during the handshake: refused, with a reason
  Heartbeat = 6,     // keeps an idle connection known to be alive
  Goodbye = 7,       // clean shutdown: the sender sends nothing more
  Abort = 8,         // the sender's communicator failed; payload says why
  Descriptor = 9,    // announces a collective (seq = collective number)
  Data = 10,         // a piece of a collective's data (seq, tag)
  PointToPoint = 11,  // one send() message (seq = message number to this peer)
  Request = 12,       // ps service: a call (seq = call number, tag = operation)
  Reply = 13          // ps service: its answer (seq = call number, tag = 0 ok, 1 error)
};

constexpr std::string_view to_string(FrameType t) noexcept {
  switch (t) {
    case FrameType::Hello: return "hello";
    case FrameType::Challenge: return "challenge";
    case FrameType::Response: return "response";
    case FrameType::Welcome: return "welcome";
    case FrameType::Reject: return "reject";
    case FrameType::Heartbeat: return "heartbeat";
    case FrameType::Goodbye: return "goodbye";
    case FrameType::Abort: return "abort";
    case FrameType::Descriptor: return "descriptor";
    case FrameType::Data: return "data";
    case FrameType::PointToPoint: return "point-to-point";
    case FrameType::Request: return "request";
    case FrameType::Reply: return "reply";
  }
  return "?";
}

struct FrameHeader {
  FrameType type = FrameType::Heartbeat;
  std::uint64_t length = 0;
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  std::uint8_t pad = 0;   // zero bytes between header and payload
  std::uint8_t tail = 0;  // zero bytes after the payload
  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

using HeaderBytes = std::array<std::byte, kFrameHeaderBytes>;

namespace detail {

inline void store_le(std::byte* out, std::uint64_t v, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

inline std::uint64_t load_le(const std::byte* in, std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

constexpr bool known_frame_type(std::uint8_t t) noexcept {
  return t >= static_cast<std::uint8_t>(FrameType::Hello) && t <= static_cast<std::uint8_t>(FrameType::Reply);
}

/// The frames exchanged once connected: the only ones that may carry a tail.
constexpr bool steady_state_frame(FrameType t) noexcept { return t >= FrameType::Heartbeat && t <= FrameType::Reply; }

/// The frames whose payload may be padded in front (bulk data: see kMaxFramePad).
constexpr bool bulk_frame(FrameType t) noexcept {
  return t == FrameType::Data || t == FrameType::PointToPoint || t == FrameType::Request || t == FrameType::Reply;
}

}  // namespace detail

inline HeaderBytes encode_header(const FrameHeader& h) noexcept {
  HeaderBytes out{};
  detail::store_le(out.data(), kFrameMagic, 4);
  out[4] = static_cast<std::byte>(kProtocolVersion);
  out[5] = static_cast<std::byte>(h.type);
  out[6] = static_cast<std::byte>(h.pad);
  out[7] = static_cast<std::byte>(h.tail);
  detail::store_le(out.data() + 8, h.length, 8);
  detail::store_le(out.data() + 16, h.seq, 8);
  detail::store_le(out.data() + 24, h.tag, 8);
  return out;
}

/// Decodes and validates a header; `max_payload_bytes` bounds Data/PointToPoint payloads
/// (other types are bounded by kMaxControlPayload, or to zero when they carry nothing).
inline FrameHeader decode_header(std::span<const std::byte> bytes, std::uint64_t max_payload_bytes) {
  if (bytes.size() < kFrameHeaderBytes) {
    throw FrameError(fmt::format("truncated frame header: {} of {} bytes", bytes.size(), kFrameHeaderBytes));
  }
  const auto magic = static_cast<std::uint32_t>(detail::load_le(bytes.data(), 4));
  if (magic != kFrameMagic) {
    throw FrameError(fmt::format("bad frame magic 0x{:08x} (expected 0x{:08x}): not a distribute peer", magic, kFrameMagic));
  }
  const auto version = static_cast<std::uint8_t>(bytes[4]);
  if (version != kProtocolVersion) {
    throw FrameError(fmt::format("unsupported protocol version {} (this build speaks version {})", version, kProtocolVersion));
  }
  const auto type = static_cast<std::uint8_t>(bytes[5]);
  if (!detail::known_frame_type(type)) throw FrameError(fmt::format("unknown frame type {}", type));

  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.pad = static_cast<std::uint8_t>(bytes[6]);
  h.tail = static_cast<std::uint8_t>(bytes[7]);
  auto check_padding = [&](std::uint8_t n, bool allowed, std::string_view where) {
    if (n >= kMaxFramePad || (n != 0 && !allowed)) {
      throw FrameError(fmt::format("{} frame with {} bytes of padding {} its payload (allowed: {})", to_string(h.type), n,
                                   where, allowed ? fmt::format("fewer than {}", kMaxFramePad) : std::string("none")));
    }
  };
  check_padding(h.pad, detail::bulk_frame(h.type), "before");
  check_padding(h.tail, detail::steady_state_frame(h.type), "after");
  h.length = detail::load_le(bytes.data() + 8, 8);
  h.seq = detail::load_le(bytes.data() + 16, 8);
  h.tag = detail::load_le(bytes.data() + 24, 8);
  std::uint64_t limit = kMaxControlPayload;
  switch (h.type) {
    case FrameType::Data:
    case FrameType::PointToPoint:
    case FrameType::Request:
    case FrameType::Reply: limit = max_payload_bytes; break;
    case FrameType::Welcome:
    case FrameType::Heartbeat:
    case FrameType::Goodbye: limit = 0; break;
    default: limit = std::min(limit, max_payload_bytes); break;
  }
  if (h.length > limit) {
    throw FrameError(fmt::format("{} frame payload of {} bytes exceeds the limit of {} bytes", to_string(h.type),
                                 h.length, limit));
  }
  return h;
}

/// Header, padding and payload as one contiguous buffer (tests, handshakes; bulk data is never
/// copied so).
inline std::vector<std::byte> encode_frame(FrameHeader h, std::span<const std::byte> payload) {
  h.length = payload.size();
  const HeaderBytes head = encode_header(h);
  std::vector<std::byte> out(head.begin(), head.end());
  out.resize(out.size() + h.pad);  // zeros
  out.insert(out.end(), payload.begin(), payload.end());
  out.resize(out.size() + h.tail);
  return out;
}

struct Frame {
  FrameHeader header;
  std::vector<std::byte> payload;
};

/// Incremental decoder over a byte stream cut anywhere. Malformed input throws FrameError, after
/// which the decoder stays failed (a stream cannot be resynchronised once framing is lost).
class FrameDecoder {
 public:
  explicit FrameDecoder(std::uint64_t max_payload_bytes) : max_payload_(max_payload_bytes) {}

  /// Consumes `bytes`; returns the frames they complete, in order.
  std::vector<Frame> feed(std::span<const std::byte> bytes) {
    if (failed_) throw FrameError("frame decoder already failed on malformed input");
    std::vector<Frame> out;
    try {
      while (!bytes.empty()) {
        if (!have_header_) {
          const std::size_t take = std::min(kFrameHeaderBytes - header_fill_, bytes.size());
          std::copy_n(bytes.begin(), take, header_.begin() + static_cast<std::ptrdiff_t>(header_fill_));
          header_fill_ += take;
          bytes = bytes.subspan(take);
          if (header_fill_ < kFrameHeaderBytes) break;
          current_.header = decode_header(header_, max_payload_);
          current_.payload.clear();
          have_header_ = true;
          pad_left_ = current_.header.pad;
          tail_left_ = current_.header.tail;
        }
        const std::size_t skip = std::min(pad_left_, bytes.size());
        pad_left_ -= skip;
        bytes = bytes.subspan(skip);
        if (pad_left_ > 0) break;
        // Grow with the bytes that actually arrive, not with the length the header claims.
        const std::uint64_t missing = current_.header.length - current_.payload.size();
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(missing, bytes.size()));
        current_.payload.insert(current_.payload.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(take));
        bytes = bytes.subspan(take);
        if (current_.payload.size() < current_.header.length) break;
        const std::size_t skip_tail = std::min(tail_left_, bytes.size());
        tail_left_ -= skip_tail;
        bytes = bytes.subspan(skip_tail);
        if (tail_left_ == 0) {
          out.push_back(std::move(current_));
          current_ = Frame{};
          have_header_ = false;
          header_fill_ = 0;
        }
      }
    } catch (...) {
      failed_ = true;
      throw;
    }
    return out;
  }

  /// Bytes of an unfinished frame held so far.
  std::size_t buffered() const noexcept {
    return have_header_ ? kFrameHeaderBytes + (current_.header.pad - pad_left_) + current_.payload.size() +
                              (current_.header.tail - tail_left_)
                        : header_fill_;
  }
  bool failed() const noexcept { return failed_; }

 private:
  std::uint64_t max_payload_;
  HeaderBytes header_{};
  std::size_t header_fill_ = 0;
  bool have_header_ = false;
  std::size_t pad_left_ = 0;   // padding of the current frame still to skip
  std::size_t tail_left_ = 0;  // its tail, likewise
  bool failed_ = false;
  Frame current_;
};

}  // namespace net
DISTRIBUTE_END_NAMESPACE
