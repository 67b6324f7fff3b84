// A variable whose value lives on a ps task: every read and update is a call to that task through
// the RemoteVariableStore the placement names (implemented outside core/). This process keeps
// only a value of the variable's dtype and shape. Host memory only: the store moves bytes.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <distribute/core/context.hpp>
#include <distribute/core/host_operands.hpp>
#include <distribute/core/detail/placed_storage.hpp>
#include <distribute/core/remote_store.hpp>
#include <distribute/core/detail/variable_storage.hpp>
#include <distribute/core/memory_space.hpp>
#include <distribute/core/tensor_traits.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace core::detail {

template <class T>
class RemoteStorage final : public PlacedStorage<T> {
  static_assert(memory_space_v<T> == MemorySpace::host, "ps variables hold host memory");
  static_assert(static_cast<int>(RemoteUpdate::Assign) == static_cast<int>(VariableUpdate::Assign) &&
                    static_cast<int>(RemoteUpdate::Add) == static_cast<int>(VariableUpdate::Add) &&
                    static_cast<int>(RemoteUpdate::Sub) == static_cast<int>(VariableUpdate::Sub),
                "RemoteUpdate is VariableUpdate on the wire");

 public:
  /// Creates the value on the placement's ps task. The key gets the variable's name appended
  /// (after the strategy's unique prefix) so that the ps task's messages can name it.
  static std::shared_ptr<RemoteStorage> create(VariableSpec spec, VariablePlacement placement, std::string strategy_name,
                                               T initial_value) {
    placement.remote.key += "/" + spec.name;
    {
      const RemoteHandle& r = placement.remote;
      HostOperands value("Variable");
      value.add(view_of(initial_value), true);
      r.store->create(r.task, r.key, value[0].dtype, value[0].shape, bytes_of(value[0]));
    }
    return std::make_shared<RemoteStorage>(std::move(spec), std::move(placement), std::move(strategy_name),
                                           std::move(initial_value));
  }

  /// A handle to a value that already lives on a ps task; `shape_template` gives dtype and shape.
  RemoteStorage(VariableSpec spec, VariablePlacement placement, std::string strategy_name, T shape_template)
      : PlacedStorage<T>(std::move(spec), std::move(placement), std::move(strategy_name)) {
    shape_template_.push_back(std::move(shape_template));
  }

  const std::vector<T>& copies() const noexcept override { return shape_template_; }
  const RemoteHandle* remote_handle() const noexcept override { return &this->placement().remote; }

  T read() const override {
    const RemoteHandle& r = this->placement().remote;
    RowMajorResult<T> out;
    const DType dtype = this->dtype();
    const Shape shape = this->shape();
    void* p = out.allocate(dtype, shape);
    r.store->read(r.task, r.key, dtype,
                  {static_cast<std::byte*>(p), static_cast<std::size_t>(num_elements(shape)) * size_of(dtype)});
    return out.take();
  }

  /// Reads the value, lets fn change it, writes it back.
  void apply_to_copies(CopyVisitor<T> fn) override {
    T value = read();
    fn(value, 0);
    this->update(VariableUpdate::Assign, value);
  }

 protected:
  void update_checked(VariableUpdate kind, const T& value) override {
    const RemoteHandle& r = this->placement().remote;
    HostOperands v("Variable");
    v.add(view_of(value), true);
    r.store->update(r.task, r.key, static_cast<RemoteUpdate>(kind), v[0].dtype, bytes_of(v[0]));
  }

 private:
  static std::span<const std::byte> bytes_of(const BufferRef& b) {
    return {static_cast<const std::byte*>(b.data), b.bytes()};
  }

  std::vector<T> shape_template_;  // the value itself is on the ps task
};

}  // namespace core::detail
DISTRIBUTE_END_NAMESPACE
