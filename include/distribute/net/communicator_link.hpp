// The TCP transport under the strategies' cross-worker link interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/dtype.hpp>
#include <distribute/core/reduce_op.hpp>
#include <distribute/net/communicator.hpp>
#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// A Communicator seen as the cross-worker link of core/cross_worker.hpp: what MultiWorkerMirroredStrategy
/// collects over when its workers talk TCP (and shared memory between workers of one host).
class CommunicatorLink final : public core::CrossWorkerLink {
 public:
  explicit CommunicatorLink(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int num_workers() const noexcept override { return comm_->size(); }
  int worker_index() const noexcept override { return comm_->rank(); }
  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op, std::uint32_t shapes = 0) override {
    comm_->all_reduce(data, count, dtype, op, shapes);
  }
  void all_gather(const void* data, std::size_t bytes, std::vector<std::byte>& out,
                  std::vector<std::size_t>& sizes) override {
    comm_->all_gather(data, bytes, out, sizes);
  }
  void broadcast(void* data, std::size_t bytes, int root) override { comm_->broadcast(data, bytes, root); }
  void reduce_scatter(void* data, std::span<const std::size_t> counts, DType dtype, ReduceOp op,
                      std::uint32_t shapes = 0) override {
    comm_->reduce_scatter(data, counts, dtype, op, shapes);
  }
  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, void* recv,
                  std::span<const std::size_t> recv_bytes) override {
    comm_->all_to_all(send, send_bytes, recv, recv_bytes);
  }
  void barrier() override { comm_->barrier(); }
  void close() noexcept override { comm_.reset(); }  // ~Communicator says goodbye
  std::optional<std::string> failure() const override { return comm_ ? comm_->failure() : std::nullopt; }
  Communicator& communicator() noexcept { return *comm_; }

 private:
  std::unique_ptr<Communicator> comm_;
};
}  // namespace net
DISTRIBUTE_END_NAMESPACE
