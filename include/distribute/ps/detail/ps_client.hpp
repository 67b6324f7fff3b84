// The client side of the ps tasks' variable service: what a Variable placed on a ps task calls
// (RemoteVariableStore). The coordinator's updates go straight to the ps; a worker running a closure
// records the closure's updates in a transaction instead, reads through it (a closure sees its own
// writes), and commits it at the end, so that the ps applies each closure's updates exactly once
// even when the closure is retried on another worker.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/row_updates.hpp>
#include <distribute/ps/detail/messages.hpp>
#include <distribute/ps/detail/optimizer_rules.hpp>
#include <distribute/ps/detail/rpc.hpp>
#include <distribute/ps/detail/spare_buffers.hpp>
#include <distribute/ps/placement.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

/// dst op= src over a whole value (assign, assign_add, assign_sub), for `dtype`: the row kernel over
/// every element (core/row_updates.hpp), at any alignment.
inline void apply_update_bytes(DType dtype, core::RemoteUpdate kind, std::span<std::byte> dst, std::span<const std::byte> src) {
  const core::RowOp op = kind == core::RemoteUpdate::Add   ? core::RowOp::Add
                         : kind == core::RemoteUpdate::Sub ? core::RowOp::Sub
                                                           : core::RowOp::Update;
  core::combine_bytes(dtype, op, dst.data(), src.data(), std::min(dst.size(), src.size()) / size_of(dtype));
}

/// The updates a closure made so far, per ps task, in order.
struct ClosureTransaction {
  std::uint64_t session = 0;
  std::uint64_t closure = 0;
  std::map<int, std::vector<UpdateVarMsg>> updates;
};

/// The transaction of the closure running on this thread (workers only), else nullptr.
inline ClosureTransaction*& current_transaction() {
  thread_local ClosureTransaction* txn = nullptr;
  return txn;
}

inline std::span<const std::byte> bytes_of_rows(std::span<const std::int64_t> rows) noexcept { return std::as_bytes(rows); }

class PsClientStore final : public core::RemoteVariableStore {
 public:
  PsClientStore(const ClusterSpec& spec, RpcOptions options) {
    const int n = spec.num_tasks("ps");
    for (int t = 0; t < n; ++t) {
      clients_.push_back(std::make_unique<RpcClient>(spec.task_address("ps", t), ps_device_string(t), options));
    }
  }

  int num_ps() const noexcept { return static_cast<int>(clients_.size()); }

  /// Waits until every ps task answers (they may still be starting), at most `timeout` in all.
  void connect_all(std::chrono::milliseconds timeout) {
    for (int t = 0; t < num_ps(); ++t) {
      guarded(t, [&] { clients_[static_cast<std::size_t>(t)]->connect(timeout); });
    }
  }

  void create(int task, const std::string& key, DType dtype, const Shape& shape, std::span<const std::byte> value) override {
    CreateVarMsg m{key, static_cast<std::uint8_t>(dtype), shape, std::string(as_chars(value))};
    call(task, RpcOp::CreateVar, encode_reusing(m));
  }

  void create_initialized(int task, const std::string& key, DType dtype, const Shape& shape,
                          const Initializer& init) override {
    CreateInitializedMsg m{key, static_cast<std::uint8_t>(dtype), shape, static_cast<std::uint8_t>(init.kind()),
                           init.a(), init.b(), init.seed(), init.offset()};
    call(task, RpcOp::CreateInitialized, encode_reusing(m));
  }

  void read(int task, const std::string& key, DType dtype, std::span<std::byte> out) override {
    std::size_t got = 0;
    call_into(task, RpcOp::ReadVar, encode_reusing(ReadVarMsg{key, static_cast<std::uint8_t>(dtype), out.size()}),
              [&](std::span<const std::byte> bytes) {
                got = bytes.size();
                if (got == out.size() && got > 0) std::memcpy(out.data(), bytes.data(), got);  // straight from the reply
              });
    if (got != out.size()) {
      throw InvalidArgument(fmt::format("ps task {} returned {} bytes for variable '{}', expected {}", task, got, key,
                                        out.size()));
    }
    apply_own_updates_to_whole(task, key, dtype, out);
  }

