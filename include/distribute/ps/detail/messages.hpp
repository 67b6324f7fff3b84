// The parameter-server service's messages, serialised with cereal's binary archives (every process
// of a cluster runs the same binary, so layout and endianness agree). Tensor values travel as raw
// bytes in one block: a std::string where the message owns them, WireBytes where a server reads
// them in place in the request (the ...View messages: no copy, no allocation per request).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <istream>
#include <ostream>
#include <streambuf>
#include <string>
#include <vector>

#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/ps/detail/wire_reader.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

struct PingReply {
  std::string job;
  int task = 0;
  std::uint64_t incarnation = 0;  // differs after a restart
  template <class A>
  void serialize(A& a) { a(job, task, incarnation); }
};

struct CreateVarMsg {
  std::string key;
  std::uint8_t dtype = 0;
  std::vector<std::int64_t> shape;
  std::string bytes;
  template <class A>
  void serialize(A& a) { a(key, dtype, shape, bytes); }
};

/// A variable the ps task fills itself (Initializer): only the shape and the recipe travel.
struct CreateInitializedMsg {
  std::string key;
  std::uint8_t dtype = 0;
  std::vector<std::int64_t> shape;
  std::uint8_t init_kind = 0;  // Initializer::Kind
  double a = 0, b = 0;
  std::uint64_t seed = 0, offset = 0;
  template <class A>
  void serialize(A& a_) { a_(key, dtype, shape, init_kind, a, b, seed, offset); }
};

struct ReadVarMsg {
  std::string key;
  std::uint8_t dtype = 0;
  std::uint64_t nbytes = 0;
  template <class A>
  void serialize(A& a) { a(key, dtype, nbytes); }
};

struct ReadRowsMsg {
  std::string key;
  std::uint8_t dtype = 0;
  std::vector<std::int64_t> rows;
  std::uint64_t row_bytes = 0;
  template <class A>
  void serialize(A& a) { a(key, dtype, rows, row_bytes); }
};

/// An update of a variable (core::RemoteUpdate): its whole value (assign/add/sub, an optimizer
/// step on a dense gradient: `all_rows`), or some rows (scatter_*, an optimizer step on a sparse
/// gradient: `rows`, int64s, one row of `bytes` each).
template <class Bytes>
struct BasicUpdateVarMsg {
  std::string key;
  std::uint8_t kind = 0;  // RemoteUpdate
  std::uint8_t dtype = 0;
  Bytes bytes;
  Bytes rows = {};
  std::array<double, 3> params{};  // an optimizer's hyperparameters
  std::uint8_t all_rows = 0;
  template <class A>
  void serialize(A& a) { a(key, kind, dtype, bytes, rows, params, all_rows); }
};
using UpdateVarMsg = BasicUpdateVarMsg<std::string>;
using UpdateVarView = BasicUpdateVarMsg<WireBytes>;

/// A closure's updates to one ps task, applied together and at most once per (session, closure).
template <class Update>
struct BasicCommitMsg {
  std::uint64_t session = 0;
  std::uint64_t closure = 0;
  std::vector<Update> updates;
  template <class A>
  void serialize(A& a) { a(session, closure, updates); }
};
using CommitMsg = BasicCommitMsg<UpdateVarMsg>;
using CommitView = BasicCommitMsg<UpdateVarView>;

template <class Bytes>
struct BasicRunClosureMsg {
  std::uint64_t session = 0;
  std::uint64_t closure = 0;
  std::uint32_t attempt = 0;
  std::string function;
  std::string signature;
  Bytes args;
  template <class A>
  void serialize(A& a) { a(session, closure, attempt, function, signature, args); }
};
using RunClosureMsg = BasicRunClosureMsg<std::string>;
using RunClosureView = BasicRunClosureMsg<WireBytes>;

inline std::span<const std::byte> bytes_of(const std::string& s) noexcept { return std::as_bytes(std::span(s.data(), s.size())); }
inline std::span<const std::byte> bytes_of(const WireBytes& b) noexcept { return b.bytes; }

struct MakeDatasetMsg {
  std::uint64_t dataset = 0;
  std::string function;
  std::string signature;
  int num_workers = 1;
  int worker_index = 0;
  template <class A>
  void serialize(A& a) { a(dataset, function, signature, num_workers, worker_index); }
};

/// cereal's archives write a stream: this one writes straight into the byte vector that goes on
/// the wire.
class ByteSink : public std::streambuf {
 public:
  std::vector<std::byte> bytes;

 protected:
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof())) bytes.push_back(static_cast<std::byte>(c));
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    const auto* p = reinterpret_cast<const std::byte*>(s);
    bytes.insert(bytes.end(), p, p + n);
    return n;
  }
};

template <class M>
std::vector<std::byte> encode_message(const M& m) {
  ByteSink sink;
  {
    std::ostream out(&sink);
    cereal::BinaryOutputArchive ar(out);
    ar(m);
  }
  return std::move(sink.bytes);
}

/// Encodes `m` into buffer `slot` of this thread's, kept from one message to the next, so that
/// sending one costs no allocation once a message of its size was sent: the bytes are valid until
/// this thread encodes into that slot again. Calls to several ps tasks in flight at once each take
/// a slot of their own; a call that sends its bytes and returns before the next uses slot 0.
template <class M>
std::span<const std::byte> encode_into_slot(const M& m, std::size_t slot) {
  static constexpr std::size_t kKeptBytes = std::size_t{64} << 20;  // a larger buffer is not kept
  thread_local std::vector<std::unique_ptr<ByteSink>> sinks;
  while (sinks.size() <= slot) sinks.push_back(std::make_unique<ByteSink>());
  ByteSink& sink = *sinks[slot];
  sink.bytes.clear();
  if (sink.bytes.capacity() > kKeptBytes) sink.bytes.shrink_to_fit();
  {
    std::ostream out(&sink);
    cereal::BinaryOutputArchive ar(out);
    ar(m);
  }
  return sink.bytes;
}

template <class M>
std::span<const std::byte> encode_reusing(const M& m) {
  return encode_into_slot(m, 0);
}

/// Malformed bytes throw InvalidArgument naming `what`, never read past the end and never
/// allocate more than the bytes there are (WireReader checks every length against them). A pure
/// function of the bytes, so it can be fuzzed.
template <class M>
M decode_message(std::span<const std::byte> bytes, const char* what) {
  SpanReadBuffer buffer(bytes);
  std::istream in(&buffer);
  M m;
  try {
    WireReader ar(in);
    ar(m);
  } catch (const std::exception& e) {  // cereal::Exception naming the bogus size
    throw InvalidArgument(fmt::format("malformed {} message ({} bytes): {}", what, bytes.size(), e.what()));
  }
  return m;
}

}  // namespace ps::detail
DISTRIBUTE_END_NAMESPACE
