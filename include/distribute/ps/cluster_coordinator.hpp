// ds::ClusterCoordinator: schedules functions on the workers of a parameter-server cluster
// (TF's tf.distribute.experimental.coordinator.ClusterCoordinator).
//
// Closures wait in a bounded queue; one dispatcher thread per worker takes the next closure, runs it
// there and fulfils its RemoteValue. A worker that dies or stops answering heartbeats loses its
// closure to the queue (retried elsewhere under the same closure id, so the ps tasks apply its
// updates once) and is reconnected, with its per-worker datasets rebuilt, when it comes back. The
// first error a closure raises cancels the queued closures and is rethrown, once, by join() or
// schedule(). A lost ps task is fatal: schedule/join/done throw PeerFailure naming it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/ps/detail/coordinator_observability.hpp>
#include <distribute/ps/detail/messages.hpp>
#include <distribute/ps/detail/rpc.hpp>
#include <distribute/ps/detail/spare_buffers.hpp>
#include <distribute/ps/remote_function.hpp>
#include <distribute/ps/parameter_server_strategy.hpp>
#include <distribute/ps/remote_value.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

struct CoordinatorOptions {
  /// schedule() blocks while this many closures wait.
  std::size_t max_queued_closures = 256;
  /// Workers and ps tasks are pinged this often...
  std::chrono::milliseconds heartbeat_interval{250};
  /// ...and a worker or ps that does not answer within this is lost.
  std::chrono::milliseconds heartbeat_timeout{3000};
  /// How often a lost worker is tried again.
  std::chrono::milliseconds reconnect_interval{250};
  /// How long the constructor waits for every worker to come up.
  std::chrono::milliseconds connect_timeout{60000};
  /// Lost and returning workers are reported here; default: one line on stderr.
  std::function<void(std::string_view)> log = {};
  /// Serve GET /metrics on the chief's own host at this port (0: a free one, see
  /// ClusterCoordinator::metrics_port()). Unset: DISTRIBUTE_METRICS_PORT, else no metrics.
  std::optional<int> metrics_port = std::nullopt;
  /// Record a timeline of the closures into this path, "chief-<index>" inserted before its
  /// extension (docs/observability.md). Unset: DISTRIBUTE_TIMELINE; "": none.
  std::optional<std::string> timeline = std::nullopt;
  /// Serve the metrics port beyond loopback without a cluster token (anyone may read it): refused
  /// (ClusterConfigError) unless set, or DISTRIBUTE_INSECURE=1. With a token (the strategy's),
  /// /metrics wants it as `Authorization: Bearer TOKEN`.
  bool insecure = false;
};

namespace ps::detail {

struct Closure {
  std::uint64_t id = 0;
  std::uint32_t attempt = 0;
  std::string function;
  std::string signature;
  std::string args;
  std::shared_ptr<ClosureState> state;
};

}  // namespace ps::detail

