// All-reduces 16-bit floats across the replicas of a MirroredStrategy<host> for
// tests/check_half_numpy.py, which compares the results with numpy's.
//   tensors_helper sum|mean f16|bf16 IN OUT
// IN: u32 replicas, u32 n, then replicas x n little-endian 16-bit values (replica by replica);
// OUT: the n values every replica got (checked equal across replicas). Exit 0, or 1 with a message.
#include <distribute/distribute.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace ds = distribute;

namespace {

template <class H>
std::vector<std::uint16_t> all_reduce(ds::ReduceOp op, int replicas, const std::vector<std::uint16_t>& in, std::size_t n) {
  ds::MirroredStrategy<ds::host> strategy(replicas);
  auto out = strategy.run([&](ds::ReplicaContext& ctx) {
    const auto r = static_cast<std::size_t>(ctx.replica_id_in_sync_group());
    std::vector<H> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = ds::from_bits<H>(in[r * n + i]);
    return ctx.all_reduce(op, std::move(mine));
  });
  std::vector<std::uint16_t> bits(n);
  for (std::size_t i = 0; i < n; ++i) bits[i] = ds::to_bits(out[0][i]);
  for (const auto& v : out.values()) {
    for (std::size_t i = 0; i < n; ++i) {
      if (ds::to_bits(v[i]) != bits[i]) throw std::runtime_error("replicas disagree on the result");
    }
  }
  return bits;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 5) throw std::runtime_error("usage: tensors_helper sum|mean f16|bf16 IN OUT");
    const std::string op = argv[1], dtype = argv[2];
    std::ifstream f(argv[3], std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::uint32_t header[2];
    if (bytes.size() < sizeof header) throw std::runtime_error("input too short");
    std::memcpy(header, bytes.data(), sizeof header);
    const std::size_t replicas = header[0], n = header[1];
    if (replicas < 1 || replicas > 64 || bytes.size() != sizeof header + replicas * n * 2) {
      throw std::runtime_error("input size does not match its header");
    }
    std::vector<std::uint16_t> in(replicas * n);
    std::memcpy(in.data(), bytes.data() + sizeof header, in.size() * 2);
    const ds::ReduceOp reduce = op == "mean" ? ds::ReduceOp::Mean : ds::ReduceOp::Sum;
    const auto out = dtype == "f16" ? all_reduce<ds::float16>(reduce, static_cast<int>(replicas), in, n)
                                    : all_reduce<ds::bfloat16>(reduce, static_cast<int>(replicas), in, n);
    std::ofstream o(argv[4], std::ios::binary);
    o.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * 2));
    return o ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensors_helper: %s\n", e.what());
    return 1;
  }
}
