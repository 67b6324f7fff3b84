// libFuzzer target: safetensors parsing (checkpoint/safetensors.hpp: the 8-byte length, the JSON
// header, offsets, dtypes, shapes, distribute's CRC-32s). The first byte chooses whether checksums
// are verified; the rest is the file.
// Oracles: only typed errors; every tensor holds exactly shape x dtype bytes; a file that parses
// writes back (serialize) to one that parses to the same tensors.
#include <distribute/checkpoint/safetensors.hpp>

#include "fuzz_common.hpp"

namespace ds = distribute;
namespace st = distribute::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  st::ReadOptions options;
  options.verify_checksums = (data[0] & 1) != 0;
  const auto in = fuzz::bytes(data + 1, size - 1);
  fuzz::expect_typed_errors([&] {
    const st::File file = st::parse(in, "fuzzed", options);
    st::TensorMap tensors;
    for (const auto& t : file.tensors) {
      fuzz::require(t.num_elements() >= 0, "a tensor has a non-negative element count");
      fuzz::require(t.bytes.size() == static_cast<std::size_t>(t.num_elements()) * ds::size_of(t.dtype),
                    "a tensor holds shape x dtype bytes");
      tensors.emplace(t.name, t.view());
    }
    std::vector<std::byte> again;
    try {
      again = st::serialize(tensors);
    } catch (const ds::Error&) {
      return;  // a name or shape this library does not write
    }
    const st::File back = st::parse(again, "rewritten");
    fuzz::require(back.tensors.size() == tensors.size(), "the rewritten file has every tensor");
    for (const auto& t : back.tensors) {
      const st::StoredTensor& original = file.at(t.name);
      fuzz::require(t.dtype == original.dtype && t.shape == original.shape && t.bytes == original.bytes,
                    "the rewritten file holds the same tensors");
    }
  });
  return 0;
}
