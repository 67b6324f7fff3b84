// ds::Server: what a ps or worker task of a parameter-server cluster runs (TF's tf.distribute.Server).
//   ps task      serves the variables placed on it: create, read, assign/add/sub, row lookups, and
//                closures' commits (applied atomically, at most once per closure).
//   worker task  runs the functions the coordinator schedules, with the arguments it sends, and
//                builds the per-worker datasets it asks for.
// Both answer GET /healthz and GET /metrics (Prometheus text) on the same port.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <unistd.h>

#include <fmt/format.h>

#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/ps/server_options.hpp>
#include <distribute/core/device.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/observe/metrics.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/row_updates.hpp>
#include <distribute/ps/detail/messages.hpp>
#include <distribute/ps/detail/optimizer_rules.hpp>
#include <distribute/ps/detail/ps_client.hpp>
#include <distribute/net/rpc_server.hpp>
#include <distribute/net/wire_counters.hpp>
#include <distribute/ps/detail/rpc.hpp>
#include <distribute/ps/remote_function.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

namespace ps::detail {

/// The variables of one ps task. One lock for the table: a commit's updates are applied together,
/// so no read sees half a closure.
class VariableTable {
 public:
  /// What one read of rows may return (RpcOptions::max_frame_bytes' default).
  static constexpr std::uint64_t kMaxReadRowsBytes = std::uint64_t{1} << 31;

  /// `max_initialized_bytes`: ServerOptions' (0: this machine's memory).
  explicit VariableTable(std::string device, std::uint64_t max_initialized_bytes = 0)
      : device_(std::move(device)), max_initialized_bytes_(max_initialized_bytes ? max_initialized_bytes : machine_memory()) {}

  void create(CreateVarMsg m) {
    const auto dtype = checked_dtype(m.dtype, m.key);
    for (auto d : m.shape) {
      if (d < 0) throw InvalidArgument(fmt::format("variable '{}': negative dimension in shape {}", m.key, shape_string(m.shape)));
    }
    const auto what = fmt::format("variable '{}'", m.key);
    const std::size_t want = checked_byte_size(m.shape, size_of(dtype), what.c_str());
    if (m.bytes.size() != want) {
      throw InvalidArgument(fmt::format("variable '{}': {} bytes for shape {} of {} (expected {})", m.key, m.bytes.size(),
                                        shape_string(m.shape), to_string(dtype), want));
    }
    std::unique_lock lock(mutex_);
    vars_[m.key] = Stored{dtype, std::move(m.shape), std::move(m.bytes)};
  }

  std::string read(const ReadVarMsg& m) const {
    std::shared_lock lock(mutex_);
    const Stored& v = find(m.key, m.dtype);
    if (m.nbytes != v.bytes.size()) {
      throw InvalidArgument(fmt::format("variable '{}' on {} holds {} bytes (shape {}), {} were asked for", m.key, device_,
                                        v.bytes.size(), shape_string(v.shape), m.nbytes));
    }
    return v.bytes;
  }

  std::string read_rows(const ReadRowsMsg& m) const {
    std::shared_lock lock(mutex_);
    const Stored& v = find(m.key, m.dtype);
    const std::int64_t rows = v.shape.empty() ? 0 : v.shape[0];
    const std::size_t row_bytes = rows ? v.bytes.size() / static_cast<std::size_t>(rows) : 0;
    if (m.row_bytes != row_bytes) {
      throw InvalidArgument(fmt::format("variable '{}' on {}: rows of {} bytes asked for, its rows have {}", m.key, device_,
                                        m.row_bytes, row_bytes));
    }
    std::uint64_t out_bytes = 0;  // the ids are bounded by the request's size, the product is checked
    if (!checked_mul(m.rows.size(), row_bytes, out_bytes) || out_bytes > kMaxReadRowsBytes) {
      throw InvalidArgument(fmt::format("variable '{}' on {}: {} rows of {} bytes exceed the {} bytes one read may return",
                                        m.key, device_, m.rows.size(), row_bytes, kMaxReadRowsBytes));
    }
    std::string out(static_cast<std::size_t>(out_bytes), '\0');
    for (std::size_t i = 0; i < m.rows.size(); ++i) {
      const auto r = m.rows[i];
      if (r < 0 || r >= rows) {
        throw InvalidArgument(fmt::format("variable '{}' on {}: row {} is out of range [0, {})", m.key, device_, r, rows));
      }
      std::memcpy(out.data() + i * row_bytes, v.bytes.data() + static_cast<std::size_t>(r) * row_bytes, row_bytes);
    }
    return out;
  }

