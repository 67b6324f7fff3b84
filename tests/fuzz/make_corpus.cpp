// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/<target>/) from the library's own
// encoders, so that each seed is an input the library produces and accepts. Run by hand after a
// wire format changes (scripts/fuzz.sh --seeds), and the files committed:
//   g++ -std=c++20 -Iinclude tests/fuzz/make_corpus.cpp -o /tmp/make_corpus -lfmt -lcrypto -lboost_json
//   /tmp/make_corpus tests/fuzz/corpus
#include <distribute/checkpoint/safetensors.hpp>
#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/data/record_file.hpp>
#include <distribute/core/tensor.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/frame.hpp>
#include <distribute/ps/detail/messages.hpp>
#include <distribute/ps/remote_function.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../../tools/launch_node_protocol.hpp"

namespace ds = distribute;
namespace net = distribute::net;
namespace nd = distribute::net::detail;
namespace dd = distribute::ps::detail;
namespace st = distribute::safetensors;
namespace fs = std::filesystem;

namespace {

fs::path root;
int written = 0;

// One seed: the target's selector bytes, then the encoded input.
void seed(const std::string& target, const std::string& name, std::vector<std::uint8_t> selector, std::span<const std::byte> body) {
  const fs::path dir = root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(selector.data()), static_cast<std::streamsize>(selector.size()));
  out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
  ++written;
}
void seed(const std::string& target, const std::string& name, std::vector<std::uint8_t> selector, std::string_view body) {
  seed(target, name, std::move(selector), std::as_bytes(std::span<const char>(body.data(), body.size())));
}

std::span<const std::byte> as_span(const std::string& s) { return std::as_bytes(std::span<const char>(s.data(), s.size())); }

void append(std::vector<std::byte>& out, const std::vector<std::byte>& more) { out.insert(out.end(), more.begin(), more.end()); }

void frames() {
  nd::Nonce n1{}, n2{};
  for (std::size_t i = 0; i < n1.size(); ++i) {
    n1[i] = static_cast<std::byte>(i);
    n2[i] = static_cast<std::byte>(0xA0 + i);
  }
  const nd::Hello hello{3, 1, 0, true, n1};
  const nd::Mac proof = nd::handshake_proof("token", true, n1, n2, 3, 0, 1);
  const nd::Challenge challenge{3, 0, 1, true, n2, proof};
  const nd::Descriptor descriptor{nd::CollectiveKind::AllReduce, ds::DType::F32, ds::ReduceOp::Sum, 0, 1000};
  const nd::Failure failure{nd::FailureKind::Timeout, "worker:1 timed out"};
  auto frame = [](net::FrameType type, const std::vector<std::byte>& payload, std::uint8_t pad = 0, std::uint8_t tail = 0,
                  std::uint64_t seq = 0, std::uint64_t tag = 0) {
    net::FrameHeader h;
    h.type = type;
    h.pad = pad;
    h.tail = tail;
    h.seq = seq;
    h.tag = tag;
    return net::encode_frame(h, payload);
  };
  // A connector's handshake as the acceptor reads it (pre-authentication limit), cut in 7s.
  std::vector<std::byte> handshake = frame(net::FrameType::Hello, nd::encode(hello));
  append(handshake, frame(net::FrameType::Response, std::vector<std::byte>(proof.begin(), proof.end())));
  seed("fuzz_frame", "stream-handshake", {1, 6}, handshake);
  // The acceptor's side, then a steady state: descriptor, padded data, heartbeat, point-to-point, abort.
  std::vector<std::byte> steady = frame(net::FrameType::Challenge, nd::encode(challenge));
  append(steady, frame(net::FrameType::Welcome, {}));
  append(steady, frame(net::FrameType::Descriptor, nd::encode(descriptor), 0, 0, 1));
  append(steady, frame(net::FrameType::Data, std::vector<std::byte>(100, std::byte{7}), 12, 4, 1, 2));
  append(steady, frame(net::FrameType::Heartbeat, {}, 0, 8));
  append(steady, frame(net::FrameType::PointToPoint, std::vector<std::byte>(33, std::byte{1}), 3, 0, 5));
  append(steady, frame(net::FrameType::Request, std::vector<std::byte>(20, std::byte{2}), 0, 0, 9, 3));
  append(steady, frame(net::FrameType::Reply, std::vector<std::byte>(10, std::byte{3}), 0, 0, 9, 0));
  append(steady, frame(net::FrameType::Abort, nd::encode(failure)));
  append(steady, frame(net::FrameType::Goodbye, {}));
  seed("fuzz_frame", "stream-steady", {0, 60}, steady);
  seed("fuzz_frame", "stream-steady-bytewise", {0, 0}, steady);
  net::FrameHeader h;
  h.type = net::FrameType::Data;
  h.length = 4096;
  h.seq = 7;
  h.tag = 1;
  h.pad = 16;
  const auto head = net::encode_header(h);
  seed("fuzz_frame", "header-data", {2, 0}, std::span<const std::byte>(head));
  seed("fuzz_frame", "hello", {3, 0}, nd::encode(hello));
  seed("fuzz_frame", "challenge", {4, 0}, nd::encode(challenge));
  seed("fuzz_frame", "response", {5, 0}, std::span<const std::byte>(proof));
  seed("fuzz_frame", "abort", {6, 0}, nd::encode(failure));
  seed("fuzz_frame", "descriptor", {7, 0}, nd::encode(descriptor));
}

