// Bootstrapping a second transport (NCCL) through the workers' existing link: the chief makes a
// value (an ncclUniqueId, 128 bytes) and every worker receives its bytes; and a check that every
// worker agrees on a number (its local replica count) before ranks are derived from it. Needs no
// GPU and no NCCL, so it is tested with real communicators on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include <distribute/core/cross_worker.hpp>
#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace collective::detail {

/// Worker 0 calls make() and its result reaches every worker, bytes intact. If make() throws on
/// worker 0, the others throw Unavailable naming `what` (they are told, not left waiting) and
/// worker 0 rethrows its own error.
template <class T, class Make>
T broadcast_from_chief(core::CrossWorkerLink& link, Make&& make, std::string_view what) {
  static_assert(std::is_trivially_copyable_v<T>, "broadcast_from_chief sends the value's bytes");
  // [status byte][T's bytes]; status 1 = made, 0 = the chief failed.
  std::vector<std::byte> message(1 + sizeof(T));
  std::exception_ptr failure;
  if (link.worker_index() == 0) {
    try {
      const T value = make();
      std::memcpy(message.data() + 1, &value, sizeof(T));
      message[0] = std::byte{1};
    } catch (...) {
      failure = std::current_exception();
    }
  }
  link.broadcast(message.data(), message.size(), 0);
  if (failure) std::rethrow_exception(failure);
  if (message[0] != std::byte{1}) {
    throw Unavailable(fmt::format("{}: the chief (worker 0) failed to create it; see the chief's error", what));
  }
  T value;
  std::memcpy(&value, message.data() + 1, sizeof(T));
  return value;
}

/// Throws InvalidArgument on every worker unless all of them pass the same `value`.
inline void check_same_on_every_worker(core::CrossWorkerLink& link, std::int64_t value, std::string_view what) {
  std::vector<std::byte> all;
  std::vector<std::size_t> sizes;
  link.all_gather(&value, sizeof value, all, sizes);
  std::vector<std::int64_t> values(sizes.size());
  if (all.size() != values.size() * sizeof(std::int64_t)) {
    throw InvalidArgument(fmt::format("{}: the workers sent malformed values", what));
  }
  std::memcpy(values.data(), all.data(), all.size());
  for (std::size_t w = 0; w < values.size(); ++w) {
    if (values[w] != values.front()) {
      std::string list;
      for (std::size_t k = 0; k < values.size(); ++k) list += fmt::format("{}worker {}: {}", k ? ", " : "", k, values[k]);
      throw InvalidArgument(fmt::format("{} must be the same on every worker ({})", what, list));
    }
  }
}

/// Throws InvalidArgument on every worker unless all of them pass the same `call` (a description
/// of the collective each is about to issue). NCCL does not compare its callers' arguments: a
/// mismatch there would hang or corrupt, so calls are compared over the link first.
inline void check_same_call_on_every_worker(core::CrossWorkerLink& link, std::string_view call) {
  std::vector<std::byte> all;
  std::vector<std::size_t> sizes;
  link.all_gather(call.data(), call.size(), all, sizes);
  std::vector<std::string_view> calls;
  std::size_t offset = 0;
  for (std::size_t n : sizes) {
    if (offset + n > all.size()) throw InvalidArgument("collective: the workers sent malformed call descriptions");
    calls.emplace_back(reinterpret_cast<const char*>(all.data()) + offset, n);
    offset += n;
  }
  for (std::size_t w = 1; w < calls.size(); ++w) {
    if (calls[w] != calls.front()) {
      throw InvalidArgument(fmt::format("worker 0 called {} but worker {} called {}: every worker must issue the same "
                                        "collectives in the same order",
                                        calls.front(), w, calls[w]));
    }
  }
}

}  // namespace collective::detail
DISTRIBUTE_END_NAMESPACE