  /// Creates a variable the ps task fills itself: only its shape and initializer travel.
  void create(const CreateInitializedMsg& m) {
    const auto dtype = checked_dtype(m.dtype, m.key);
    for (auto d : m.shape) {
      if (d < 0) throw InvalidArgument(fmt::format("variable '{}': negative dimension in shape {}", m.key, shape_string(m.shape)));
    }
    const auto what = fmt::format("variable '{}'", m.key);
    const std::size_t bytes = checked_byte_size(m.shape, size_of(dtype), what.c_str());
    if (bytes > max_initialized_bytes_) {
      throw InvalidArgument(fmt::format("variable '{}' of shape {} ({}) would hold {} bytes; a ps task fills at most {} "
                                        "(ServerOptions::max_initialized_bytes)",
                                        m.key, shape_string(m.shape), to_string(dtype), bytes, max_initialized_bytes_));
    }
    const Initializer init = Initializer::from_parts(m.init_kind, m.a, m.b, m.seed, m.offset);
    init.check_dtype(dtype, what);
    std::string value(bytes, '\0');
    init.fill(dtype, {reinterpret_cast<std::byte*>(value.data()), value.size()});
    std::unique_lock lock(mutex_);
    vars_[m.key] = Stored{dtype, m.shape, std::move(value)};
  }

  /// An update whose value the message owns, or one read in place in a request.
  void update(const UpdateVarMsg& m) { update_any(m); }
  void update(const UpdateVarView& m) { update_any(m); }

  /// Applies a closure's updates, unless this closure's updates were applied before (a retry).
  bool commit(const CommitMsg& m) { return commit_any(m); }
  bool commit(const CommitView& m) { return commit_any(m); }

  std::size_t size() const {
    std::shared_lock lock(mutex_);
    return vars_.size();
  }
  std::size_t bytes() const {
    std::shared_lock lock(mutex_);
    std::size_t n = 0;
    for (const auto& [k, v] : vars_) n += v.bytes.size();
    return n;
  }
  /// Rows that updates of rows (scatter_*, sparse optimizer steps) have changed so far.
  std::uint64_t rows_updated() const noexcept { return rows_updated_.load(std::memory_order_relaxed); }

 private:
  template <class Bytes>
  void update_any(const BasicUpdateVarMsg<Bytes>& m) {
    std::unique_lock lock(mutex_);
    apply_locked(m);
  }

  template <class Update>
  bool commit_any(const BasicCommitMsg<Update>& m) {
    std::unique_lock lock(mutex_);
    if (committed_.count({m.session, m.closure})) return false;
    for (const auto& u : m.updates) check_locked(u);  // all or nothing
    for (const auto& u : m.updates) apply_locked(u);
    committed_.insert({m.session, m.closure});
    return true;
  }

  struct Stored {
    DType dtype;
    Shape shape;
    std::string bytes;
    std::span<std::byte> span() noexcept { return {reinterpret_cast<std::byte*>(bytes.data()), bytes.size()}; }
  };

  static std::uint64_t machine_memory() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
                                 : std::uint64_t{1} << 40;
  }

  static DType checked_dtype(std::uint8_t d, const std::string& key) {
    if (!is_dtype_code(d)) {
      throw InvalidArgument(fmt::format("variable '{}': unknown dtype code {}", key, d));
    }
    return static_cast<DType>(d);
  }

