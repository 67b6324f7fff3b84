// Where a parameter-server variable's value lives when it is not in this process: the interface a
// Variable talks to, implemented by ps/ (a client of the ps tasks). core/ only knows the interface,
// so the core headers need no networking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <distribute/core/dtype.hpp>
#include <distribute/core/shape.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core {

enum class RemoteUpdate : std::uint8_t { Assign = 0, Add = 1, Sub = 2 };

class RemoteVariableStore {
 public:
  virtual ~RemoteVariableStore() = default;
  /// Creates (or overwrites) variable `key` on ps task `task` with `value`.
  virtual void create(int task, const std::string& key, DType dtype, const Shape& shape,
                      std::span<const std::byte> value) = 0;
  /// Reads the whole value into `out` (exactly the variable's byte size).
  virtual void read(int task, const std::string& key, DType dtype, std::span<std::byte> out) = 0;
  /// Reads rows `rows` (along axis 0, `row_bytes` each) into `out`, in the order given.
  virtual void read_rows(int task, const std::string& key, DType dtype, std::span<const std::int64_t> rows,
                         std::size_t row_bytes, std::span<std::byte> out) = 0;
  /// Assigns, adds or subtracts `value` (the variable's full size).
  virtual void update(int task, const std::string& key, RemoteUpdate kind, DType dtype,
                      std::span<const std::byte> value) = 0;
};

/// A variable's place on a ps task: which store, which task, which key there.
struct RemoteHandle {
  std::shared_ptr<RemoteVariableStore> store;
  int task = 0;
  std::string key;
};

}  // namespace core
DISTRIBUTE_END_NAMESPACE
