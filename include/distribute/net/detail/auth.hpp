// Cluster-token authentication primitives, all from OpenSSL (nothing hand-written): nonces from
// RAND_bytes, HMAC-SHA256, constant-time comparison.
#pragma once

#include <array>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <distribute/core/error.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace net::detail {

inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;
using Nonce = std::array<std::byte, kNonceBytes>;
using Mac = std::array<std::byte, kMacBytes>;

inline Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    throw Error("distribute.net: OpenSSL RAND_bytes failed to produce a handshake nonce");
  }
  return n;
}

inline Mac hmac_sha256(std::string_view key, std::span<const std::byte> message) {
  Mac out{};
  unsigned int len = 0;
  const unsigned char* ok =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), reinterpret_cast<unsigned char*>(out.data()), &len);
  if (ok == nullptr || len != out.size()) throw Error("distribute.net: OpenSSL HMAC-SHA256 failed");
  return out;
}

/// Timing-independent equality, so a forger learns nothing from how fast a MAC is refused.
inline bool macs_equal(const Mac& a, const Mac& b) noexcept { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

/// The token in effect: the option when set ("" meaning none), else DISTRIBUTE_CLUSTER_TOKEN.
inline std::optional<std::string> effective_cluster_token(const std::optional<std::string>& option) {
  if (option) return option->empty() ? std::nullopt : option;
  if (const char* env = std::getenv("DISTRIBUTE_CLUSTER_TOKEN"); env != nullptr && *env != '\0') return std::string(env);
  return std::nullopt;
}

/// Whether listening beyond this host without a token was chosen: the option, or
/// DISTRIBUTE_INSECURE=1 in the environment.
inline bool insecure_chosen(bool option) {
  if (option) return true;
  const char* env = std::getenv("DISTRIBUTE_INSECURE");
  return env != nullptr && std::string_view(env) == "1";
}

/// Whether an HTTP request's Authorization header carries `token` as a bearer credential
/// (Prometheus' `authorization` scrape setting); compared in constant time.
inline bool bearer_matches(std::string_view authorization, const std::string& token) {
  constexpr std::string_view scheme = "Bearer ";
  if (authorization.size() < scheme.size() || authorization.substr(0, scheme.size()) != scheme) return false;
  const std::string_view given = authorization.substr(scheme.size());
  // Both sides hashed first: the comparison takes as long whatever the lengths.
  constexpr std::string_view key = "distribute bearer";
  return macs_equal(hmac_sha256(key, std::as_bytes(std::span(given.data(), given.size()))),
                    hmac_sha256(key, std::as_bytes(std::span(token.data(), token.size()))));
}

/// The HTTP status pages of a task (its ps port, its metrics port): /healthz for anyone; the
/// others, with a cluster token, only for a scrape that sends it as a bearer credential.
inline bool scrape_allowed(std::string_view target, std::string_view authorization,
                           const std::optional<std::string>& token) {
  return !token || target == "/healthz" || bearer_matches(authorization, *token);
}

/// The body of the 401 answer to a scrape without the token.
inline constexpr std::string_view kScrapeRefused =
    "this task has a cluster token: send it as 'Authorization: Bearer TOKEN' (Prometheus: authorization: "
    "{type: Bearer, credentials_file: FILE})\n";

}  // namespace net::detail
DISTRIBUTE_END_NAMESPACE