  const Stored& find(const std::string& key, std::uint8_t dtype) const {
    auto it = vars_.find(key);
    if (it == vars_.end()) throw InvalidArgument(fmt::format("no variable '{}' on {}", key, device_));
    if (static_cast<std::uint8_t>(it->second.dtype) != dtype) {
      throw InvalidArgument(fmt::format("variable '{}' on {} is {}, not {}", key, device_, to_string(it->second.dtype),
                                        to_string(checked_dtype(dtype, key))));
    }
    return it->second;
  }

  static std::size_t row_bytes_of(const Stored& v) {
    return v.shape.empty() || v.shape[0] == 0 ? 0 : v.bytes.size() / static_cast<std::size_t>(v.shape[0]);
  }

  // The rows an update names, checked: a whole number of int64s, each in range, and one row of
  // values per row (a stranger's request claims nothing it does not carry).
  template <class Bytes>
  void check_rows_locked(const BasicUpdateVarMsg<Bytes>& m, const Stored& v, std::string_view what) const {
    if (v.shape.empty()) {
      throw InvalidArgument(fmt::format("{} of variable '{}' on {}: a scalar has no rows", what, m.key, device_));
    }
    const auto rows = bytes_of(m.rows);
    if (rows.size() % sizeof(std::int64_t) != 0) {
      throw InvalidArgument(fmt::format("{} of variable '{}' on {}: {} bytes of row indices are not a whole number of "
                                        "int64s",
                                        what, m.key, device_, rows.size()));
    }
    const std::size_t n = rows.size() / sizeof(std::int64_t), row_bytes = row_bytes_of(v);
    std::uint64_t want = 0;
    if (!checked_mul(n, row_bytes, want) || bytes_of(m.bytes).size() != want) {
      throw InvalidArgument(fmt::format("{} of variable '{}' on {}: {} rows of {} bytes claimed, {} bytes of values sent",
                                        what, m.key, device_, n, row_bytes, bytes_of(m.bytes).size()));
    }
    if (const auto at = core::first_row_out_of_range(rows, v.shape[0]); at >= 0) {
      throw InvalidArgument(fmt::format("{} of variable '{}' on {}: row {} (at position {}) is out of range [0, {})", what,
                                        m.key, device_, core::row_at(rows, static_cast<std::size_t>(at)), at, v.shape[0]));
    }
  }

  template <class Bytes>
  void check_locked(const BasicUpdateVarMsg<Bytes>& m) const {
    if (m.kind >= core::kNumRemoteUpdates) {
      throw InvalidArgument(fmt::format("update of variable '{}': unknown kind {}", m.key, m.kind));
    }
    const Stored& v = find(m.key, m.dtype);
    const auto kind = static_cast<core::RemoteUpdate>(m.kind);
    if (core::is_scatter(kind)) {
      const core::RowOp op = core::row_op_of(kind);
      check_rows_locked(m, v, core::scatter_name(op));
      core::check_row_op(op, v.dtype, fmt::format("variable '{}'", m.key));
      return;
    }
    if (core::is_optimizer_step(kind)) {
      const auto what = fmt::format("variable '{}' on {}", m.key, device_);
      if (!steps_apply_to(v.dtype)) {
        throw InvalidArgument(fmt::format("{} applies to float32 and float64 variables; {} is {}", optimizer_name(kind),
                                          what, to_string(v.dtype)));
      }
      check_step_params(kind, m.params, what);
      if (const auto slot = slot_name(kind); !slot.empty()) {
        auto it = vars_.find(slot_key(m.key, slot));
        if (it == vars_.end() || it->second.dtype != v.dtype || it->second.shape != v.shape) {
          throw InvalidArgument(fmt::format("{}: {} has no '{}' slot of its dtype and shape; build the optimizer on "
                                            "the variable first (optimizer.build(variable), on the coordinator)",
                                            optimizer_name(kind), what, slot));
        }
      }
      if (m.all_rows) {
        if (!bytes_of(m.rows).empty() || bytes_of(m.bytes).size() != v.bytes.size()) {
          throw InvalidArgument(fmt::format("{} on {}: a dense gradient of {} bytes for a variable of {} (shape {})",
                                            optimizer_name(kind), what, bytes_of(m.bytes).size(), v.bytes.size(),
                                            shape_string(v.shape)));
        }
      } else {
        check_rows_locked(m, v, optimizer_name(kind));
      }
      return;
    }
    if (m.all_rows || !bytes_of(m.rows).empty() || bytes_of(m.bytes).size() != v.bytes.size()) {
      throw InvalidArgument(fmt::format("update of variable '{}' on {}: {} bytes for a variable of {} (shape {})", m.key,
                                        device_, bytes_of(m.bytes).size(), v.bytes.size(), shape_string(v.shape)));
    }
  }

