// Shared by net/ and ps/ (internal use): the server side of the transport's request/response
// protocol (rpc_client.hpp). Connections are accepted by the transport's listener, authenticated by
// its handshake (service clients only), then read and written by its connection layer on one
// network thread: no thread per connection. Quick requests are answered on that thread; those that
// may take long (a worker's closures) run on a few handler threads. The same port answers plain
// HTTP GETs (/healthz, /metrics) through Boost.Beast, told apart by their first bytes.
//
// What a peer can cost is bounded: strangers as the listener and handshake bound them (a few
// connections in their handshake, a few KiB each, one deadline); an authenticated client's request
// grows its buffer as bytes arrive, and a request whose bytes stop coming for read_timeout is
// dropped with its connection; a client silent past heartbeat_timeout is dropped too.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <distribute/core/error.hpp>
#include <distribute/net/detail/auth.hpp>
#include <distribute/net/detail/connection.hpp>
#include <distribute/net/detail/event_loop.hpp>
#include <distribute/net/detail/handler_pool.hpp>
#include <distribute/net/detail/handshake.hpp>
#include <distribute/net/detail/listener.hpp>
#include <distribute/net/options.hpp>
#include <distribute/net/refusal_log.hpp>
#include <distribute/net/rpc_errors.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net {

/// Accepts connections on `address` and answers each request with `handler(op, payload)`; an
/// exception from the handler becomes an error reply. HTTP GETs get `http(target)`.
class RpcServer final : private detail::ConnectionOwner {
 public:
  using Handler = std::function<std::vector<std::byte>(std::uint64_t op, std::span<const std::byte> payload)>;
  /// {status, content type, body} for an HTTP GET.
  struct HttpReply {
    unsigned status = 404;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body = "not found\n";
  };
  using HttpHandler = std::function<HttpReply(std::string_view target)>;

  /// `takes_long(op)`: whether requests of `op` run on the handler threads (default: none do).
  RpcServer(const std::string& address, std::string name, RpcOptions options, Handler handler, HttpHandler http,
            std::function<bool(std::uint64_t op)> takes_long = {})
      : name_(std::move(name)), options_(std::move(options)), token_(detail::effective_cluster_token(options_.cluster_token)),
        handler_(std::move(handler)), http_(std::move(http)), takes_long_(std::move(takes_long)),
        handshaker_(token_, options_.handshake_timeout), pool_(options_.handler_threads),
        listener_(loop_.io(), detail::Listener::Options{name_, "ds::Server", options_.loopback_congestion_control,
                                                        options_.max_pending_connections,
                                                        [this](const std::string& l) { log_limited(l); },
                                                        [this](const std::string& l) { log(l); }}) {
    listener_.listen(address, token_.has_value(), detail::insecure_chosen(options_.insecure));
    auto terms = std::make_shared<detail::AcceptorTerms>();
    terms->me = name_;
    terms->role = "server";
    terms->greet = [this](detail::Handshake&, const detail::Hello& hello) -> std::string {
      if (!hello.service) return "it is a rank of a communicator, not a client of this service";
      if (hello.has_token != token_.has_value()) {
        return token_ ? std::string("the peer did not present the cluster token")
                      : std::string("the peer presented a cluster token, and this server has none");
      }
      return {};
    };
    terms->claim = [](const detail::Hello&) { return std::string(); };
    terms->unclaim = [](const detail::Hello&) {};
    terms->log = [this](const std::string& l) { log_limited(l); };
    terms_ = std::move(terms);
    loop_.start([this](const std::exception& e) { log(fmt::format("{}: internal error in the network thread: {}", name_, e.what())); });
    loop_.post([this] {
      listener_.start([this](const detail::HandshakePtr& h) { return on_accepted(h); });
      tick();
    });
  }

  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;
  ~RpcServer() { stop(); }

  std::uint16_t port() const noexcept { return listener_.port(); }
  /// The bound in effect on connections waiting in their handshake.
  std::size_t max_pending_connections() const noexcept { return listener_.max_pending_connections(); }

  /// Stops accepting, says goodbye to every client, waits for the requests being handled and
  /// closes the connections. Idempotent.
  void stop() {
    if (stopped_.exchange(true)) return;
    {
      std::unique_lock lk(mu_);
      stopping_ = true;
      for (auto& [id, c] : clients_) {
        if (c->conn.is_open_locked()) c->conn.enqueue_control_locked(FrameType::Goodbye, 0, {}, true);
      }
      // A connection ends its read without a notification (connection.hpp): poll until the grace ends.
      const auto all_ended = [&] {
        return std::all_of(clients_.begin(), clients_.end(), [](const auto& e) { return e.second->conn.read_ended(); });
      };
      const auto grace_end = std::chrono::steady_clock::now() + kGoodbyeGrace;
      while (!all_ended() && std::chrono::steady_clock::now() < grace_end) {
        mu_.wait_for(lk, std::chrono::milliseconds(2), all_ended);
      }
    }
    pool_.stop();  // a closure being run finishes first
    std::promise<void> closed;
    loop_.post([this, &closed] {
      listener_.close();
      if (timer_) timer_->cancel();
      std::lock_guard lk(mu_);
      for (auto& [id, c] : clients_) c->conn.close_locked();
      closed.set_value();
    });
    closed.get_future().wait_for(kGoodbyeGrace);
    loop_.stop();
  }

