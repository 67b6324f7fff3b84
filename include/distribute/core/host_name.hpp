// What every address parser (cluster/address.hpp, net/address.hpp, the Slurm hostlist)
// accepts as a host: a DNS name of at most 253 bytes, or an IPv6 literal that inet_pton accepts
// (with an optional "%zone"). Shared here so that no resolver is more lenient than another.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE

/// The longest host name DNS allows (RFC 1035: 255 bytes on the wire, 253 as text).
inline constexpr std::size_t kMaxHostNameBytes = 253;

/// Letters, digits, '-', '.', '_' (a '_' is not DNS but appears in container and Slurm names).
inline bool is_hostname_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

/// Empty when `host` (an IPv6 literal without brackets when `ipv6`, else a name or IPv4 address)
/// is acceptable; else what is wrong, as a sentence that starts "host 'X' ...".
inline std::string host_problem(std::string_view host, bool ipv6) {
  if (host.empty()) return "the host is empty";
  if (host.size() > kMaxHostNameBytes) {
    // Its first 32 bytes: enough to recognise it, where the whole could be megabytes.
    return fmt::format("host {} is longer than {} bytes", quote_input(host, 32), kMaxHostNameBytes);
  }
  if (ipv6) {
    const auto zone = host.find('%');
    // inet_pton wants a NUL-terminated string; a host is at most 253 bytes.
    const std::string ip(host.substr(0, zone));
    in6_addr out{};
    bool ok = ::inet_pton(AF_INET6, ip.c_str(), &out) == 1;
    if (zone != std::string_view::npos) {
      const auto z = host.substr(zone + 1);
      ok = ok && !z.empty() && std::all_of(z.begin(), z.end(), is_hostname_char);
    }
    if (!ok) return fmt::format("host '{}' is not an IPv6 address", host);
    return {};
  }
  if (auto bad = std::find_if_not(host.begin(), host.end(), is_hostname_char); bad != host.end()) {
    return fmt::format("host '{}' has the invalid character '{}'", host, *bad);
  }
  return {};
}

DISTRIBUTE_END_NAMESPACE