void ps() {
  std::vector<float> v(12, 1.5f);
  const std::string v_bytes(reinterpret_cast<const char*>(v.data()), 48);
  const auto f32 = static_cast<std::uint8_t>(ds::DType::F32);
  const dd::PingReply ping{"ps", 0, 42};
  const dd::CreateVarMsg create{"u", f32, {2, 2}, std::string(16, '\1')};
  const dd::ReadVarMsg read{"v", f32, 48};
  const dd::ReadRowsMsg rows{"v", f32, {0, 3, 1}, 12};
  const dd::UpdateVarMsg update{"v", 0, f32, v_bytes};
  const dd::CommitMsg commit{1, 2, {update, dd::UpdateVarMsg{"v", 1, f32, v_bytes}}};
  const dd::RunClosureMsg run{1, 2, 0, "step", "FvfE", dd::save_values(2.0f)};
  const dd::MakeDatasetMsg dataset{7, "make_dataset", "FvvE", 3, 1};
  seed("fuzz_ps", "ping", {0}, dd::encode_message(ping));
  seed("fuzz_ps", "create", {1}, dd::encode_message(create));
  seed("fuzz_ps", "read", {2}, dd::encode_message(read));
  seed("fuzz_ps", "read-rows", {3}, dd::encode_message(rows));
  seed("fuzz_ps", "update", {4}, dd::encode_message(update));
  seed("fuzz_ps", "commit", {5}, dd::encode_message(commit));
  seed("fuzz_ps", "run-closure", {6}, dd::encode_message(run));
  seed("fuzz_ps", "make-dataset", {7}, dd::encode_message(dataset));
  // Requests the fuzz target's table (v: float32 4x3, w: int64 5) accepts.
  seed("fuzz_ps", "table-create", {8, 0}, dd::encode_message(create));
  seed("fuzz_ps", "table-read", {8, 1}, dd::encode_message(read));
  seed("fuzz_ps", "table-read-rows", {8, 2}, dd::encode_message(rows));
  seed("fuzz_ps", "table-update", {8, 3}, dd::encode_message(update));
  seed("fuzz_ps", "table-commit", {8, 4}, dd::encode_message(commit));
  // Row updates and optimizer steps on v's rows 3 and 1, and a variable the ps task fills itself.
  const std::vector<std::int64_t> two_rows{3, 1};
  const std::string rows_bytes(reinterpret_cast<const char*>(two_rows.data()), 16);
  const dd::UpdateVarMsg scatter{"v", static_cast<std::uint8_t>(ds::core::RemoteUpdate::ScatterAdd), f32, v_bytes.substr(0, 24), rows_bytes};
  const dd::UpdateVarMsg step{"v", static_cast<std::uint8_t>(ds::core::RemoteUpdate::ApplyAdagrad), f32, v_bytes.substr(0, 24),
                              rows_bytes, {0.1, 1e-7, 0}};
  const dd::UpdateVarMsg dense_step{"v", static_cast<std::uint8_t>(ds::core::RemoteUpdate::ApplySgd), f32, v_bytes, "", {0.5, 0, 0}, 1};
  const dd::CreateInitializedMsg filled{"t", f32, {100, 8}, static_cast<std::uint8_t>(ds::Initializer::Kind::RandomUniform), -0.05, 0.05, 3, 0};
  seed("fuzz_ps", "scatter", {4}, dd::encode_message(scatter));
  seed("fuzz_ps", "create-initialized", {16}, dd::encode_message(filled));
  seed("fuzz_ps", "table-scatter", {8, 3}, dd::encode_message(scatter));
  seed("fuzz_ps", "table-step", {8, 3}, dd::encode_message(step));
  seed("fuzz_ps", "table-dense-step", {8, 3}, dd::encode_message(dense_step));
  seed("fuzz_ps", "table-commit-step", {8, 4}, dd::encode_message(dd::CommitMsg{1, 3, {scatter, step}}));
  seed("fuzz_ps", "table-create-initialized", {8, 5}, dd::encode_message(filled));
  // Remote-function arguments, one seed per signature the target decodes.
  seed("fuzz_ps", "args-tensor-f32", {9}, as_span(dd::save_values(ds::Tensor<float>({2, 3}, {1, 2, 3, 4, 5, 6}))));
  seed("fuzz_ps", "args-tensor-i64-double", {10},
       as_span(dd::save_values(ds::Tensor<std::int64_t>({3}, {7, 8, 9}), 0.25)));
  seed("fuzz_ps", "args-vector-string-int", {11}, as_span(dd::save_values(std::vector<float>{1, 2}, std::string("name"), 5)));
  seed("fuzz_ps", "args-nested-vector", {12},
       as_span(dd::save_values(std::vector<std::vector<std::int32_t>>{{1, 2}, {}, {3}})));
  seed("fuzz_ps", "args-optional-pair-array", {13},
       as_span(dd::save_values(std::optional<std::string>("x"), std::pair<int, float>{1, 2.0f}, std::array<std::uint8_t, 3>{1, 2, 3})));
  seed("fuzz_ps", "args-tensors-f64-u8", {14},
       as_span(dd::save_values(ds::Tensor<double>({1, 2}, {0.5, 1.5}), ds::Tensor<std::uint8_t>({0}, {}))));
  seed("fuzz_ps", "args-tuple-bool", {15},
       as_span(dd::save_values(std::tuple<std::int64_t, std::vector<double>>{4, {1.0, 2.0}}, true)));
}

