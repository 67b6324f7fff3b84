// What the ranks of a communicator's mesh agree on in their handshakes (handshake.hpp): the
// cluster's size, who calls whom (a rank connects to the ranks below it), and whether both hold a
// cluster token; and what each side says when they do not agree.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <distribute/net/detail/handshake.hpp>
#include <distribute/net/detail/protocol.hpp>
#include <distribute/net/refusal_log.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

class MeshTerms {
 public:
  struct Rank {
    std::string name;
    std::string address;
  };

  MeshTerms(int rank, std::vector<Rank> ranks, bool has_token)
      : self_(std::make_shared<const Self>(Self{rank, static_cast<int>(ranks.size()), has_token, std::move(ranks)})) {}

  /// Rank `j`'s terms for this rank connecting to it.
  std::shared_ptr<const ConnectorTerms> connector(int j) const {
    auto terms = std::make_shared<ConnectorTerms>();
    const Self& s = *self_;
    const Rank& to = s.ranks[static_cast<std::size_t>(j)];
    terms->hello = Hello{static_cast<std::uint32_t>(s.size), static_cast<std::uint32_t>(s.rank), static_cast<std::uint32_t>(j)};
    terms->peer_name = to.name;
    terms->peer_address = to.address;
    terms->me = s.me();
    terms->check = [self = self_, j](const Challenge& c) -> std::string {
      const Rank& q = self->ranks[static_cast<std::size_t>(j)];
      if (c.size != static_cast<std::uint32_t>(self->size) || c.rank != static_cast<std::uint32_t>(j) ||
          c.peer_rank != static_cast<std::uint32_t>(self->rank) || c.service) {
        return fmt::format("{} answered as rank {} of a {}-rank cluster, but {} (rank {} of {}) lists it as {} (rank {}): the "
                           "processes were given different cluster specs",
                           q.address, c.rank, c.size, self->me(), self->rank, self->size, q.name, j);
      }
      if (c.has_token != self->has_token) {
        return self->has_token
                   ? fmt::format("{} at {} uses no cluster token but {} does", q.name, q.address, self->me())
                   : fmt::format("{} at {} requires a cluster token (DISTRIBUTE_CLUSTER_TOKEN) but {} has none", q.name,
                                 q.address, self->me());
      }
      return {};
    };
    // An acceptor tells a refused peer no more than "refused".
    terms->refused = [self = self_, j](const std::string& text) {
      const Rank& q = self->ranks[static_cast<std::size_t>(j)];
      if (text == kRefusedText) {
        return fmt::format("{} at {} refused {} (its log says why; cluster specs or cluster tokens that differ are the usual "
                           "cause)",
                           q.name, q.address, self->me());
      }
      return fmt::format("{} at {} refused {}: {}", q.name, q.address, self->me(), text);
    };
    return terms;
  }

  /// This rank's terms for the ranks above it connecting. `claim(from)` takes that rank's place
  /// ("" done, else why not), `unclaim(from)` gives it back; `log` writes the refusals.
  std::shared_ptr<const AcceptorTerms> acceptor(std::function<std::string(int)> claim, std::function<void(int)> unclaim,
                                                std::function<void(const std::string&)> log) const {
    auto terms = std::make_shared<AcceptorTerms>();
    terms->me = self_->me();
    // Before any proof: nothing that depends on this cluster's shape, which a stranger must not
    // learn from the answers (a challenge for the right shape, "refused" for another).
    terms->greet = [self = self_](Handshake& hs, const Hello& hello) -> std::string {
      if (hello.service) return "it is a client of a service, not a rank of this cluster";
      if (hello.from_rank < static_cast<std::uint32_t>(self->size)) {
        hs.claimed = fmt::format(" (claiming to be {})", self->ranks[hello.from_rank].name);
      }
      if (hello.has_token != self->has_token) {
        return self->has_token ? std::string("it presented no cluster token, and this cluster requires one")
                               : std::string("it presented a cluster token, and this rank has none");
      }
      return {};
    };
    terms->admit = [self = self_](const Hello& hello) -> std::string {
      const int rank = self->rank, size = self->size;
      if (hello.size != static_cast<std::uint32_t>(size) || hello.to_rank != static_cast<std::uint32_t>(rank)) {
        return fmt::format("it believes in a {}-rank cluster and called rank {}, but this is rank {} of {}", hello.size,
                           hello.to_rank, rank, size);
      }
      if (hello.from_rank <= static_cast<std::uint32_t>(rank) || hello.from_rank >= static_cast<std::uint32_t>(size)) {
        return fmt::format("it claims rank {}, but only ranks {}..{} connect to rank {}", hello.from_rank, rank + 1, size - 1,
                           rank);
      }
      return {};
    };
    terms->claim = [claim = std::move(claim)](const Hello& hello) { return claim(static_cast<int>(hello.from_rank)); };
    terms->unclaim = [unclaim = std::move(unclaim)](const Hello& hello) { unclaim(static_cast<int>(hello.from_rank)); };
    terms->log = std::move(log);
    return terms;
  }

 private:
  struct Self {
    int rank;
    int size;
    bool has_token;
    std::vector<Rank> ranks;
    const std::string& me() const { return ranks[static_cast<std::size_t>(rank)].name; }
  };
  std::shared_ptr<const Self> self_;  // shared with the hooks, which may outlive this object
};

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