 private:
  struct Client {
    Client(ConnectionOwner& owner, detail::NotifyingMutex& mu, boost::asio::io_context& io, int id, const std::string& remote,
           std::size_t max_frame_bytes)
        : conn(owner, mu, io, id, remote, remote, max_frame_bytes) {}
    detail::Connection conn;
    // The request being received or handled: the buffer keeps its largest size, so a request of
    // a size seen before costs no allocation and no zero-filling.
    std::vector<std::byte> request;
    bool receiving = false;  // a request's bytes are arriving
    bool busy = false;       // a request is being handled: its bytes are in use
    bool dead = false;       // its connection is closed or closing
    detail::Clock::time_point last_request = detail::Clock::now();
  };
  using ClientPtr = std::shared_ptr<Client>;

  // How long stop() waits for clients to answer its goodbye, and for the loop to close them.
  static constexpr std::chrono::milliseconds kGoodbyeGrace{1000};
  // A request buffer larger than this is given back once the request is answered.
  static constexpr std::size_t kKeptRequestBytes = std::size_t{64} << 20;

  void log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      std::fputs((line + "\n").c_str(), stderr);
    }
  }
  // Lines a stranger can cause: a few a second at most.
  void log_limited(const std::string& line) {
    if (std::string admitted = limiter_.admit(line); !admitted.empty()) log(admitted);
  }

  // ---- accepting ------------------------------------------------------------------------------

  // The first four bytes tell an HTTP GET from a hello; both run under the handshake's deadline.
  bool on_accepted(const detail::HandshakePtr& h) {
    if (stopped_) return false;
    handshaker_.arm_deadline(h);
    boost::asio::async_read(h->socket, boost::asio::buffer(h->header.data(), 4),
                            [this, h](const boost::system::error_code& ec, std::size_t) {
                              if (ec) return close_unwelcomed(*h);
                              if (http_ && std::memcmp(h->header.data(), "GET ", 4) == 0) return serve_http(h);
                              handshaker_.accept(h, terms_, [this](const detail::HandshakePtr& done) { welcome(done); }, 4);
                            });
    return true;
  }

  // A connection that never became a client (a stranger gone, an HTTP request answered).
  static void close_unwelcomed(detail::Handshake& h) {
    h.finished = true;
    h.timer.cancel();
    h.pending.reset();
    boost::system::error_code ignored;
    h.socket.shutdown(detail::tcp::socket::shutdown_both, ignored);
    h.socket.close(ignored);
  }

  void welcome(const detail::HandshakePtr& h) {
    boost::system::error_code ignored;
    h->socket.set_option(detail::tcp::no_delay(true), ignored);
    std::unique_lock lk(mu_);
    if (stopping_) {
      h->socket.close(ignored);
      return;
    }
    const int id = next_id_++;
    auto c = std::make_shared<Client>(static_cast<ConnectionOwner&>(*this), mu_, loop_.io(), id, h->remote,
                                      options_.max_frame_bytes);
    c->conn.open_locked(std::move(h->socket), h->written);
    clients_.emplace(id, c);
    lk.unlock();
    c->conn.start_reading();
  }

  void serve_http(const detail::HandshakePtr& h) {
    namespace http = boost::beast::http;
    struct Exchange {
      boost::beast::flat_buffer buffer{8 * 1024};  // a GET of a status page: headers only
      http::request_parser<http::string_body> parser;
      http::response<http::string_body> response;
    };
    auto x = std::make_shared<Exchange>();
    auto space = x->buffer.prepare(4);
    std::memcpy(space.data(), h->header.data(), 4);
    x->buffer.commit(4);
    x->parser.body_limit(0);
    x->parser.header_limit(8 * 1024);
    http::async_read(h->socket, x->buffer, x->parser, [this, h, x](const boost::system::error_code& ec, std::size_t) {
      if (ec) return close_unwelcomed(*h);
      const auto& req = x->parser.get();
      const std::string_view target(req.target().data(), req.target().size());
      const auto authorization = req[http::field::authorization];
      HttpReply r;
      if (!detail::scrape_allowed(target, std::string_view(authorization.data(), authorization.size()), token_)) {
        r = HttpReply{401, "text/plain; charset=utf-8", std::string(detail::kScrapeRefused)};
      } else {
        try {
          r = http_(target);
        } catch (const std::exception& e) {
          r = HttpReply{500, "text/plain; charset=utf-8", fmt::format("{}\n", e.what())};
        }
      }
      x->response = http::response<http::string_body>{static_cast<http::status>(r.status), req.version()};
      if (r.status == 401) x->response.set(http::field::www_authenticate, "Bearer realm=\"distribute\"");
      x->response.set(http::field::content_type, r.content_type);
      x->response.set(http::field::server, "distribute");
      x->response.keep_alive(false);
      x->response.body() = std::move(r.body);
      x->response.prepare_payload();
      http::async_write(h->socket, x->response, [h, x](const boost::system::error_code&, std::size_t) { close_unwelcomed(*h); });
    });
  }

  // ---- requests -------------------------------------------------------------------------------

  ClientPtr client_locked(const detail::Connection& c) const {
    const auto it = clients_.find(c.id());
    return it == clients_.end() ? nullptr : it->second;
  }

  detail::FrameIntake intake(const detail::Connection&, FrameType type) const noexcept override {
    switch (type) {
      case FrameType::Heartbeat: return detail::FrameIntake::Heartbeat;
      case FrameType::Goodbye: return detail::FrameIntake::Goodbye;
      case FrameType::Request: return detail::FrameIntake::Bulk;
      default: return detail::FrameIntake::Refuse;
    }
  }

  void on_goodbye(detail::Connection& c) override {
    std::lock_guard lk(mu_);
    c.half_close_when_written_locked();
  }

  void on_control(detail::Connection&, const FrameHeader& h, std::span<const std::byte>) override {
    throw FrameError(fmt::format("unexpected {} frame", to_string(h.type)));
  }

  std::byte* begin_bulk(detail::Connection& c, const FrameHeader&) override {
    std::lock_guard lk(mu_);
    const ClientPtr client = client_locked(c);
    if (client->busy) throw FrameError("a request arrived before the reply to the previous one");
    client->receiving = true;
    return nullptr;  // the request buffer grows as bytes arrive (grow_bulk)
  }

  std::byte* grow_bulk(detail::Connection& c, std::size_t bytes) override {
    ClientPtr client;
    {
      std::lock_guard lk(mu_);
      client = client_locked(c);
    }
    // Only this thread touches the buffer while a request's bytes arrive.
    if (client->request.size() < bytes) {
      try {
        client->request.resize(bytes);
      } catch (const std::bad_alloc&) {
        throw FrameError(fmt::format("cannot buffer a request of {} bytes: out of memory", bytes));
      }
    }
    return client->request.data();
  }

  void end_bulk(detail::Connection& c) override {
    const FrameHeader h = c.current();
    ClientPtr client;
    {
      std::lock_guard lk(mu_);
      client = client_locked(c);
      client->receiving = false;
      client->busy = true;
      client->last_request = detail::Clock::now();
    }
    if (takes_long_ && takes_long_(h.tag)) {
      if (pool_.post([this, client, h] { answer(*client, h); })) return;
      std::unique_lock lk(mu_);
      reply_locked(lk, *client, h.seq, 1, "Unavailable|no thread could be started to handle the request");
      return;
    }
    answer(*client, h);
  }

  // Runs the handler on the request's bytes and sends its reply.
  void answer(Client& client, const FrameHeader& h) {
    std::vector<std::byte> out;
    std::uint64_t status = 0;
    try {
      out = handler_(h.tag, std::span<const std::byte>(client.request.data(), static_cast<std::size_t>(h.length)));
    } catch (const std::exception& e) {
      status = 1;
      const std::string text = std::string(error_kind_name(error_kind(e))) + "|" + e.what();
      out.assign(reinterpret_cast<const std::byte*>(text.data()), reinterpret_cast<const std::byte*>(text.data()) + text.size());
    }
    if (client.request.size() > kKeptRequestBytes) std::vector<std::byte>().swap(client.request);
    std::unique_lock lk(mu_);
    reply_locked(lk, client, h.seq, status, std::move(out));
  }

  void reply_locked(std::unique_lock<detail::NotifyingMutex>& lk, Client& client, std::uint64_t seq, std::uint64_t status,
                    std::vector<std::byte> payload) {
    client.busy = false;
    if (!client.conn.is_open_locked()) return;
    detail::OutFrame f;
    f.set_header(FrameHeader{FrameType::Reply, payload.size(), seq, status});
    f.owned = std::move(payload);
    f.payload = f.owned.data();
    f.size = f.owned.size();
    client.conn.send_now_or_enqueue(lk, std::move(f));
  }
  void reply_locked(std::unique_lock<detail::NotifyingMutex>& lk, Client& client, std::uint64_t seq, std::uint64_t status,
                    std::string_view text) {
    reply_locked(lk, client, seq, status, std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                                                  reinterpret_cast<const std::byte*>(text.data()) + text.size()));
  }

  void on_read_failed(detail::Connection& c, const std::string& reason, bool malformed) override {
    std::lock_guard lk(mu_);
    const ClientPtr client = client_locked(c);
    if (malformed && !client->dead) {
      log_limited(fmt::format("{}: closing the connection from {}: malformed frame: {}", name_, c.name(), reason));
    }
    drop_locked(*client);
  }

  detail::Failure loss_locked(const detail::Connection& c, const std::string& reason) const override {
    return detail::Failure{detail::FailureKind::Peer, fmt::format("lost the client at {}: {}", c.name(), reason)};
  }
  detail::Failure closed_failure_locked(const detail::Connection& c) const override {
    return detail::Failure{detail::FailureKind::Peer, fmt::format("the connection from {} is closed", c.name())};
  }
  void on_write_failed_locked(detail::Connection& c, const std::string&) override {
    if (const ClientPtr client = client_locked(c)) drop_locked(*client);
  }
  bool wake_on_progress_locked() const noexcept override { return false; }

  // Closes a client's connection (on the loop's thread); it is forgotten once nothing refers to it.
  void drop_locked(Client& client) {
    client.dead = true;
    client.conn.state = detail::Connection::State::Failed;
    client.conn.close_locked();
    client.conn.fail_queued_locked(closed_failure_locked(client.conn));
    mu_.notify_all_locked();
  }

  // ---- deadlines and heartbeats -----------------------------------------------------------------

  std::chrono::milliseconds tick_period() const {
    auto period = options_.heartbeat_interval / 2;
    period = std::min(period, options_.read_timeout / 4);
    if (options_.idle_timeout) period = std::min(period, *options_.idle_timeout / 4);
    return std::max(period, std::chrono::milliseconds(10));
  }

  void tick() {
    if (!timer_) timer_.emplace(loop_.io());
    timer_->expires_after(tick_period());
    timer_->async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      on_tick();
      tick();
    });
  }

  void on_tick() {
    std::lock_guard lk(mu_);
    const auto now = detail::Clock::now();
    for (auto it = clients_.begin(); it != clients_.end();) {
      Client& c = *it->second;
      // Forgotten once its connection is closed, its last read and write returned, and no handler
      // holds its request (a handler thread holds the Client itself).
      if (c.dead && !c.busy && c.conn.quiescent_locked()) {
        it = clients_.erase(it);
        continue;
      }
      ++it;
      if (c.dead || !c.conn.is_open_locked()) continue;
      const auto silent = c.conn.silence(now);
      if (c.receiving && silent > options_.read_timeout) {
        log_limited(fmt::format("{}: closing the connection from {}: request: timed out after {} ms", name_, c.conn.name(),
                                options_.read_timeout.count()));
        drop_locked(c);
        continue;
      }
      if (options_.idle_timeout && !c.busy && !c.receiving && now - c.last_request > *options_.idle_timeout) {
        log_limited(fmt::format("{}: closing the connection from {}: no request for {} ms", name_, c.conn.name(),
                                options_.idle_timeout->count()));
        drop_locked(c);
        continue;
      }
      if (const auto lost = c.conn.heartbeat_locked(now, options_.heartbeat_interval, options_.heartbeat_timeout)) {
        log_limited(fmt::format("{}: closing the connection from {}: no heartbeat for {:.1f} s", name_, c.conn.name(),
                                std::chrono::duration<double>(*lost).count()));
        drop_locked(c);
      }
    }
  }

  // Members. loop_ comes first: its io_context outlives every socket and timer that uses it.
  detail::EventLoop loop_;
  std::string name_;
  RpcOptions options_;
  std::optional<std::string> token_;
  Handler handler_;
  HttpHandler http_;
  std::function<bool(std::uint64_t)> takes_long_;
  detail::Handshaker handshaker_;
  std::shared_ptr<const detail::AcceptorTerms> terms_;
  RateLimiter limiter_;
  detail::HandlerPool pool_;
  detail::Listener listener_;
  std::optional<boost::asio::steady_timer> timer_;
  std::atomic<bool> stopped_{false};
  mutable detail::NotifyingMutex mu_;
  bool stopping_ = false;
  int next_id_ = 0;
  std::map<int, ClientPtr> clients_;
};

}  // namespace net
DISTRIBUTE_END_NAMESPACE
