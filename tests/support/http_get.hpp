// GET a path from a server of this host (a ps task's status endpoints, a task's /metrics) as
// "<status> <body>", over a real socket.
#pragma once

#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

namespace test_support {

/// `authorization`: the Authorization header to send, if any ("Bearer TOKEN").
inline std::string http_get(int port, const std::string& target, const std::string& authorization = "") {
  namespace http = boost::beast::http;
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (!authorization.empty()) req.set(http::field::authorization, authorization);
  http::write(socket, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  return fmt::format("{} {}", res.result_int(), res.body());
}

}  // namespace test_support