  void read_rows(int task, const std::string& key, DType dtype, std::span<const std::int64_t> rows, std::size_t row_bytes,
                 std::span<std::byte> out) override {
    const core::RowsRead r{task, key, dtype, rows, row_bytes, out};
    read_rows_batch({&r, 1});
  }

  /// Each read goes to its ps task at once, the reads of different tasks in flight together; reads
  /// of one task one after the other.
  void read_rows_batch(std::span<const core::RowsRead> reads) override {
    in_lanes(reads, [&](const core::RowsRead& r, std::size_t slot) {
      ReadRowsMsg m{std::string(r.key), static_cast<std::uint8_t>(r.dtype),
                    std::vector<std::int64_t>(r.rows.begin(), r.rows.end()), r.row_bytes};
      return encode_into_slot(m, slot);
    }, [&](const core::RowsRead& r, std::span<const std::byte> bytes) {
      if (bytes.size() != r.out.size()) {
        throw InvalidArgument(fmt::format("ps task {} returned {} bytes of rows of '{}', expected {}", r.task, bytes.size(),
                                          r.key, r.out.size()));
      }
      if (!bytes.empty()) std::memcpy(r.out.data(), bytes.data(), bytes.size());
    }, RpcOp::ReadRows);
    for (const core::RowsRead& r : reads) apply_own_updates_to_rows(r);
  }

  void update(int task, const std::string& key, core::RemoteUpdate kind, DType dtype, std::span<const std::byte> value) override {
    if (ClosureTransaction* txn = current_transaction()) {
      std::string bytes = spare_values_.take(value.size());
      bytes.assign(as_chars(value));
      txn->updates[task].push_back(UpdateVarMsg{key, static_cast<std::uint8_t>(kind), static_cast<std::uint8_t>(dtype),
                                                std::move(bytes)});
      return;
    }
    // Sent at once: the value is encoded from where it lies.
    const UpdateVarView m{key, static_cast<std::uint8_t>(kind), static_cast<std::uint8_t>(dtype), WireBytes{value}};
    call(task, RpcOp::UpdateVar, encode_reusing(m));
  }

  void update_rows(int task, const std::string& key, const core::RowsUpdate& u) override {
    const core::RowsWrite w{task, key, u};
    update_rows_batch({&w, 1});
  }

  /// Inside a closure the updates join its transaction (committed once, with its other updates);
  /// else each goes to its ps task at once, different tasks' together.
  void update_rows_batch(std::span<const core::RowsWrite> writes) override {
    if (ClosureTransaction* txn = current_transaction()) {
      for (const core::RowsWrite& w : writes) {
        std::string bytes = spare_values_.take(w.update.values.size());
        bytes.assign(as_chars(w.update.values));
        txn->updates[w.task].push_back(UpdateVarMsg{std::string(w.key), static_cast<std::uint8_t>(w.update.kind),
                                                    static_cast<std::uint8_t>(w.update.dtype), std::move(bytes),
                                                    std::string(as_chars(bytes_of_rows(w.update.rows))), w.update.params,
                                                    static_cast<std::uint8_t>(w.update.all_rows)});
      }
      return;
    }
    in_lanes(writes, [&](const core::RowsWrite& w, std::size_t slot) {
      const UpdateVarView m{std::string(w.key),
                            static_cast<std::uint8_t>(w.update.kind),
                            static_cast<std::uint8_t>(w.update.dtype),
                            WireBytes{w.update.values},
                            WireBytes{bytes_of_rows(w.update.rows)},
                            w.update.params,
                            static_cast<std::uint8_t>(w.update.all_rows)};
      return encode_into_slot(m, slot);
    }, [](const core::RowsWrite&, std::span<const std::byte>) {}, RpcOp::UpdateVar);
  }

  /// Sends a finished closure's updates, each ps task's together (moved out of `txn`), to every
  /// task at once; a ps that already has this closure's updates (an earlier attempt got there)
  /// ignores them.
  void commit(ClosureTransaction& txn) {
    struct Commit {
      int task;
      CommitMsg msg;
    };
    std::vector<Commit> commits;
    for (auto& [task, updates] : txn.updates) commits.push_back({task, CommitMsg{txn.session, txn.closure, std::move(updates)}});
    in_lanes(std::span<const Commit>(commits), [&](const Commit& c, std::size_t slot) { return encode_into_slot(c.msg, slot); },
             [](const Commit&, std::span<const std::byte>) {}, RpcOp::Commit);
    for (auto& c : commits) {
      for (auto& u : c.msg.updates) spare_values_.give(std::move(u.bytes));
    }
  }