void safetensors() {
  std::vector<float> a{1, 2, 3, 4, 5, 6};
  std::vector<std::int64_t> b{-1, 0, 1};
  std::vector<std::uint8_t> c{1, 0, 1, 1};
  std::vector<double> empty;
  st::TensorMap tensors{{"layer/kernel", st::TensorView::of<float>({2, 3}, a)},
                        {"step", st::TensorView::of<std::int64_t>({3}, b)},
                        {"mask", st::TensorView::of<std::uint8_t>({2, 2}, c)},
                        {"empty", st::TensorView::of<double>({0, 4}, empty)}};
  const auto file = st::serialize(tensors, {{"epoch", "3"}});
  seed("fuzz_safetensors", "four-tensors-verified", {1}, file);
  seed("fuzz_safetensors", "four-tensors", {0}, file);
  seed("fuzz_safetensors", "no-tensors", {1}, st::serialize({}));
}

void records() {
  // Record files as write_record_file makes them (the target's input is the whole file).
  const fs::path scratch = fs::temp_directory_path() / "distribute-make-corpus.tfrecord";
  auto file_of = [&](const std::vector<std::string>& records) {
    ds::data::write_record_file(scratch.string(), records);
    std::ifstream in(scratch, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(scratch);
    return bytes;
  };
  seed("fuzz_record", "three-records", {}, file_of({"first", "", std::string("bin\0ary\xff", 8)}));
  seed("fuzz_record", "one-record", {}, file_of({"a record of some length"}));
  seed("fuzz_record", "empty-file", {}, std::string_view());
}

void cluster() {
  const ds::ClusterSpec spec({{"chief", {"host0:2222"}}, {"worker", {"host1:2222", "[::1]:2223"}}, {"ps", {"10.0.0.3:2224"}}});
  const std::string tf_config = fmt::format(R"({{"cluster": {}, "task": {{"type": "worker", "index": 1}}, "rpc_layer": "grpc"}})", spec.to_json());
  seed("fuzz_cluster", "tf-config", {0}, tf_config);
  seed("fuzz_cluster", "tf-config-sparse",
       {0}, R"({"cluster": {"worker": {"0": "a:1", "3": "b:2"}}, "task": {"type": "worker", "index": 3}, "environment": "cloud"})");
  seed("fuzz_cluster", "hostlist", {1}, "node[01-03,07],gpu-[0-1].cluster,r[1-2]n[08-10]-ib");
  seed("fuzz_cluster", "tasks-per-node", {2}, "2(x3),1,4");
  seed("fuzz_cluster", "address-v6", {3}, "[fe80::1%eth0]:2222");
  seed("fuzz_cluster", "address-v4", {3}, "10.0.0.7:8888");
  seed("fuzz_cluster", "net-address", {4}, "[::ffff:10.0.0.1]:65535");
  seed("fuzz_cluster", "slurm-env", {5}, "3\n7\nnode[1-3],x\n2(x3),1");
  seed("fuzz_cluster", "launcher-env", {6}, "1\n4\n127.0.0.1\n29500");
}

}  // namespace

