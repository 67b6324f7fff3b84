// Whether an address is this machine's own loopback, IPv4-mapped IPv6 included: what the
// library's servers treat as local (no token needed to listen there, no per-address bound on
// connections from there, the loopback congestion control).
#pragma once

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/address_v6.hpp>

#include <distribute/version.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

inline bool is_loopback(const boost::asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6()).is_loopback();
  }
  return a.is_loopback();
}

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