  template <class Bytes>
  void apply_locked(const BasicUpdateVarMsg<Bytes>& m) {
    check_locked(m);
    Stored& v = vars_.find(m.key)->second;
    const auto kind = static_cast<core::RemoteUpdate>(m.kind);
    const auto rows = bytes_of(m.rows);
    const auto values = bytes_of(m.bytes);
    if (core::is_scatter(kind)) {
      core::scatter_rows(v.dtype, core::row_op_of(kind), v.span(), row_bytes_of(v), rows, values);
      rows_updated_.fetch_add(rows.size() / sizeof(std::int64_t), std::memory_order_relaxed);
      return;
    }
    if (core::is_optimizer_step(kind)) {
      std::byte* slot = nullptr;
      if (const auto name = slot_name(kind); !name.empty()) slot = vars_.find(slot_key(m.key, name))->second.span().data();
      if (m.all_rows) {
        apply_step(v.dtype, kind, v.span().data(), slot, values.data(), v.bytes.size() / size_of(v.dtype), m.params);
        return;
      }
      const std::size_t row_bytes = row_bytes_of(v), n = rows.size() / sizeof(std::int64_t);
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t at = static_cast<std::size_t>(core::row_at(rows, i)) * row_bytes;
        apply_step(v.dtype, kind, v.span().data() + at, slot ? slot + at : nullptr, values.data() + i * row_bytes,
                   row_bytes / size_of(v.dtype), m.params);
      }
      rows_updated_.fetch_add(n, std::memory_order_relaxed);
      return;
    }
    apply_update_bytes(v.dtype, kind, v.span(), values);
  }

  std::string device_;
  std::uint64_t max_initialized_bytes_;
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, Stored> vars_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> committed_;  // (session, closure)
  std::atomic<std::uint64_t> rows_updated_{0};
};

}  // namespace ps::detail

