// A variable no strategy placed: one copy, which any thread may read and update, so every access
// holds the storage's mutex. Updating it from the replicas of a strategy with several replicas is
// refused: each replica would apply its update to the one copy (4 replicas: 4 times).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/context.hpp>
#include <distribute/core/detail/variable_copies.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

template <class T>
class PlainStorage final : public VariableStorage<T> {
 public:
  PlainStorage(VariableSpec spec, T& initial_value)
      : VariableStorage<T>(std::move(spec)),
        devices_{"/job:localhost/replica:0/task:0/device:CPU:0"},
        copies_(make_copies(initial_value, 1, devices_, nullptr)) {}

  const std::vector<T>& copies() const noexcept override { return copies_; }
  const std::vector<std::string>& devices() const noexcept override { return devices_; }
  const std::string& device() const override { return devices_.front(); }
  bool is_distributed() const noexcept override { return false; }
  std::uint64_t strategy_id() const noexcept override { return 0; }

  T read() const override {
    std::lock_guard lock(mutex_);
    return clone_value(copies_.front());
  }

  void apply_to_copies(CopyVisitor<T> fn) override {
    check_not_in_replicas("update");
    std::lock_guard lock(mutex_);
    fn(copies_.front(), 0);
  }

  void scatter(RowOp op, std::span<const std::int64_t> rows, std::span<const std::byte> values) override {
    check_not_in_replicas(scatter_name(op).data());
    std::lock_guard lock(mutex_);
    scatter_into(copies_.front(), op, rows, values);
  }

  void gather(std::span<const std::int64_t> rows, std::span<std::byte> out) const override {
    std::lock_guard lock(mutex_);
    gather_from(copies_.front(), rows, out);
  }

 protected:
  void update_checked(VariableUpdate kind, const T& value) override {
    check_not_in_replicas(update_name(kind));
    std::lock_guard lock(mutex_);
    apply_update(kind, copies_.front(), value);
  }

 private:
  void check_not_in_replicas(const char* what) const {
    const ReplicaContext* ctx = thread_context().replica;
    if (ctx == nullptr || ctx->num_replicas_in_sync() < 2) return;
    throw InvalidArgument(fmt::format(
        "{}: variable '{}' is not distributed (it was created outside a strategy's scope()) and is updated in a replica "
        "of {} with {} replicas, each of which would apply its update to the one copy; create it under "
        "strategy.scope() (reading it is fine)",
        what, this->spec().name, ctx->strategy().name(), ctx->num_replicas_in_sync()));
  }

  std::vector<std::string> devices_;
  std::vector<T> copies_;
  mutable std::mutex mutex_;
};

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE
