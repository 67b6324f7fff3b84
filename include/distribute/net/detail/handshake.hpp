// The authenticated handshake on one socket, both roles, before any other frame:
//
//   connector -> Hello      who it is, whom it calls, whether it holds a token, its nonce
//   acceptor  -> Challenge  the same, echoed, its nonce, its proof of the token
//   connector -> Response   its proof of the token
//   acceptor  -> Welcome    (or Reject, either way, at any step)
//
// Proofs are HMAC-SHA256 of both nonces and the identities under the cluster token (protocol.hpp).
// Before the proofs no frame may carry more than kMaxHandshakePayload bytes, and the whole
// handshake has one deadline. What the two sides must agree on beyond the token (ranks and cluster
// size for a communicator's mesh) is the owner's, given as terms, and checked only once the peer
// proved the token: a stranger gets a challenge, then "refused", whatever shape its hello claims.
// An acceptor tells a refused peer only "refused"; the reason goes to its log.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <fmt/format.h>

#include <distribute/net/detail/auth.hpp>
#include <distribute/net/detail/connection.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/frame.hpp>
#include <distribute/net/refusal_log.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

/// One handshake in progress: its socket, deadline and what each side said.
struct Handshake {
  explicit Handshake(asio::io_context& io) : socket(io), timer(io) {}
  explicit Handshake(tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
  tcp::socket socket;
  asio::steady_timer timer;
  HeaderBytes header{};
  std::vector<std::byte> in;
  std::vector<std::byte> out;
  Nonce nonce{};
  Hello hello{};  // the connector's
  std::string remote;
  std::string claimed;  // acceptor: who the peer claims to be, for the log (" (claiming to be rank 2)")
  bool timed_out = false;
  bool finished = false;
  std::uint64_t written = 0;      // bytes this side wrote during the handshake
  std::shared_ptr<void> pending;  // acceptor side: counts against the pending bound until reset
};
using HandshakePtr = std::shared_ptr<Handshake>;

/// What ends a connector's handshake: success, a failure worth another attempt (I/O, a peer not
/// ready), or a refusal or mismatch that retrying cannot cure.
enum class HandshakeEnd : std::uint8_t { Ok, Retry, Fatal };

/// A connector's side of the agreement.
struct ConnectorTerms {
  Hello hello;  // what this side says (the nonce is drawn here)
  std::string peer_name;
  std::string peer_address;
  std::string me;
  /// Checks the challenge beyond the proof: "" accepts it, else the (fatal) mismatch.
  std::function<std::string(const Challenge&)> check;
  /// The message for a peer that refused us with `text` ("refused", or its reason).
  std::function<std::string(const std::string& text)> refused;
};

/// An acceptor's side of the agreement.
struct AcceptorTerms {
  std::string me;
  std::string role = "rank";  // what this side is, for the log ("rank", "server")
  /// Checks a hello before any proof, on what a stranger may learn from the answer (what kind of
  /// peer it is, whether it holds a token; never the cluster's shape): "" goes on, else why it is
  /// refused. May set h.claimed.
  std::function<std::string(Handshake& h, const Hello&)> greet;
  /// Checks the hello of a peer that proved the token (or of any peer, without one) against what
  /// this side is (the cluster's size and ranks): "" admits it, else why it is refused. Unset:
  /// every authenticated peer is admitted. A stranger never gets this far, so the answers it gets
  /// are the same whatever shape its hello claims.
  std::function<std::string(const Hello&)> admit;
  /// After the peer proved the token, takes its place: "" done, else why it is refused.
  std::function<std::string(const Hello&)> claim;
  /// Gives the place back (the welcome could not be written).
  std::function<void(const Hello&)> unclaim;
  /// Writes a line a stranger can cause (rate-limited).
  std::function<void(const std::string&)> log;
};

class Handshaker {
 public:
  using Done = std::function<void(HandshakeEnd, const std::string& message)>;

  Handshaker(std::optional<std::string> token, std::chrono::milliseconds timeout) : token_(std::move(token)), timeout_(timeout) {}