  /// Asks ps task `task` whether it is alive; ConnectionLost/PeerFailure when not.
  PingReply ping(int task, std::chrono::milliseconds timeout) {
    auto bytes = call(task, RpcOp::Ping, {}, timeout);
    return decode_message<PingReply>(bytes, "ping reply");
  }

  /// Asks every ps task to stop serving (best effort: a dead one is skipped).
  void stop_all() {
    for (int t = 0; t < num_ps(); ++t) {
      try {
        clients_[static_cast<std::size_t>(t)]->call(RpcOp::Stop, {}, std::chrono::milliseconds(5000));
      } catch (const std::exception&) {
      }
    }
  }

  /// The ps side of an error: a lost connection names the ps task.
  std::vector<std::byte> call(int task, RpcOp op, std::span<const std::byte> payload,
                              std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    check_task(task);
    std::vector<std::byte> out;
    guarded(task, [&] { out = clients_[static_cast<std::size_t>(task)]->call(op, payload, timeout); });
    return out;
  }

  /// Like call(), handing the reply to `take` where it lies.
  template <class Take>
  void call_into(int task, RpcOp op, std::span<const std::byte> payload, Take&& take) {
    check_task(task);
    guarded(task, [&] {
      clients_[static_cast<std::size_t>(task)]->call_into(static_cast<std::uint64_t>(op), payload, std::nullopt, take);
    });
  }

 private:
  void check_task(int task) const {
    if (task < 0 || task >= num_ps()) {
      throw InvalidArgument(fmt::format("ps task {} does not exist (the cluster has {} ps tasks)", task, num_ps()));
    }
  }

  // Sends `items` (each names its .task), those of different tasks in flight together: round k
  // sends the k-th item of each task and then takes their replies (one call at a time per client).
  // encode(item, slot) gives the request's bytes, kept in slot `slot` until its reply; take(item,
  // reply). Every call started is finished before an error propagates; the first error wins.
  template <class Item, class Encode, class Take>
  void in_lanes(std::span<const Item> items, Encode&& encode, Take&& take, RpcOp op) {
    for (const Item& item : items) check_task(item.task);
    std::vector<std::vector<const Item*>> lanes(clients_.size());
    std::size_t rounds = 0;
    for (const Item& item : items) {
      auto& lane = lanes[static_cast<std::size_t>(item.task)];
      lane.push_back(&item);
      rounds = std::max(rounds, lane.size());
    }
    std::exception_ptr error;
    for (std::size_t k = 0; k < rounds && !error; ++k) {
      std::vector<std::pair<const Item*, RpcClient::PendingCall>> pending;
      for (std::size_t t = 0; t < lanes.size() && !error; ++t) {
        if (k >= lanes[t].size()) continue;
        const Item* item = lanes[t][k];
        try {
          guarded(item->task, [&] {
            pending.emplace_back(item, clients_[t]->start_call(static_cast<std::uint64_t>(op), encode(*item, pending.size()),
                                                               std::nullopt));
          });
        } catch (...) {
          error = std::current_exception();
        }
      }
      for (auto& p : pending) {
        const Item* item = p.first;
        RpcClient::PendingCall& call = p.second;
        try {
          guarded(item->task, [&] {
            clients_[static_cast<std::size_t>(item->task)]->finish_call(call, [&](std::span<const std::byte> reply) {
              if (!error) take(*item, reply);
            });
          });
        } catch (...) {
          if (!error) error = std::current_exception();
        }
      }
    }
    if (error) std::rethrow_exception(error);
  }

