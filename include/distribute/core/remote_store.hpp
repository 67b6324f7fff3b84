// Where a parameter-server variable's value lives when it is not in this process: the interface a
// Variable talks to, implemented by ps/ (a client of the ps tasks). core/ only knows the interface,
// so the core headers need no networking.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <distribute/core/dtype.hpp>
#include <distribute/core/initializer.hpp>
#include <distribute/core/row_updates.hpp>
#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

/// What an update does to a ps variable. The numbering is part of the ps wire format.
enum class RemoteUpdate : std::uint8_t {
  Assign = 0, Add = 1, Sub = 2,  // the whole value (VariableUpdate's numbering)
  ScatterUpdate = 3, ScatterAdd = 4, ScatterSub = 5, ScatterMin = 6, ScatterMax = 7,  // rows: RowOp + 3
  ApplySgd = 8, ApplyMomentum = 9, ApplyAdagrad = 10,  // an optimizer's step, on rows or on the whole value
};
inline constexpr std::uint8_t kNumRemoteUpdates = 11;

constexpr bool is_scatter(RemoteUpdate k) noexcept { return k >= RemoteUpdate::ScatterUpdate && k <= RemoteUpdate::ScatterMax; }
constexpr bool is_optimizer_step(RemoteUpdate k) noexcept {
  return k >= RemoteUpdate::ApplySgd && k <= RemoteUpdate::ApplyAdagrad;
}
constexpr RowOp row_op_of(RemoteUpdate k) noexcept {
  return static_cast<RowOp>(static_cast<std::uint8_t>(k) - static_cast<std::uint8_t>(RemoteUpdate::ScatterUpdate));
}
constexpr RemoteUpdate scatter_update_of(RowOp op) noexcept {
  return static_cast<RemoteUpdate>(static_cast<std::uint8_t>(op) + static_cast<std::uint8_t>(RemoteUpdate::ScatterUpdate));
}

/// An update of some rows of a ps variable (scatter_*, an optimizer's step on a gradient's rows),
/// or an optimizer's step on the whole value (`all_rows`).
struct RowsUpdate {
  RemoteUpdate kind = RemoteUpdate::ScatterAdd;
  DType dtype = DType::F32;
  bool all_rows = false;
  std::span<const std::int64_t> rows = {};  // in range, checked by the caller and again by the ps task
  std::span<const std::byte> values = {};   // rows.size() rows, or the whole value
  std::array<double, 3> params = {};        // an optimizer's hyperparameters (ps/detail/optimizer_rules.hpp)
};

/// One read of rows in a batch (RemoteVariableStore::read_rows_batch).
struct RowsRead {
  int task = 0;
  std::string_view key;
  DType dtype = DType::F32;
  std::span<const std::int64_t> rows;
  std::size_t row_bytes = 0;
  std::span<std::byte> out;
};

/// One update of rows in a batch (RemoteVariableStore::update_rows_batch).
struct RowsWrite {
  int task = 0;
  std::string_view key;
  RowsUpdate update;
};

class RemoteVariableStore {
 public:
  virtual ~RemoteVariableStore() = default;
  /// Creates (or overwrites) variable `key` on ps task `task` with `value`.
  virtual void create(int task, const std::string& key, DType dtype, const Shape& shape,
                      std::span<const std::byte> value) = 0;
  /// Creates (or overwrites) variable `key` on ps task `task`, filled there by `init`.
  virtual void create_initialized(int task, const std::string& key, DType dtype, const Shape& shape,
                                  const Initializer& init) = 0;
  /// Reads the whole value into `out` (exactly the variable's byte size).
  virtual void read(int task, const std::string& key, DType dtype, std::span<std::byte> out) = 0;
  /// Reads rows `rows` (along axis 0, `row_bytes` each) into `out`, in the order given.
  virtual void read_rows(int task, const std::string& key, DType dtype, std::span<const std::int64_t> rows,
                         std::size_t row_bytes, std::span<std::byte> out) = 0;
  /// Assigns, adds or subtracts `value` (the variable's full size).
  virtual void update(int task, const std::string& key, RemoteUpdate kind, DType dtype,
                      std::span<const std::byte> value) = 0;
  /// Applies `u` to the variable's rows on the ps task, atomically with respect to every other
  /// request to that task.
  virtual void update_rows(int task, const std::string& key, const RowsUpdate& u) = 0;

  /// Several reads of rows (a sharded variable's shards), which a store may send to their ps
  /// tasks at once; by default one after the other.
  virtual void read_rows_batch(std::span<const RowsRead> reads) {
    for (const RowsRead& r : reads) read_rows(r.task, std::string(r.key), r.dtype, r.rows, r.row_bytes, r.out);
  }
  /// Several updates of rows, likewise.
  virtual void update_rows_batch(std::span<const RowsWrite> writes) {
    for (const RowsWrite& w : writes) update_rows(w.task, std::string(w.key), w.update);
  }
};

/// A variable's place on a ps task: which store, which task, which key there.
struct RemoteHandle {
  std::shared_ptr<RemoteVariableStore> store;
  int task = 0;
  std::string key;
};

}  // namespace core
DISTRIBUTE_END_NAMESPACE
