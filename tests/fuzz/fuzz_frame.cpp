// libFuzzer target: the wire format of net/ (frame headers, the incremental frame decoder on a
// stream cut anywhere, and the handshake, abort and descriptor payloads). The first byte picks the
// decoder, the second how the stream is cut; the rest is the input.
// Oracles: only typed errors; the decoder's frames carry exactly the payload their header claims;
// a payload that decodes re-encodes to the same bytes.
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/frame.hpp>

#include <algorithm>
#include <vector>

#include "fuzz_common.hpp"

namespace ds = distribute;
namespace net = distribute::net;
namespace nd = distribute::net::detail;

namespace {

template <class T>
void same_bytes(const std::vector<std::byte>& encoded, std::span<const std::byte> in, const char* what) {
  fuzz::require(encoded.size() == in.size() && std::equal(encoded.begin(), encoded.end(), in.begin()), what);
}

void stream(std::span<const std::byte> in, std::uint64_t max_payload, std::size_t cut) {
  net::FrameDecoder decoder(max_payload);
  std::uint64_t payload_bytes = 0;
  fuzz::expect_typed_errors([&] {
    while (!in.empty()) {
      const std::size_t n = std::min(cut, in.size());
      for (const auto& f : decoder.feed(in.first(n))) {
        fuzz::require(f.payload.size() == f.header.length, "a frame's payload is the length its header claims");
        fuzz::require(f.header.length <= std::max<std::uint64_t>(max_payload, net::kMaxControlPayload), "payload within the limit");
        payload_bytes += f.payload.size();
      }
      in = in.subspan(n);
    }
  });
  (void)payload_bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint8_t which = data[0];
  const std::size_t cut = std::size_t{data[1]} % 61 + 1;  // 1..61 bytes per read
  const auto in = fuzz::bytes(data + 2, size - 2);
  switch (which % 8) {
    case 0: stream(in, std::uint64_t{1} << 20, cut); break;
    case 1: stream(in, net::kMaxPreAuthPayload, cut); break;  // a connection not yet authenticated
    case 2:
      fuzz::expect_typed_errors([&] {
        const auto h = net::decode_header(in, std::uint64_t{1} << 20);
        const auto again = net::encode_header(h);
        fuzz::require(std::equal(again.begin(), again.end(), in.begin()), "a header re-encodes to its bytes");
      });
      break;
    case 3: fuzz::expect_typed_errors([&] { same_bytes<nd::Hello>(nd::encode(nd::decode_hello(in)), in, "hello round trip"); }); break;
    case 4:
      fuzz::expect_typed_errors([&] { same_bytes<nd::Challenge>(nd::encode(nd::decode_challenge(in)), in, "challenge round trip"); });
      break;
    case 5: fuzz::expect_typed_errors([&] { fuzz::require(nd::decode_response(in).size() == in.size(), "response is one MAC"); }); break;
    case 6:
      fuzz::expect_typed_errors([&] {
        const auto f = nd::decode_abort(in);
        if (in.size() < net::kMaxControlPayload) same_bytes<nd::Failure>(nd::encode(f), in, "abort round trip");
      });
      break;
    case 7:
      fuzz::expect_typed_errors([&] {
        const auto d = nd::decode_descriptor(in);
        same_bytes<nd::Descriptor>(nd::encode(d), in, "descriptor round trip");
        (void)nd::describe(d);
      });
      break;
  }
  return 0;
}