  // A closure reads its own writes: the updates its transaction holds for `key` on `task`, applied
  // in order to what the ps task returned. An optimizer's step cannot be replayed here (it needs
  // the slot), so reading a variable it updated earlier in the same closure is an error.
  static const std::vector<UpdateVarMsg>* own_updates(int task) {
    ClosureTransaction* txn = current_transaction();
    if (!txn) return nullptr;
    auto it = txn->updates.find(task);
    return it == txn->updates.end() ? nullptr : &it->second;
  }

  static void refuse_after_step(const UpdateVarMsg& u, std::string_view key) {
    const auto kind = static_cast<core::RemoteUpdate>(u.kind);
    if (!core::is_optimizer_step(kind)) return;
    const bool same = u.key == key;
    const bool slot = key.size() > u.key.size() && key.substr(0, u.key.size()) == u.key && key[u.key.size()] == '/';
    if (same || slot) {
      // The key is the strategy's prefix, '/', the variable's name.
      const auto name = key.substr(key.find('/') == std::string_view::npos ? 0 : key.find('/') + 1);
      throw InvalidArgument(fmt::format("variable '{}' is read in the closure that applied {} to it: the step is applied "
                                        "on the ps task when the closure commits; read it before applying the "
                                        "gradients, or in a later closure",
                                        name, optimizer_name(kind)));
    }
  }

  void apply_own_updates_to_whole(int task, const std::string& key, DType dtype, std::span<std::byte> out) const {
    const auto* updates = own_updates(task);
    if (!updates) return;
    for (const auto& u : *updates) {
      refuse_after_step(u, key);
      if (u.key != key) continue;
      const auto kind = static_cast<core::RemoteUpdate>(u.kind);
      const auto value = std::as_bytes(std::span(u.bytes));
      if (core::is_scatter(kind)) {
        const auto rows = std::as_bytes(std::span(u.rows));
        const std::size_t n = rows.size() / sizeof(std::int64_t);
        const std::size_t row_bytes = n ? value.size() / n : 0;
        core::scatter_rows(dtype, core::row_op_of(kind), out, row_bytes, rows, value);
      } else {
        apply_update_bytes(dtype, kind, out, value);
      }
    }
  }

  void apply_own_updates_to_rows(const core::RowsRead& r) const {
    const auto* updates = own_updates(r.task);
    if (!updates) return;
    std::unordered_multimap<std::int64_t, std::size_t> positions;  // a read row's positions in `out`, built once
    for (const auto& u : *updates) {
      refuse_after_step(u, r.key);
      if (u.key != r.key) continue;
      const auto kind = static_cast<core::RemoteUpdate>(u.kind);
      const auto value = std::as_bytes(std::span(u.bytes));
      if (!core::is_scatter(kind)) {  // the whole value: each read row its row of it
        for (std::size_t i = 0; i < r.rows.size(); ++i) {
          const auto from = static_cast<std::size_t>(r.rows[i]) * r.row_bytes;
          apply_update_bytes(r.dtype, kind, r.out.subspan(i * r.row_bytes, r.row_bytes), value.subspan(from, r.row_bytes));
        }
        continue;
      }
      if (positions.empty()) {
        for (std::size_t i = 0; i < r.rows.size(); ++i) positions.emplace(r.rows[i], i);
      }
      const auto rows = std::as_bytes(std::span(u.rows));
      const std::size_t width = r.row_bytes / size_of(r.dtype);
      for (std::size_t j = 0; j < rows.size() / sizeof(std::int64_t); ++j) {
        const auto [first, last] = positions.equal_range(core::row_at(rows, j));
        for (auto it = first; it != last; ++it) {
          core::combine_bytes(r.dtype, core::row_op_of(kind), r.out.data() + it->second * r.row_bytes,
                              value.data() + j * r.row_bytes, width);
        }
      }
    }
  }

  template <class F>
  void guarded(int task, F&& f) {
    try {
      f();
    } catch (const ConnectionLost& e) {
      throw PeerFailure(fmt::format("lost ps task {}: {}", ps_device_string(task), e.what()));
    } catch (const RemoteError& e) {
      throw_as_kind(e.kind(), e.what());
    }
  }

  std::vector<std::unique_ptr<RpcClient>> clients_;
  // The value buffers of committed updates, kept for the next closures' updates.
  SpareBuffers spare_values_;
};

}  // namespace ps::detail
DISTRIBUTE_END_NAMESPACE