  const std::optional<std::string>& token() const noexcept { return token_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  // ---- connector ------------------------------------------------------------------------------

  /// Runs the connector's side on `h`'s connected socket; `done` hears how it ended (on Ok the
  /// authenticated socket is h->socket, h->written the bytes this side wrote).
  void connect(const HandshakePtr& h, std::shared_ptr<const ConnectorTerms> terms, Done done) {
    arm_timer(h);
    h->nonce = random_nonce();
    h->hello = terms->hello;
    h->hello.has_token = token_.has_value();
    h->hello.nonce = h->nonce;
    write(h, FrameType::Hello, encode(h->hello), [this, h, terms, done](const std::string& err) {
      if (!err.empty()) return done(HandshakeEnd::Retry, err);
      read(h, [this, h, terms, done](const std::string& err2, const FrameHeader& fh) {
        if (!err2.empty()) return done(HandshakeEnd::Retry, err2);
        if (fh.type == FrameType::Reject) return done(HandshakeEnd::Fatal, terms->refused(decode_text(h->in)));
        if (fh.type != FrameType::Challenge) {
          return done(HandshakeEnd::Retry, fmt::format("{} answered with a {} frame instead of a challenge", terms->peer_address,
                                                       to_string(fh.type)));
        }
        Challenge c;
        try {
          c = decode_challenge(h->in);
        } catch (const FrameError& e) {
          return done(HandshakeEnd::Retry, fmt::format("{} sent a malformed challenge: {}", terms->peer_address, e.what()));
        }
        if (std::string mismatch = terms->check(c); !mismatch.empty()) return done(HandshakeEnd::Fatal, mismatch);
        Mac proof{};
        if (token_) {
          const Mac expected = handshake_proof(*token_, true, h->nonce, c.nonce, c.size, c.rank, c.peer_rank, c.service);
          if (!macs_equal(expected, c.proof)) {
            const std::string why = "authentication failed: the acceptor's proof of the cluster token is wrong";
            write(h, FrameType::Reject, std::as_bytes(std::span(why.data(), why.size())), [](const std::string&) {});
            return done(HandshakeEnd::Fatal, fmt::format("{} at {} failed to prove it holds the cluster token (the tokens differ)",
                                                         terms->peer_name, terms->peer_address));
          }
          proof = handshake_proof(*token_, false, h->nonce, c.nonce, c.size, c.rank, c.peer_rank, c.service);
        }
        write(h, FrameType::Response, proof, [this, h, terms, done](const std::string& err3) {
          if (!err3.empty()) return done(HandshakeEnd::Retry, err3);
          read(h, [h, terms, done](const std::string& err4, const FrameHeader& fh2) {
            if (!err4.empty()) return done(HandshakeEnd::Retry, err4);
            if (fh2.type == FrameType::Reject) return done(HandshakeEnd::Fatal, terms->refused(decode_text(h->in)));
            if (fh2.type != FrameType::Welcome) {
              return done(HandshakeEnd::Retry, fmt::format("{} answered with a {} frame instead of a welcome",
                                                           terms->peer_address, to_string(fh2.type)));
            }
            h->finished = true;
            h->timer.cancel();
            done(HandshakeEnd::Ok, std::string());
          });
        });
      });
    });
  }

  // ---- acceptor -------------------------------------------------------------------------------

  /// Runs the acceptor's side on an accepted socket; `welcomed` runs only for a peer that proved
  /// the token and was admitted (the socket is h->socket, h->hello what it said). The first
  /// `preread` bytes of the hello's header are already in h->header.
  void accept(const HandshakePtr& h, std::shared_ptr<const AcceptorTerms> terms, std::function<void(const HandshakePtr&)> welcomed,
              std::size_t preread = 0) {
    boost::system::error_code ec;
    const auto remote = h->socket.remote_endpoint(ec);
    h->remote = ec ? std::string("an unknown address") : fmt::format("{}:{}", remote.address().to_string(), remote.port());
    arm_timer(h);
    read(
        h,
        [this, h, terms, welcomed](const std::string& err, const FrameHeader& fh) {
          if (!err.empty()) return refuse(h, *terms, err, false);
          if (fh.type != FrameType::Hello) {
            return refuse(h, *terms, fmt::format("expected a hello frame, got a {} frame", to_string(fh.type)), false);
          }
          try {
            h->hello = decode_hello(h->in);
          } catch (const FrameError& e) {
            return refuse(h, *terms, e.what(), false);
          }
          if (std::string why = terms->greet(*h, h->hello); !why.empty()) return refuse(h, *terms, why, true);
          const Hello& hello = h->hello;
          h->nonce = random_nonce();
          Challenge c{hello.size, hello.to_rank, hello.from_rank, token_.has_value(), h->nonce, Mac{}, hello.service};
          if (token_) c.proof = handshake_proof(*token_, true, hello.nonce, h->nonce, c.size, c.rank, c.peer_rank, c.service);
          write(h, FrameType::Challenge, encode(c), [this, h, terms, welcomed](const std::string& err2) {
            if (!err2.empty()) return refuse(h, *terms, err2, false);
            read(h, [this, h, terms, welcomed](const std::string& err3, const FrameHeader& fh2) {
              if (!err3.empty()) return refuse(h, *terms, err3, false);
              if (fh2.type == FrameType::Reject) {
                return refuse(h, *terms, fmt::format("it refused this {}'s proof of the cluster token: {}", terms->role, decode_text(h->in)),
                              false);
              }
              if (fh2.type != FrameType::Response) {
                return refuse(h, *terms, fmt::format("expected a response frame, got a {} frame", to_string(fh2.type)), false);
              }
              Mac proof{};
              try {
                proof = decode_response(h->in);
              } catch (const FrameError& e) {
                return refuse(h, *terms, e.what(), false);
              }
              const Hello& hi = h->hello;
              if (token_) {
                const Mac expected =
                    handshake_proof(*token_, false, hi.nonce, h->nonce, hi.size, hi.to_rank, hi.from_rank, hi.service);
                if (!macs_equal(expected, proof)) {
                  return refuse(h, *terms, "authentication failed: its proof of the cluster token is wrong (the tokens differ)",
                                true);
                }
              }
              if (terms->admit) {
                if (std::string why = terms->admit(hi); !why.empty()) return refuse(h, *terms, why, true);
              }
              if (std::string why = terms->claim(hi); !why.empty()) return refuse(h, *terms, why, true);
              write(h, FrameType::Welcome, {}, [this, h, terms, welcomed](const std::string& err4) {
                if (!err4.empty()) {
                  terms->unclaim(h->hello);
                  return refuse(h, *terms, err4, false);
                }
                h->finished = true;
                h->timer.cancel();
                h->pending.reset();
                welcomed(h);
              });
            });
          });
        },
        preread);
  }

  /// Closes h's socket unless it finishes (h->finished) within the handshake's deadline.
  void arm_deadline(const HandshakePtr& h) { arm_timer(h); }

 private:
  std::string error_of(const Handshake& h, const boost::system::error_code& ec) const {
    if (h.timed_out) return fmt::format("handshake timed out after {} ms", timeout_.count());
    if (ec == asio::error::eof) return "connection closed during the handshake";
    return describe_error(ec);
  }

  void arm_timer(const HandshakePtr& h) {
    h->timer.expires_after(timeout_);
    h->timer.async_wait([h](const boost::system::error_code& ec) {
      if (!ec && !h->finished) {
        h->timed_out = true;
        boost::system::error_code ignored;
        h->socket.close(ignored);
      }
    });
  }

  using ReadDone = std::function<void(const std::string& error, const FrameHeader& header)>;

  // Reads one handshake frame (its first `have` header bytes are in h->header already); handshake
  // payloads are tiny, so a stranger cannot make us allocate.
  void read(const HandshakePtr& h, ReadDone done, std::size_t have = 0) {
    asio::async_read(h->socket, asio::buffer(h->header.data() + have, h->header.size() - have),
                     [this, h, done = std::move(done)](const boost::system::error_code& ec, std::size_t) {
                       if (ec) return done(error_of(*h, ec), FrameHeader{});
                       FrameHeader fh;
                       try {
                         fh = decode_header(h->header, kMaxHandshakePayload);
                       } catch (const FrameError& e) {
                         return done(fmt::format("malformed frame: {}", e.what()), FrameHeader{});
                       }
                       h->in.resize(static_cast<std::size_t>(fh.length));
                       asio::async_read(h->socket, asio::buffer(h->in),
                                        [this, h, done, fh](const boost::system::error_code& ec2, std::size_t) {
                                          if (ec2) return done(error_of(*h, ec2), FrameHeader{});
                                          done(std::string(), fh);
                                        });
                     });
  }

  void write(const HandshakePtr& h, FrameType type, std::span<const std::byte> payload, std::function<void(const std::string&)> done) {
    h->out = encode_frame(FrameHeader{type, 0, 0, 0}, payload);
    h->written += h->out.size();
    asio::async_write(h->socket, asio::buffer(h->out), [this, h, done = std::move(done)](const boost::system::error_code& ec, std::size_t) {
      done(ec ? error_of(*h, ec) : std::string());
    });
  }

  // The peer reads only "refused"; the reason goes to the (rate-limited) local log.
  void refuse(const HandshakePtr& h, const AcceptorTerms& terms, const std::string& reason, bool reply) {
    terms.log(fmt::format("{}: refused connection from {}{}: {}", terms.me, h->remote, h->claimed, reason));
    h->finished = true;
    h->timer.cancel();
    h->pending.reset();
    if (reply) {
      write(h, FrameType::Reject, std::as_bytes(std::span(kRefusedText.data(), kRefusedText.size())), [h](const std::string&) {
        boost::system::error_code ignored;
        h->socket.close(ignored);
      });
    } else {
      boost::system::error_code ignored;
      h->socket.close(ignored);
    }
  }

  std::optional<std::string> token_;
  std::chrono::milliseconds timeout_;
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