void launch_meeting() {
  // The lines of distribute-launch's node meeting as the launchers write them.
  ds::net::detail::Nonce nonce{}, node0{};  // fixed, so that the seeds are the same on every run
  for (std::size_t k = 0; k < nonce.size(); ++k) {
    nonce[k] = static_cast<std::byte>(k);
    node0[k] = static_cast<std::byte>(255 - k);
  }
  const launch::NodeEntry joiner{1, 1, "h", 1};  // the target's joiner of a CLUSTER line
  seed("fuzz_launch_meeting", "hello", {0}, launch::hello_line(nonce));
  seed("fuzz_launch_meeting", "hello-first-protocol", {0}, "HELLO distribute-launch-nodes/1 2 1 1 127.0.0.1 1");
  seed("fuzz_launch_meeting", "challenge", {1}, launch::challenge_line(node0, launch::node0_proof("t", nonce, node0)));
  seed("fuzz_launch_meeting", "challenge-refused", {1}, "ERROR refused: not proven to hold this job's cluster token");
  const std::string fields = launch::join_fields(2, {1, 4, "10.0.0.2", 29500});
  seed("fuzz_launch_meeting", "join", {2}, launch::join_line(launch::join_proof("t", nonce, node0, fields), fields));
  launch::NodeAgreement a;
  a.nodes = {{0, 2, "10.0.0.1", 29501}, joiner};
  a.master_addr = "10.0.0.1";
  a.master_port = 29500;
  seed("fuzz_launch_meeting", "cluster", {3}, launch::agreement_line(a));
  seed("fuzz_launch_meeting", "cluster-refused", {3}, "ERROR --node-rank 1 is taken");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  root = argv[1];
  frames();
  ps();
  safetensors();
  records();
  cluster();
  launch_meeting();
  std::printf("%d seeds written under %s\n", written, root.c_str());
}