class ClusterCoordinator {
 public:
  /// Connects to every worker (waiting up to options.connect_timeout while they start). The
  /// strategy must be connected to its ps tasks (ParameterServerOptions::connect).
  explicit ClusterCoordinator(ParameterServerStrategy& strategy, CoordinatorOptions options = {})
      : strategy_(strategy), options_(std::move(options)), session_(ps::detail::random_id()) {
    if (!strategy.connected()) {
      throw InvalidArgument("ClusterCoordinator: the strategy was built with ParameterServerOptions{.connect = false}; "
                            "a coordinator needs the ps tasks");
    }
    const ClusterSpec& spec = strategy.cluster_resolver()->cluster_spec();
    {
      CommunicationOptions settings;
      settings.metrics_port = options_.metrics_port;
      settings.timeline = options_.timeline;
      settings.cluster_token = strategy.options().cluster_token;
      settings.insecure = options_.insecure;
      // The coordinator is the chief (ParameterServerStrategy checked there is exactly one).
      observe_ = ps::detail::CoordinatorObservability::start(
          settings, 0, spec.task_address("chief", 0),
          [this] {
            std::lock_guard lock(mutex_);
            return static_cast<double>(queue_.size());
          },
          [this] { return static_cast<double>(num_workers_up()); });
    }
    ps::detail::RpcOptions rpc;
    rpc.cluster_token = strategy.options().cluster_token;
    rpc.connect_timeout = options_.connect_timeout;
    for (int t = 0; t < spec.num_tasks("ps"); ++t) {
      ps_pings_.push_back(std::make_unique<ps::detail::RpcClient>(spec.task_address("ps", t), ps_device_string(t), rpc));
    }
    const int n = spec.num_tasks("worker");
    for (int i = 0; i < n; ++i) {
      auto w = std::make_unique<Worker>();
      w->index = i;
      w->device = DeviceSpec{"worker", 0, i, "CPU", 0}.to_string();
      w->run = std::make_unique<ps::detail::RpcClient>(spec.task_address("worker", i), w->device, rpc);
      w->ping = std::make_unique<ps::detail::RpcClient>(spec.task_address("worker", i), w->device, rpc);
      workers_.push_back(std::move(w));
    }
    for (auto& w : workers_) {
      try {
        w->run->connect(options_.connect_timeout);
      } catch (const ps::detail::ConnectionLost& e) {
        throw PeerFailure(fmt::format("ClusterCoordinator: {}", e.what()));
      }
      w->up = true;
    }
    for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { dispatch(*p); });
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }

  ClusterCoordinator(const ClusterCoordinator&) = delete;
  ClusterCoordinator& operator=(const ClusterCoordinator&) = delete;

  /// Stops dispatching; closures still queued fail with Cancelled. The servers keep running
  /// (shutdown_cluster() stops them).
  ~ClusterCoordinator() {
    stop_threads("the ClusterCoordinator was destroyed");
    if (observe_) observe_->stop();
  }

  /// Schedules `fn(args...)` on some worker; returns at once (blocking only while the queue is
  /// full). `fn` must be registered (DISTRIBUTE_REMOTE_FUNCTION); arguments convert to its
  /// parameter types here. Rethrows, once, the error of an earlier failed closure.
  template <class R, class... P, class... A>
  RemoteValue<R> schedule(R (*fn)(P...), A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "ClusterCoordinator::schedule: wrong number of arguments for fn");
    const auto* entry = ps::detail::RemoteFunctionRegistry::instance().find_by_address(reinterpret_cast<const void*>(fn));
    if (!entry) {
      throw InvalidArgument("ClusterCoordinator::schedule: the function is not registered; register it with "
                            "DISTRIBUTE_REMOTE_FUNCTION(name) (or ds::register_remote_function) in every process");
    }
    // Arguments of the parameter types are written from where they are; others are converted first.
    return schedule_converted<R, std::decay_t<P>...>(*entry, ps::detail::as_parameter<std::decay_t<P>>(std::forward<A>(args))...);
  }

  /// Schedules the function registered as `name`; the argument types must be its parameter types
  /// (after decay) and R its result type, else InvalidArgument saying what it takes.
  template <class R = void, class... A>
  RemoteValue<R> schedule(std::string_view name, A&&... args) {
    const auto* entry = ps::detail::RemoteFunctionRegistry::instance().find(name);
    if (!entry) {
      throw InvalidArgument(fmt::format("ClusterCoordinator::schedule: no function is registered as '{}' (register it "
                                        "with DISTRIBUTE_REMOTE_FUNCTION in every process)",
                                        name));
    }
    if (*entry->params != typeid(std::tuple<std::decay_t<A>...>)) {
      throw InvalidArgument(fmt::format("ClusterCoordinator::schedule: function '{}' takes {} but was given {}", name,
                                        ps::detail::parameter_list(*entry->params),
                                        ps::detail::parameter_list(typeid(std::tuple<std::decay_t<A>...>))));
    }
    if (*entry->result != typeid(R)) {
      throw InvalidArgument(fmt::format("ClusterCoordinator::schedule: function '{}' returns {}, not {}", name,
                                        core::type_name(*entry->result), core::type_name(typeid(R))));
    }
    std::string bytes = ps::detail::save_values(static_cast<const std::decay_t<A>&>(args)...);
    return RemoteValue<R>(enqueue(*entry, std::move(bytes)));
  }

  /// Waits until every scheduled closure has finished. Rethrows the first closure error (once;
  /// then the coordinator is usable again), or PeerFailure when a ps task is lost.
  void join() {
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [&] { return outstanding_ == 0 || error_ || fatal_; });
    throw_pending_locked();
  }

  /// True when nothing is queued or running. Rethrows like join().
  bool done() {
    std::lock_guard lock(mutex_);
    throw_pending_locked();
    return outstanding_ == 0;
  }

  /// Has every worker build its own dataset from the registered function `fn` (which takes
  /// nothing or a ds::InputContext naming the worker); pass `ds::iter(result)` to scheduled
  /// functions. A worker that comes back after a failure builds it again.
  template <class T, class... P>
  PerWorkerDataset<T> create_per_worker_dataset(data::Dataset<T> (*fn)(P...)) {
    const auto* entry = ps::detail::RemoteFunctionRegistry::instance().find_by_address(reinterpret_cast<const void*>(fn));
    if (!entry) {
      throw InvalidArgument("create_per_worker_dataset: the dataset function is not registered; register it with "
                            "DISTRIBUTE_REMOTE_FUNCTION(name) in every process");
    }
    DatasetRecipe recipe{0, entry->name, entry->signature};
    {
      std::lock_guard lock(mutex_);
      recipe.id = ++dataset_ids_;
      datasets_.push_back(recipe);
    }
    for (auto& w : workers_) {
      if (!is_up(*w)) continue;  // built when it comes back
      try {
        make_dataset(*w, recipe);
      } catch (const ps::detail::ConnectionLost& e) {
        mark_down(*w, e.what());
      }
    }
    return PerWorkerDataset<T>(recipe.id);
  }

  /// Asks every worker and ps task to stop serving (their Server::join() returns). Best effort.
  /// The coordinator is done after this: queued closures are cancelled, and schedule() throws.
  void shutdown_cluster() {
    stop_threads("the cluster was shut down");  // no heartbeat mistakes the stopping tasks for lost ones
    for (auto& w : workers_) {
      try {
        w->ping->call(ps::detail::RpcOp::Stop, {}, std::chrono::milliseconds(5000));
      } catch (const std::exception&) {
      }
    }
    strategy_.ps_store()->stop_all();
  }

  ParameterServerStrategy& strategy() noexcept { return strategy_; }
  int num_workers() const noexcept { return static_cast<int>(workers_.size()); }
  /// Workers currently in use (not lost).
  int num_workers_up() {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (auto& w : workers_) n += w->up ? 1 : 0;
    return n;
  }
  /// How many closure attempts were lost with their worker and retried.
  std::uint64_t closures_retried() {
    std::lock_guard lock(mutex_);
    return retried_;
  }
  /// The port GET /metrics is served on (CoordinatorOptions::metrics_port or
  /// DISTRIBUTE_METRICS_PORT; resolves 0), or nullopt when metrics are off.
  std::optional<std::uint16_t> metrics_port() const noexcept {
    if (!observe_ || !observe_->server) return std::nullopt;
    return observe_->server->port();
  }
  /// How many closures each worker completed (index = worker task).
  std::vector<std::uint64_t> closures_completed_per_worker() {
    std::lock_guard lock(mutex_);
    std::vector<std::uint64_t> out;
    for (auto& w : workers_) out.push_back(w->completed);
    return out;
  }

 private:
  struct Worker {
    int index = 0;
    std::string device;
    std::unique_ptr<ps::detail::RpcClient> run;   // closures and datasets
    std::unique_ptr<ps::detail::RpcClient> ping;  // heartbeats, answered while a closure runs
    bool up = false;                          // guarded by mutex_
    std::uint64_t completed = 0;              // guarded by mutex_
    std::thread thread;
  };
  struct DatasetRecipe {
    std::uint64_t id = 0;
    std::string function;
    std::string signature;
  };

  void log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      std::fputs(("distribute: " + line + "\n").c_str(), stderr);
    }
  }

  bool is_up(Worker& w) {
    std::lock_guard lock(mutex_);
    return w.up;
  }

  // The arguments in their parameter types, written into a kept buffer (the closure keeps them
  // until it is done, for a retry; then they go back).
  template <class R, class... P>
  RemoteValue<R> schedule_converted(const ps::detail::RemoteFunctionEntry& entry, const P&... args) {
    std::string bytes = arg_buffers_.take(ps::detail::saved_size<P...>(args...));
    ps::detail::save_values_into<P...>(bytes, args...);
    return RemoteValue<R>(enqueue(entry, std::move(bytes)));
  }

  std::shared_ptr<ps::detail::ClosureState> enqueue(const ps::detail::RemoteFunctionEntry& entry, std::string args) {
    auto state = std::make_shared<ps::detail::ClosureState>();
    if (observe_) {
      state->metrics = observe_->metrics;
      state->scheduled_ns = observe::Timeline::now_ns();
    }
    std::unique_lock lock(mutex_);
    throw_pending_locked();
    space_cv_.wait(lock, [&] { return queue_.size() < options_.max_queued_closures || error_ || fatal_ || stopping_; });
    throw_pending_locked();
    if (stopping_) {
      throw InvalidArgument(fmt::format("ClusterCoordinator::schedule({}): the cluster was shut down "
                                        "(shutdown_cluster); nothing runs any more",
                                        entry.name));
    }
    queue_.push_back(ps::detail::Closure{++closure_ids_, 0, entry.name, entry.signature, std::move(args), state});
    ++outstanding_;
    if (state->metrics) state->metrics->scheduled->add();
    work_cv_.notify_all();  // not notify_one: the heartbeat thread waits on this condition too
    return state;
  }

  /// Cancels what is queued and stops the dispatcher and heartbeat threads (idempotent).
  void stop_threads(const std::string& why) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      cancel_queued_locked(why);
    }
    work_cv_.notify_all();
    space_cv_.notify_all();
    idle_cv_.notify_all();
    for (auto& w : workers_) w->run->abort();
    for (auto& w : workers_) {
      if (w->thread.joinable()) w->thread.join();
    }
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  void throw_pending_locked() {
    if (fatal_) std::rethrow_exception(fatal_);  // a lost ps task: stays
    if (error_) {
      auto e = std::exchange(error_, nullptr);
      std::rethrow_exception(e);
    }
  }

  void cancel_queued_locked(const std::string& why) {
    for (auto& c : queue_) {
      c.state->fail(std::make_exception_ptr(Cancelled(fmt::format("closure #{} ({}) was cancelled: {}", c.id, c.function, why))));
      --outstanding_;
      if (observe_) observe_closure(c, -1, 0, "cancelled", why);
    }
    queue_.clear();
    space_cv_.notify_all();
    idle_cv_.notify_all();
  }

  void closure_done_locked() {
    --outstanding_;
    if (outstanding_ == 0) idle_cv_.notify_all();
  }

  void mark_down(Worker& w, const std::string& reason, ps::detail::WorkerLoss kind = ps::detail::WorkerLoss::ConnectionLost) {
    {
      std::lock_guard lock(mutex_);
      if (!w.up) return;
      w.up = false;
    }
    w.run->abort();
    w.ping->abort();
    log(fmt::format("lost worker {} ({}): {}; its closures go to the other workers", w.index, w.run->address(), reason));
    if (observe_) observe_->worker_lost(w.index, kind, reason);
  }

  void lose_ps(const std::string& what) {
    std::lock_guard lock(mutex_);
    if (fatal_) return;
    fatal_ = std::make_exception_ptr(PeerFailure(what));
    cancel_queued_locked(what);
    work_cv_.notify_all();
  }

  void make_dataset(Worker& w, const DatasetRecipe& d) {
    ps::detail::MakeDatasetMsg m{d.id, d.function, d.signature, num_workers(), w.index};
    try {
      w.run->call(ps::detail::RpcOp::MakeDataset, ps::detail::encode_message(m));
    } catch (const ps::detail::RemoteError& e) {
      ps::detail::throw_as_kind(e.kind(), e.what());
    }
  }

  bool reconnect(Worker& w) {
    try {
      w.run->connect(std::chrono::milliseconds(500));
      std::vector<DatasetRecipe> recipes;
      {
        std::lock_guard lock(mutex_);
        recipes = datasets_;
      }
      for (const auto& d : recipes) make_dataset(w, d);
      w.ping->disconnect();  // it may hold a connection to the worker's previous process
    } catch (const std::exception&) {
      w.run->disconnect();
      return false;
    }
    {
      std::lock_guard lock(mutex_);
      w.up = true;
    }
    log(fmt::format("worker {} ({}) is back; it receives closures again", w.index, w.run->address()));
    if (observe_) observe_->worker_back(w.index);
    work_cv_.notify_all();
    return true;
  }

  void dispatch(Worker& w) {
    for (;;) {
      bool up;
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        up = w.up;
      }
      if (!up) {
        if (!reconnect(w)) {
          std::unique_lock lock(mutex_);
          work_cv_.wait_for(lock, options_.reconnect_interval, [&] { return stopping_; });
        }
        continue;
      }
      ps::detail::Closure c;
      {
        std::unique_lock lock(mutex_);
        work_cv_.wait(lock, [&] { return stopping_ || !w.up || !queue_.empty(); });
        if (stopping_) return;
        if (!w.up || queue_.empty()) continue;
        c = std::move(queue_.front());
        queue_.pop_front();
        space_cv_.notify_one();
      }
      run_closure(w, std::move(c));
    }
  }

  void run_closure(Worker& w, ps::detail::Closure c) {
    struct GiveBack {  // the arguments' buffer, once the closure is done (a retry moved it on)
      ps::detail::SpareBuffers& spare;
      ps::detail::Closure& closure;
      ~GiveBack() { spare.give(std::move(closure.args)); }
    } give_back{arg_buffers_, c};
    // The arguments go out from where the closure keeps them (for a retry), without a copy.
    const ps::detail::RunClosureView m{session_, c.id, c.attempt, c.function, c.signature, ps::detail::WireBytes{ps::detail::bytes_of(c.args)}};
    const std::int64_t start_ns = observe_ ? observe::Timeline::now_ns() : 0;
    try {
      auto reply = w.run->call(ps::detail::RpcOp::RunClosure, ps::detail::encode_reusing(m));
      if (observe_) observe_closure(c, w.index, start_ns, "ok");  // before get() can return
      c.state->finish(std::move(reply));
      std::lock_guard lock(mutex_);
      ++w.completed;
      closure_done_locked();
    } catch (const ps::detail::ConnectionLost& e) {
      mark_down(w, e.what());
      std::lock_guard lock(mutex_);
      if (stopping_ || fatal_) {
        const char* why = fatal_ ? "a ps task was lost" : "shutdown";
        if (observe_) observe_closure(c, w.index, start_ns, "cancelled", why);
        c.state->fail(std::make_exception_ptr(Cancelled(fmt::format("closure #{} ({}) was cancelled: {}", c.id,
                                                                    c.function, why))));
        closure_done_locked();
        return;
      }
      if (observe_) observe_closure(c, w.index, start_ns, "worker_lost", e.what());
      ++c.attempt;
      ++retried_;
      queue_.push_front(std::move(c));  // first in line: it was scheduled earliest
      work_cv_.notify_all();
    } catch (const ps::detail::RemoteError& e) {
      std::exception_ptr error;
      try {
        ps::detail::throw_as_kind(e.kind(), e.what());
      } catch (...) {
        error = std::current_exception();
      }
      if (observe_) observe_closure(c, w.index, start_ns, "error", e.what());
      c.state->fail(error);
      if (e.kind() == ps::detail::ErrorKind::PeerFailure) {  // the worker lost a ps task: nothing can go on
        lose_ps(fmt::format("closure #{} ({}) on worker {}: {}", c.id, c.function, w.index, e.what()));
        std::lock_guard lock(mutex_);
        closure_done_locked();
        return;
      }
      std::lock_guard lock(mutex_);
      if (!error_) {
        error_ = error;
        cancel_queued_locked(fmt::format("closure #{} ({}) failed on worker {}: {}", c.id, c.function, w.index, e.what()));
      }
      closure_done_locked();
    }
  }

  void observe_closure(const ps::detail::Closure& c, int worker, std::int64_t start_ns, const char* outcome,
                       const std::string& error = {}) {
    observe_->closure_ended(c.id, c.function, c.attempt, c.state->scheduled_ns, worker, start_ns, outcome, error);
  }

  void heartbeat_loop() {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        work_cv_.wait_for(lock, options_.heartbeat_interval, [&] { return stopping_; });
        if (stopping_) return;
      }
      for (std::size_t t = 0; t < ps_pings_.size(); ++t) {
        try {
          ps_pings_[t]->call(ps::detail::RpcOp::Ping, {}, options_.heartbeat_timeout);
        } catch (const std::exception& e) {
          lose_ps(fmt::format("lost ps task {} ({}): {}", ps_device_string(static_cast<int>(t)), ps_pings_[t]->address(),
                              e.what()));
          ps_pings_[t]->disconnect();
        }
      }
      for (auto& w : workers_) {
        if (!is_up(*w)) continue;
        try {
          w->ping->call(ps::detail::RpcOp::Ping, {}, options_.heartbeat_timeout);
        } catch (const std::exception& e) {
          w->ping->disconnect();
          mark_down(*w, fmt::format("no heartbeat: {}", e.what()), ps::detail::WorkerLoss::NoHeartbeat);
        }
      }
    }
  }

  ParameterServerStrategy& strategy_;
  CoordinatorOptions options_;
  std::uint64_t session_;
  ps::detail::SpareBuffers arg_buffers_;  // closures' argument buffers, kept for the next ones
  std::vector<std::unique_ptr<ps::detail::RpcClient>> ps_pings_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::thread heartbeat_;

  std::mutex mutex_;
  std::condition_variable work_cv_;   // a closure queued, a worker up or down, stopping
  std::condition_variable space_cv_;  // room in the queue
  std::condition_variable idle_cv_;   // nothing outstanding, or an error
  std::deque<ps::detail::Closure> queue_;
  std::size_t outstanding_ = 0;  // queued + running
  std::uint64_t closure_ids_ = 0;
  std::uint64_t dataset_ids_ = 0;
  std::uint64_t retried_ = 0;
  std::vector<DatasetRecipe> datasets_;
  std::exception_ptr error_;  // the first closure error, until rethrown
  std::exception_ptr fatal_;  // a lost ps task
  bool stopping_ = false;
  // Last: its server (whose gauges read the members above) stops first.
  std::unique_ptr<ps::detail::CoordinatorObservability> observe_;
};

DISTRIBUTE_END_NAMESPACE
