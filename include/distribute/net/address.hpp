// "host:port" strings as they appear in cluster specs ("127.0.0.1:2222", "worker0:2222",
// "[::1]:2222").
#pragma once

#include <cctype>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/core/host_name.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

struct HostPort {
  std::string host;
  std::string port;  // decimal, 1..65535
};

inline HostPort parse_host_port(std::string_view address) {
  auto quoted = [&] { return quote_input(address); };  // for messages only
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    throw InvalidArgument(fmt::format("address {} is not of the form host:port", quoted()));
  }
  std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  const bool bracketed = host.front() == '[';
  if (bracketed) {
    if (host.size() < 3 || host.back() != ']') {
      throw InvalidArgument(fmt::format("address {} has an unterminated [IPv6] host", quoted()));
    }
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    throw InvalidArgument(fmt::format("address {} has an IPv6 host without brackets; write [host]:port", quoted()));
  }
  // Names are looked up, not checked character by character here (cluster/address.hpp does that
  // for cluster specs); their length and IPv6 literals are checked wherever an address comes from.
  if (host.size() > kMaxHostNameBytes || bracketed) {
    if (auto why = host_problem(host, bracketed); !why.empty()) {
      throw InvalidArgument(host.size() > kMaxHostNameBytes ? fmt::format("address: {}", why)
                                                             : fmt::format("address {}: {}", quoted(), why));
    }
  }
  unsigned long value = 0;
  for (char c : port) {
    if (!std::isdigit(static_cast<unsigned char>(c)) || port.size() > 5) {
      throw InvalidArgument(fmt::format("address {} has an invalid port {}", quoted(), quote_input(port)));
    }
    value = value * 10 + static_cast<unsigned long>(c - '0');
  }
  if (value == 0 || value > 65535) {
    throw InvalidArgument(fmt::format("address {} has port {} outside 1..65535", quoted(), value));
  }
  return HostPort{std::string(host), std::string(port)};
}

}  // namespace net
DISTRIBUTE_END_NAMESPACE
