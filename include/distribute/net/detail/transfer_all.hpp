// The completion condition for whole-buffer socket reads and writes.
#pragma once

#include <cstddef>

#include <boost/system/error_code.hpp>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// All of the buffers, handing the kernel as much as it will take per call. Asio's own
/// transfer_all() caps each read_some/write_some at 64 KiB, which costs a 1 MiB tensor 16 system
/// calls and 16 reactor passes.
struct TransferAllUncapped {
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : kMaxPerCall;
  }
  // Linux moves at most about 2 GiB per call anyway.
  static constexpr std::size_t kMaxPerCall = std::size_t{1} << 30;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
