// libFuzzer target: the parameter server's request payloads (every message type decode_message
// reads, and what the ps task's variable table does with them) and remote-function argument
// decoding (load_values for tensors, vectors, strings, scalars, optionals), row updates and optimizer
// steps included (their rows and values read in place). The first byte picks
// the decoder; the rest is the input.
// Oracles: only typed errors; a message or argument list that decodes re-encodes to a prefix of
// the input (cereal ignores trailing bytes); the table never reads or allocates past what the
// request's bytes justify (ASan, and the allocator's limit that scripts/fuzz.sh sets).
#include <distribute/ps/detail/messages.hpp>
#include <distribute/ps/remote_function.hpp>
#include <distribute/ps/server.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_common.hpp"

namespace ds = distribute;
namespace dd = distribute::ps::detail;

namespace {

bool is_prefix(std::span<const std::byte> out, std::span<const std::byte> in) {
  return out.size() <= in.size() && std::equal(out.begin(), out.end(), in.begin());
}

template <class M>
void message(std::span<const std::byte> in) {
  fuzz::expect_typed_errors([&] {
    const M m = dd::decode_message<M>(in, "fuzzed");
    fuzz::require(is_prefix(dd::encode_message(m), in), "a decoded message re-encodes to a prefix of its bytes");
  });
}

template <class... Ts>
void arguments(std::span<const std::byte> in) {
  fuzz::expect_typed_errors([&] {
    const auto values = dd::load_values<Ts...>(fuzz::text(in), "arguments");
    const std::string again = std::apply([](const auto&... v) { return dd::save_values(v...); }, values);
    fuzz::require(is_prefix({reinterpret_cast<const std::byte*>(again.data()), again.size()}, in),
                  "decoded arguments re-encode to a prefix of their bytes");
  });
}

// A ps task's table with two variables (v with an Adagrad accumulator beside it), then the request:
// what Server's handler does with it. A variable it fills itself may hold 1 MiB, so that a shape
// claimed in a few bytes stays under the fuzzer's allocation limit (ServerOptions::max_initialized_bytes).
void table(std::uint8_t op, std::span<const std::byte> in) {
  dd::VariableTable t("/job:ps/replica:0/task:0/device:CPU:0", std::uint64_t{1} << 20);
  std::vector<float> v(12, 1.0f);
  t.create({"v", static_cast<std::uint8_t>(ds::DType::F32), {4, 3}, std::string(reinterpret_cast<const char*>(v.data()), 48)});
  t.create({"v/accumulator", static_cast<std::uint8_t>(ds::DType::F32), {4, 3}, std::string(reinterpret_cast<const char*>(v.data()), 48)});
  t.create({"w", static_cast<std::uint8_t>(ds::DType::I64), {5}, std::string(40, '\0')});
  fuzz::expect_typed_errors([&] {
    switch (op % 6) {
      case 0: t.create(dd::decode_message<dd::CreateVarMsg>(in, "create")); break;
      case 1: (void)t.read(dd::decode_message<dd::ReadVarMsg>(in, "read")); break;
      case 2: (void)t.read_rows(dd::decode_message<dd::ReadRowsMsg>(in, "read-rows")); break;
      case 3: t.update(dd::decode_message<dd::UpdateVarView>(in, "update")); break;  // scatters and steps too
      case 4: (void)t.commit(dd::decode_message<dd::CommitView>(in, "commit")); break;
      case 5: t.create(dd::decode_message<dd::CreateInitializedMsg>(in, "create-initialized")); break;
    }
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const auto in = fuzz::bytes(data + 1, size - 1);
  switch (data[0] % 17) {
    case 0: message<dd::PingReply>(in); break;
    case 1: message<dd::CreateVarMsg>(in); break;
    case 2: message<dd::ReadVarMsg>(in); break;
    case 3: message<dd::ReadRowsMsg>(in); break;
    case 4: message<dd::UpdateVarView>(in); break;  // as a ps task reads them: values in place
    case 5: message<dd::CommitView>(in); break;
    case 6: message<dd::RunClosureView>(in); break;
    case 7: message<dd::MakeDatasetMsg>(in); break;
    case 8: table(data[1], in.subspan(1)); break;
    case 9: arguments<ds::Tensor<float>>(in); break;
    case 10: arguments<ds::Tensor<std::int64_t>, double>(in); break;
    case 11: arguments<std::vector<float>, std::string, int>(in); break;
    case 12: arguments<std::vector<std::vector<std::int32_t>>>(in); break;
    case 13: arguments<std::optional<std::string>, std::pair<int, float>, std::array<std::uint8_t, 3>>(in); break;
    case 14: arguments<ds::Tensor<double>, ds::Tensor<std::uint8_t>>(in); break;
    case 15: arguments<std::tuple<std::int64_t, std::vector<double>>, bool>(in); break;
    case 16: message<dd::CreateInitializedMsg>(in); break;
  }
  return 0;
}
