// TCP access to evoked (--tcp-listen): TLS always, and a bearer token of a
// principal of the access policy on every call.
//
// How a call is identified:
//  - On the TCP port (transport security "ssl", set by gRPC's TLS transport,
//    never by a client), by the "authorization: Bearer <token>" metadata of
//    that very call. BearerTokenProcessor, installed on the TLS credentials,
//    refuses a call without a recognized token (UNAUTHENTICATED) before any
//    handler runs; IdentifyCaller resolves the same token again for the
//    handler.
//  - On the Unix socket, by the connection's SO_PEERCRED (ConnectionTable,
//    peer "fd:<n>"), as before.
// A TCP call never reaches the ConnectionTable and a Unix call never reads a
// token.
//
// Why the identity is not a property of the auth context: gRPC 1.51 hands
// the processor the *connection's* auth context (server_auth_filter.cc refs
// the channel's context into every call; auth_metadata_processor.h: "all the
// subsequent calls will see the updates"). A property written for one call
// would be seen by every later call on the connection, and two principals
// multiplexed on one HTTP/2 connection (a proxy, a client holding two
// tokens) would read each other's. Each call's own metadata is per call.
//
// Tokens are never logged: refusals are logged (rate-limited) with their
// reason only.
#ifndef EVOKE_DAEMON_TCP_AUTH_H_
#define EVOKE_DAEMON_TCP_AUTH_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/access_policy.h"
#include "daemon/peer_listener.h"

namespace evoke {

// BearerToken returns the token of an authorization value "Bearer <token>"
// (the scheme is case-insensitive, RFC 6750 §2.1), or nullopt for any other
// scheme, an empty token, or a token with whitespace in it.
std::optional<absl::string_view> BearerToken(absl::string_view authorization);

// TokenCaller returns the principal whose token the call's metadata carries.
// UNAUTHENTICATED when there is no authorization, more than one, another
// scheme, or a token the policy does not know. The message never contains
// the token.
absl::StatusOr<std::shared_ptr<const Caller>> TokenCaller(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
    const AccessPolicy& policy);

// BearerTokenProcessor refuses every TCP call whose token TokenCaller does
// not accept, before the call reaches a handler. It records nothing in the
// (per-connection) auth context; see the file comment.
class BearerTokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(const AccessPolicy* policy) : policy_(policy) {}

  // ForToken compares a few strings; no thread hop needed.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  uint64_t refused() const {
    absl::MutexLock lock(&mu_);
    return refused_;
  }

 private:
  const AccessPolicy* const policy_;
  mutable absl::Mutex mu_;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t logged_ ABSL_GUARDED_BY(mu_) = 0;  // refused_ when last logged.
  absl::Time last_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// TcpServerCredentials reads the PEM certificate chain (--tls-cert) and
// private key (--tls-key) and returns TLS server credentials (no client
// certificates asked for) that admit only calls with a token of `policy`
// (which must outlive them). INVALID_ARGUMENT naming the flag when a file
// cannot be read or holds no PEM certificate / private key; INVALID_ARGUMENT
// naming --policy when no principal has a token_file (TCP would serve
// nobody).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpServerCredentials(
    const std::string& cert_path, const std::string& key_path, const AccessPolicy* policy);

// IsTlsCall: the call came over a TLS transport (the TCP port).
bool IsTlsCall(const grpc::ServerContextBase& context);

// IdentifyCaller is KvTierServiceOptions::identify for evoked: a TLS call by
// its own bearer token, a Unix-socket call ("fd:<n>" peer) by its
// connection's entry in `connections`, anything else UNAUTHENTICATED.
absl::StatusOr<std::shared_ptr<const Caller>> IdentifyCaller(
    const grpc::ServerContextBase& context, const AccessPolicy& policy,
    const ConnectionTable& connections);

}  // namespace evoke

#endif  // EVOKE_DAEMON_TCP_AUTH_H_