class Server {
 public:
  /// Starts serving at once on this task's address in `cluster_spec`. `job_name` is "ps" or
  /// "worker"; `protocol` is "grpc" (TF's name, accepted) or "tcp": both mean this library's
  /// TCP protocol. InvalidArgument for another job or protocol; Unavailable when the address
  /// cannot be listened on.
  Server(ClusterSpec cluster_spec, std::string job_name, int task_index, std::string protocol = "grpc",
         ServerOptions options = {})
      : spec_(std::move(cluster_spec)), job_(std::move(job_name)), task_(task_index), protocol_(std::move(protocol)),
        options_(std::move(options)), incarnation_(ps::detail::random_id()) {
    if (job_ != "ps" && job_ != "worker") {
      throw InvalidArgument(fmt::format("ds::Server: job '{}' has nothing to serve; a Server runs on 'ps' and 'worker' "
                                        "tasks (the chief runs the ClusterCoordinator)",
                                        job_));
    }
    if (protocol_ != "grpc" && protocol_ != "tcp") {
      throw InvalidArgument(fmt::format("ds::Server: protocol '{}' is not supported; use \"grpc\" or \"tcp\"", protocol_));
    }
    if (!spec_.has_task(job_, task_)) {
      throw InvalidArgument(fmt::format("ds::Server: the cluster spec has no task {}:{}", job_, task_));
    }
    device_ = DeviceSpec{job_, 0, task_, "CPU", 0}.to_string();
    table_ = std::make_unique<ps::detail::VariableTable>(device_, options_.max_initialized_bytes);
    ps::detail::RpcOptions rpc;
    rpc.cluster_token = options_.cluster_token;
    rpc.insecure = options_.insecure;
    rpc.handshake_timeout = options_.handshake_timeout;
    rpc.connect_timeout = options_.connect_timeout;
    rpc.read_timeout = options_.read_timeout;
    rpc.max_pending_connections = options_.max_pending_connections;
    rpc.log = options_.log;
    rpc_options_ = rpc;
    // A worker's closures and datasets run on the server's handler threads; everything else (a ps
    // task's variables, pings) on its network thread.
    const bool worker = job_ == "worker";
    rpc_ = std::make_unique<net::RpcServer>(
        spec_.task_address(job_, task_), device_, rpc,
        [this](std::uint64_t op, std::span<const std::byte> payload) { return handle(static_cast<ps::detail::RpcOp>(op), payload); },
        [this](std::string_view target) { return http(target); },
        [worker](std::uint64_t op) { return worker && ps::detail::takes_long(static_cast<ps::detail::RpcOp>(op)); });
  }

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  ~Server() { rpc_->stop(); }

  /// Blocks until stop() is called or the coordinator asks this server to stop.
  void join() {
    {
      std::unique_lock lock(mutex_);
      stopped_cv_.wait(lock, [&] { return stopped_; });
    }
    rpc_->stop();
  }

