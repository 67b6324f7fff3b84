// The client side of the ps tasks' variable service: what a Variable placed on a ps task calls
// (RemoteVariableStore). The coordinator's updates go straight to the ps; a worker running a closure
// records the closure's updates in a transaction instead, reads through it (a closure sees its own
// writes), and commits it at the end, so that the ps applies each closure's updates exactly once
// even when the closure is retried on another worker.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/cluster/cluster_spec.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/error.hpp>
#include <distribute/ps/detail/messages.hpp>
#include <distribute/ps/detail/rpc.hpp>
#include <distribute/ps/detail/spare_buffers.hpp>
#include <distribute/ps/placement.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace ps::detail {

/// dst op= src elementwise, for `dtype` (bytes of equal size, not overlapping). The values in a
/// request need not be aligned for their type, so they are combined in blocks copied into aligned
/// locals: each block is a loop of known length that the compiler vectorises (a variable of 1 MiB
/// takes one pass instead of an element at a time).
inline void apply_update_bytes(DType dtype, core::RemoteUpdate kind, std::span<std::byte> dst, std::span<const std::byte> src) {
  if (kind == core::RemoteUpdate::Assign) {
    if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size());
    return;
  }
  visit_dtype(dtype, [&](auto zero) {
    using E = decltype(zero);
    constexpr std::size_t kBlock = 256 / sizeof(E);
    const std::size_t n = dst.size() / sizeof(E);
    const bool add = kind == core::RemoteUpdate::Add;
    auto combine = [&](std::size_t at, std::size_t count) {
      E a[kBlock], b[kBlock];
      std::memcpy(a, dst.data() + at * sizeof(E), count * sizeof(E));
      std::memcpy(b, src.data() + at * sizeof(E), count * sizeof(E));
      if (count == kBlock) {
        if (add) {
          for (std::size_t j = 0; j < kBlock; ++j) a[j] = static_cast<E>(a[j] + b[j]);
        } else {
          for (std::size_t j = 0; j < kBlock; ++j) a[j] = static_cast<E>(a[j] - b[j]);
        }
      } else {
        for (std::size_t j = 0; j < count; ++j) a[j] = add ? static_cast<E>(a[j] + b[j]) : static_cast<E>(a[j] - b[j]);
      }
      std::memcpy(dst.data() + at * sizeof(E), a, count * sizeof(E));
    };
    std::size_t i = 0;
    for (; i + kBlock <= n; i += kBlock) combine(i, kBlock);
    if (i < n) combine(i, n - i);
  });
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
    for_own_updates(task, key, [&](core::RemoteUpdate kind, std::span<const std::byte> value) {
      apply_update_bytes(dtype, kind, out, value);
    });
  }

  void read_rows(int task, const std::string& key, DType dtype, std::span<const std::int64_t> rows, std::size_t row_bytes,
                 std::span<std::byte> out) override {
    ReadRowsMsg m{key, static_cast<std::uint8_t>(dtype), std::vector<std::int64_t>(rows.begin(), rows.end()), row_bytes};
    auto bytes = call(task, RpcOp::ReadRows, encode_reusing(m));
    if (bytes.size() != out.size()) {
      throw InvalidArgument(fmt::format("ps task {} returned {} bytes of rows of '{}', expected {}", task, bytes.size(), key,
                                        out.size()));
    }
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    for_own_updates(task, key, [&](core::RemoteUpdate kind, std::span<const std::byte> value) {
      for (std::size_t i = 0; i < rows.size(); ++i) {  // row by row (the ps already checked the ids)
        const auto from = static_cast<std::size_t>(rows[i]) * row_bytes;
        apply_update_bytes(dtype, kind, out.subspan(i * row_bytes, row_bytes), value.subspan(from, row_bytes));
      }
    });
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

  /// Sends a finished closure's updates, each ps task's together (moved out of `txn`); a ps that
  /// already has this closure's updates (an earlier attempt got there) ignores them.
  void commit(ClosureTransaction& txn) {
    for (auto& [task, updates] : txn.updates) {
      CommitMsg m{txn.session, txn.closure, std::move(updates)};
      call(task, RpcOp::Commit, encode_reusing(m));
      for (auto& u : m.updates) spare_values_.give(std::move(u.bytes));
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
    if (task < 0 || task >= num_ps()) {
      throw InvalidArgument(fmt::format("ps task {} does not exist (the cluster has {} ps tasks)", task, num_ps()));
    }
    std::vector<std::byte> out;
    guarded(task, [&] { out = clients_[static_cast<std::size_t>(task)]->call(op, payload, timeout); });
    return out;
  }

  /// Like call(), handing the reply to `take` where it lies.
  template <class Take>
  void call_into(int task, RpcOp op, std::span<const std::byte> payload, Take&& take) {
    if (task < 0 || task >= num_ps()) {
      throw InvalidArgument(fmt::format("ps task {} does not exist (the cluster has {} ps tasks)", task, num_ps()));
    }
    guarded(task, [&] {
      clients_[static_cast<std::size_t>(task)]->call_into(static_cast<std::uint64_t>(op), payload, std::nullopt, take);
    });
  }

 private:
  /// Calls f(kind, value) for each update the closure running on this thread made to `key` on
  /// `task`, in order: a closure reads its own writes.
  template <class F>
  static void for_own_updates(int task, const std::string& key, F&& f) {
    ClosureTransaction* txn = current_transaction();
    if (!txn) return;
    auto it = txn->updates.find(task);
    if (it == txn->updates.end()) return;
    for (const auto& u : it->second) {
      if (u.key == key) f(static_cast<core::RemoteUpdate>(u.kind), std::as_bytes(std::span(u.bytes)));
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
