#include "daemon/tcp_auth.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace evoke {
namespace {

constexpr absl::string_view kAuthorization = "authorization";
// A refusal is logged at once, then at most this often (with the count), so
// a client hammering the port cannot flood the log.
constexpr absl::Duration kRefusalLogEvery = absl::Seconds(10);

absl::string_view View(grpc::string_ref s) { return absl::string_view(s.data(), s.size()); }

// ReadPem reads a small PEM file; `flag` names it in errors. The content is
// never part of a message.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag,
                                    absl::string_view what,
                                    std::initializer_list<absl::string_view> labels) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  }
  std::string pem = std::move(text).str();
  if (pem.size() > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is over 1 MiB"));
  }
  for (absl::string_view label : labels) {
    if (absl::StrContains(pem, absl::StrCat("-----BEGIN ", label, "-----"))) return pem;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": ", path, " holds no PEM ", what, " (-----BEGIN ",
                   *labels.begin(), "-----)"));
}

}  // namespace

std::optional<absl::string_view> BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return std::nullopt;
  }
  absl::string_view token = absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  for (char c : token) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<const Caller>> TokenCaller(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
    const AccessPolicy& policy) {
  const auto [begin, end] = metadata.equal_range(grpc::string_ref(kAuthorization.data(),
                                                                  kAuthorization.size()));
  if (begin == end) {
    return absl::UnauthenticatedError(
        "TCP calls need a bearer token (metadata \"authorization: Bearer <token>\")");
  }
  if (std::next(begin) != end) {
    return absl::UnauthenticatedError("more than one authorization metadata entry");
  }
  const std::optional<absl::string_view> token = BearerToken(View(begin->second));
  if (!token.has_value()) {
    return absl::UnauthenticatedError(
        "authorization metadata is not \"Bearer <token>\"");
  }
  // ForToken's message names no token.
  return policy.ForToken(*token);
}

grpc::Status BearerTokenProcessor::Process(const InputMetadata& auth_metadata,
                                           grpc::AuthContext* /*context*/,
                                           OutputMetadata* /*consumed_auth_metadata*/,
                                           OutputMetadata* /*response_metadata*/) {
  // The token stays in the call's metadata: IdentifyCaller reads it there
  // for this call alone.
  absl::StatusOr<std::shared_ptr<const Caller>> caller = TokenCaller(auth_metadata, *policy_);
  if (caller.ok()) return grpc::Status::OK;
  const absl::Time now = absl::Now();
  uint64_t refused = 0;
  uint64_t since_last = 0;
  bool log = false;
  {
    absl::MutexLock lock(&mu_);
    refused = ++refused_;
    if (now - last_log_ >= kRefusalLogEvery) {
      log = true;
      since_last = refused_ - logged_;
      logged_ = refused_;
      last_log_ = now;
    }
  }
  if (log) {
    EVOKE_LOG_WARNING("TCP: refused a call: ", caller.status().message(), " (",
                      since_last, " refused since the last report, ", refused, " in all)");
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      std::string(caller.status().message()));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpServerCredentials(
    const std::string& cert_path, const std::string& key_path, const AccessPolicy* policy) {
  if (!policy->has_tokens()) {
    return absl::InvalidArgumentError(
        "--policy: no principal has a token_file, so no TCP caller could be "
        "identified; give the principals that use --tcp-listen a token_file");
  }
  absl::StatusOr<std::string> cert =
      ReadPem(cert_path, "--tls-cert", "certificate", {"CERTIFICATE"});
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(
      key_path, "--tls-key", "private key",
      {"PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY"});
  if (!key.ok()) return key.status();
  if (absl::StrContains(*key, "-----BEGIN ENCRYPTED PRIVATE KEY-----")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key: ", key_path, " is encrypted; evoked needs an unencrypted key "
        "(protect it with the file's mode instead)"));
  }
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({std::move(key).value(), std::move(cert).value()});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  creds->SetAuthMetadataProcessor(std::make_shared<BearerTokenProcessor>(policy));
  return creds;
}

bool IsTlsCall(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return false;
  for (const grpc::string_ref& v :
       auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
    if (View(v) == GRPC_SSL_TRANSPORT_SECURITY_TYPE) return true;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<const Caller>> IdentifyCaller(
    const grpc::ServerContextBase& context, const AccessPolicy& policy,
    const ConnectionTable& connections) {
  if (IsTlsCall(context)) return TokenCaller(context.client_metadata(), policy);
  const std::string peer = context.peer();
  if (absl::StartsWith(peer, "fd:")) return connections.Lookup(peer);
  // Neither the TLS port nor a connection PeerListener handed over.
  return absl::UnauthenticatedError(
      absl::StrCat("calls from ", peer, " are not identified"));
}

}  // namespace evoke