  /// Makes join() return; the port closes once join() returns or the Server is destroyed.
  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    stopped_cv_.notify_all();
  }

  /// "grpc://127.0.0.1:2222": the protocol and this task's address (TF's Server.target).
  std::string target() const { return fmt::format("{}://{}", protocol_, spec_.task_address(job_, task_)); }
  std::uint16_t port() const noexcept { return rpc_->port(); }
  const std::string& job_name() const noexcept { return job_; }
  int task_index() const noexcept { return task_; }

 private:
  std::vector<std::byte> handle(ps::detail::RpcOp op, std::span<const std::byte> payload) {
    using ps::detail::RpcOp;
    requests_[static_cast<std::size_t>(op) < requests_.size() ? static_cast<std::size_t>(op) : 0].fetch_add(1);
    switch (op) {
      case ps::detail::RpcOp::Ping:
        return ps::detail::encode_message(ps::detail::PingReply{job_, task_, incarnation_});
      case ps::detail::RpcOp::Stop:
        stop();
        return {};
      default: break;
    }
    if (job_ == "ps") return handle_ps(op, payload);
    return handle_worker(op, payload);
  }

  std::vector<std::byte> handle_ps(ps::detail::RpcOp op, std::span<const std::byte> payload) {
    using namespace ps::detail;
    switch (op) {
      case ps::detail::RpcOp::CreateVar:
        table_->create(decode_message<ps::detail::CreateVarMsg>(payload, "create"));
        return {};
      case ps::detail::RpcOp::CreateInitialized:
        table_->create(decode_message<ps::detail::CreateInitializedMsg>(payload, "create-initialized"));
        return {};
      case ps::detail::RpcOp::ReadVar: return to_bytes(table_->read(decode_message<ps::detail::ReadVarMsg>(payload, "read")));
      case ps::detail::RpcOp::ReadRows: return to_bytes(table_->read_rows(decode_message<ps::detail::ReadRowsMsg>(payload, "read-rows")));
      case ps::detail::RpcOp::UpdateVar:
        table_->update(decode_message<ps::detail::UpdateVarView>(payload, "update"));  // the value read in place
        return {};
      case ps::detail::RpcOp::Commit: {
        const bool applied = table_->commit(decode_message<ps::detail::CommitView>(payload, "commit"));
        (applied ? commits_applied_ : commits_duplicate_).fetch_add(1);
        return {std::byte{applied ? std::uint8_t{1} : std::uint8_t{0}}};
      }
      default:
        throw InvalidArgument(fmt::format("{} is a ps task: it does not run closures or build datasets", device_));
    }
  }

  std::shared_ptr<ps::detail::PsClientStore> ps_store() {
    std::lock_guard lock(mutex_);
    if (!store_) store_ = std::make_shared<ps::detail::PsClientStore>(spec_, rpc_options_);
    return store_;
  }

  std::vector<std::byte> handle_worker(ps::detail::RpcOp op, std::span<const std::byte> payload) {
    using namespace ps::detail;
    switch (op) {
      case ps::detail::RpcOp::RunClosure: return ps::detail::to_bytes(run_closure(decode_message<ps::detail::RunClosureView>(payload, "run-closure")));
      case ps::detail::RpcOp::MakeDataset: {
        const auto m = decode_message<ps::detail::MakeDatasetMsg>(payload, "make-dataset");
        const ps::detail::RemoteFunctionEntry& f = registered(m.function, m.signature);
        if (!f.make_iterator) {
          throw InvalidArgument(fmt::format("function '{}' does not return a ds::Dataset", m.function));
        }
        InputContext ctx{m.num_workers, m.worker_index, 1};
        auto it = f.make_iterator(ctx);
        std::lock_guard lock(mutex_);
        datasets_[m.dataset] = std::move(it);
        return {};
      }
      default:
        throw InvalidArgument(fmt::format("{} is a worker task: variables live on ps tasks", device_));
    }
  }

  const ps::detail::RemoteFunctionEntry& registered(const std::string& name, const std::string& signature) {
    const auto* f = ps::detail::RemoteFunctionRegistry::instance().find(name);
    if (!f) {
      throw InvalidArgument(fmt::format("{}: no function is registered as '{}' in this process (register it with "
                                        "DISTRIBUTE_REMOTE_FUNCTION in every process of the cluster)",
                                        device_, name));
    }
    if (f->signature != signature) {
      throw InvalidArgument(fmt::format("{}: function '{}' is registered here as {}, with another signature than the "
                                        "coordinator's: every process must run the same binary",
                                        device_, name, f->describe()));
    }
    return *f;
  }

  std::string run_closure(const ps::detail::RunClosureView& m) {
    const ps::detail::RemoteFunctionEntry& f = registered(m.function, m.signature);
    const auto store = ps_store();
    ps::detail::WorkerEnvironment env;
    env.store = store;
    env.worker_name = device_;
    env.handles = &handles_;
    env.dataset_iterator = [this](std::uint64_t id) -> std::shared_ptr<void> {
      std::lock_guard lock(mutex_);
      auto it = datasets_.find(id);
      if (it == datasets_.end()) {
        throw InvalidArgument(fmt::format("{}: per-worker dataset #{} was not created on this worker", device_, id));
      }
      return it->second;
    };
    ps::detail::ClosureTransaction txn{m.session, m.closure, {}};
    struct Bind {
      ps::detail::WorkerEnvironment* old_env;
      ps::detail::ClosureTransaction* old_txn;
      ~Bind() {
        ps::detail::current_worker_environment() = old_env;
        ps::detail::current_transaction() = old_txn;
      }
    } bind{ps::detail::current_worker_environment(), ps::detail::current_transaction()};
    ps::detail::current_worker_environment() = &env;
    ps::detail::current_transaction() = &txn;
    std::string result;
    try {
      result = f.invoke(m.args.chars());
    } catch (...) {
      closures_failed_.fetch_add(1);
      throw;
    }
    ps::detail::current_transaction() = nullptr;
    store->commit(txn);
    closures_run_.fetch_add(1);
    return result;
  }

  net::RpcServer::HttpReply http(std::string_view target) {
    net::RpcServer::HttpReply r;
    if (target == "/healthz") {
      r.status = 200;
      r.body = "ok\n";
    } else if (target == "/metrics") {
      r.status = 200;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics();
    }
    return r;
  }

  std::string metrics() {
    std::call_once(metrics_registered_, [this] { register_metrics(); });
    return metrics_.expose();
  }

  // The counters stay this server's atomics (the request path is unchanged); the registry reads
  // them when scraped and writes the text, labelled task_type/task_index like every task's.
  void register_metrics() {
    static constexpr const char* ops[] = {"other",  "ping",   "create",      "read",         "read_rows",          "update",
                                          "commit", "run_closure", "make_dataset", "stop", "create_initialized"};
    auto read = [](const std::atomic<std::uint64_t>& a) { return [&a] { return static_cast<double>(a.load()); }; };
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      metrics_.callback("distribute_requests_total", "Requests served, by operation.", "counter", {{"op", ops[i]}},
                        read(requests_[i]));
    }
    const auto& wire = net::wire_counters();
    metrics_.callback("distribute_wire_bytes_sent_total",
                      "Bytes this process wrote on its connections (frames whole: header, padding, payload).", "counter",
                      {}, [&wire] { return static_cast<double>(wire.sent.load()); });
    metrics_.callback("distribute_wire_bytes_received_total",
                      "Bytes this process read on its connections (frames whole: header, padding, payload).", "counter",
                      {}, [&wire] { return static_cast<double>(wire.received.load()); });
    if (job_ == "ps") {
      metrics_.callback("distribute_rows_updated_total",
                        "Variable rows changed by row updates (scatter_*, sparse optimizer steps).", "counter", {},
                        [this] { return static_cast<double>(table_->rows_updated()); });
      metrics_.callback("distribute_variables", "Variables held by this ps task.", "gauge", {},
                        [this] { return static_cast<double>(table_->size()); });
      metrics_.callback("distribute_variable_bytes", "Bytes of variable values held by this ps task.", "gauge", {},
                        [this] { return static_cast<double>(table_->bytes()); });
      metrics_.callback("distribute_commits_applied_total", "Closure commits applied.", "counter", {}, read(commits_applied_));
      metrics_.callback("distribute_commits_duplicate_total",
                        "Closure commits ignored because a retry's commit was already applied.", "counter", {},
                        read(commits_duplicate_));
    } else {
      metrics_.callback("distribute_closures_total", "Closures run to completion on this worker.", "counter", {},
                        read(closures_run_));
      metrics_.callback("distribute_closures_failed_total", "Closures that raised an error on this worker.", "counter", {},
                        read(closures_failed_));
    }
  }

  ClusterSpec spec_;
  std::string job_;
  int task_;
  std::string protocol_;
  ServerOptions options_;
  std::uint64_t incarnation_;
  std::string device_;
  ps::detail::RpcOptions rpc_options_;
  std::unique_ptr<ps::detail::VariableTable> table_;
  std::array<std::atomic<std::uint64_t>, 11> requests_{};
  std::atomic<std::uint64_t> commits_applied_{0}, commits_duplicate_{0}, closures_run_{0}, closures_failed_{0};
  observe::MetricsRegistry metrics_{job_, task_};
  std::once_flag metrics_registered_;
  std::mutex mutex_;
  std::condition_variable stopped_cv_;
  bool stopped_ = false;
  std::shared_ptr<ps::detail::PsClientStore> store_;
  std::map<std::uint64_t, std::shared_ptr<void>> datasets_;
  ps::detail::HandleCache handles_;  // the ps variables closures named before
  std::unique_ptr<net::RpcServer> rpc_;  // last: stopped (in ~Server) before the rest goes
};

DISTRIBUTE_END_NAMESPACE
