// TCP identification (issue #11): a gRPC server with evoked's TLS
// credentials and bearer-token processor, whose Stat handler answers the
// name of the caller IdentifyCaller finds.
#include "daemon/tcp_auth.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAliceToken[] = "alice-7c1f0e9a4b2d8e6f3a5c";
constexpr char kBobToken[] = "bob-2e8d4a6c1f9b3e7d5a0c4";

// Answers the caller's name in pinned_memory_lock_error (a string field of
// StatResponse); refusals come back as the call's status.
class Probe final : public v1::KvTier::CallbackService {
 public:
  Probe(const AccessPolicy* policy, const ConnectionTable* connections)
      : policy_(policy), connections_(connections) {}
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* context,
                                 const v1::StatRequest*, v1::StatResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<std::shared_ptr<const Caller>> caller =
        IdentifyCaller(*context, *policy_, *connections_);
    if (!caller.ok()) {
      reactor->Finish(grpc::Status(static_cast<grpc::StatusCode>(caller.status().code()),
                                   std::string(caller.status().message())));
      return reactor;
    }
    ++calls;
    response->set_pinned_memory_lock_error((*caller)->name());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  std::atomic<int> calls{0};

 private:
  const AccessPolicy* const policy_;
  const ConnectionTable* const connections_;
};

class TcpAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "needs the openssl command to make a test certificate";
    }
    cert_ = dir_.Join("cert.pem");
    key_ = dir_.Join("key.pem");
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
        "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ",
        key_, " -out ", cert_, " >/dev/null 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(cert_);
    root_pem_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::ofstream(dir_.Join("alice.token")) << kAliceToken << "\n";
    std::ofstream(dir_.Join("bob.token")) << kBobToken << "\n";
    absl::StatusOr<AccessPolicy> policy = AccessPolicy::Parse(
        absl::StrCat("principals { name: \"alice\" namespaces: \"a\" token_file: \"",
                     dir_.Join("alice.token"),
                     "\" }\n"
                     "principals { name: \"bob\" namespaces: \"b\" token_file: \"",
                     dir_.Join("bob.token"), "\" }\n"),
        "test");
    ASSERT_TRUE(policy.ok()) << policy.status();
    policy_ = std::make_unique<AccessPolicy>(*std::move(policy));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Serves the probe on 127.0.0.1 with `creds` (evoked's unless given).
  void Serve(std::shared_ptr<grpc::ServerCredentials> creds = nullptr) {
    if (creds == nullptr) {
      absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> c =
          TcpServerCredentials(cert_, key_, policy_.get());
      ASSERT_TRUE(c.ok()) << c.status();
      creds = *c;
    }
    probe_ = std::make_unique<Probe>(policy_.get(), &connections_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", creds, &port_);
    builder.RegisterService(probe_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }

  std::shared_ptr<grpc::Channel> TlsChannel() {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = root_pem_;
    return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::SslCredentials(ssl));
  }

  // Calls Stat with `authorization` values; returns the status and the name.
  grpc::Status Call(grpc::Channel* channel, const std::vector<std::string>& authorization,
                    std::string* name = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    for (const std::string& a : authorization) context.AddMetadata("authorization", a);
    v1::StatResponse response;
    grpc::Status s = v1::KvTier::NewStub(channel->shared_from_this())
                         ->Stat(&context, v1::StatRequest(), &response);
    if (name != nullptr) *name = response.pinned_memory_lock_error();
    return s;
  }

  testing::TempDir dir_;
  std::string cert_, key_, root_pem_;
  std::unique_ptr<AccessPolicy> policy_;
  ConnectionTable connections_;
  std::unique_ptr<Probe> probe_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST(BearerTokenTest, ParsesOnlyTheBearerScheme) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer abc"), "abc");
  EXPECT_EQ(BearerToken("BEARER   abc  "), "abc");
  EXPECT_EQ(BearerToken("Bearer "), std::nullopt);
  EXPECT_EQ(BearerToken("Bearer"), std::nullopt);
  EXPECT_EQ(BearerToken("Basic YWxpY2U6cHc="), std::nullopt);
  EXPECT_EQ(BearerToken("Bearerabc"), std::nullopt);
  EXPECT_EQ(BearerToken("Bearer a b"), std::nullopt);
  EXPECT_EQ(BearerToken(absl::string_view("Bearer a\0b", 10)), std::nullopt);
  EXPECT_EQ(BearerToken(""), std::nullopt);
}

// gRPC 1.51 gives the processor the connection's auth context: an identity
// recorded there for one call would leak into the next. Each call on one
// connection is identified by its own token.
TEST_F(TcpAuthTest, EachCallIsItsOwnTokensPrincipalOnOneConnection) {
  Serve();
  std::shared_ptr<grpc::Channel> channel = TlsChannel();
  for (int i = 0; i < 3; ++i) {
    std::string name;
    ASSERT_TRUE(Call(channel.get(), {absl::StrCat("Bearer ", kAliceToken)}, &name).ok());
    EXPECT_EQ(name, "alice (token)");
    ASSERT_TRUE(Call(channel.get(), {absl::StrCat("bearer ", kBobToken)}, &name).ok());
    EXPECT_EQ(name, "bob (token)");
    // A call without a token after authenticated ones is still refused.
    EXPECT_EQ(Call(channel.get(), {}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(probe_->calls, 6);
}

// The same with the calls of two principals interleaved on one connection,
// as a proxy multiplexing tenants would send them.
TEST_F(TcpAuthTest, InterleavedPrincipalsOnOneConnectionKeepTheirOwnRights) {
  Serve();
  std::shared_ptr<grpc::Channel> channel = TlsChannel();
  constexpr int kCalls = 200;
  std::atomic<int> wrong{0}, failed{0};
  auto run = [&](const char* token, const std::string& expected) {
    for (int i = 0; i < kCalls; ++i) {
      std::string name;
      if (!Call(channel.get(), {absl::StrCat("Bearer ", token)}, &name).ok()) {
        ++failed;
      } else if (name != expected) {
        ++wrong;
      }
    }
  };
  std::thread a(run, kAliceToken, "alice (token)");
  std::thread b(run, kBobToken, "bob (token)");
  a.join();
  b.join();
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(wrong, 0) << "calls answered as the other principal";
}

TEST_F(TcpAuthTest, RefusesMissingUnknownOrMalformedTokens) {
  Serve();
  std::shared_ptr<grpc::Channel> channel = TlsChannel();
  const std::string wrong = "Bearer not-a-token-of-this-policy";
  for (const std::vector<std::string>& auth : std::vector<std::vector<std::string>>{
           {},
           {wrong},
           {absl::StrCat("Basic ", kAliceToken)},
           {absl::StrCat(kAliceToken)},
           {"Bearer "},
           {absl::StrCat("Bearer ", kAliceToken, "x")},
           {absl::StrCat("Bearer ", kAliceToken), absl::StrCat("Bearer ", kBobToken)}}) {
    SCOPED_TRACE(auth.empty() ? "(none)" : auth[0]);
    const grpc::Status s = Call(channel.get(), auth);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_THAT(s.error_message(), Not(HasSubstr("alice-")));
    EXPECT_THAT(s.error_message(), Not(HasSubstr("not-a-token")));
  }
  EXPECT_EQ(probe_->calls, 0);
}

TEST_F(TcpAuthTest, PlaintextClientsCannotTalkToTheTlsPort) {
  Serve();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                     grpc::InsecureChannelCredentials());
  const grpc::Status s = Call(channel.get(), {absl::StrCat("Bearer ", kAliceToken)});
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(probe_->calls, 0);
}

// Even if the processor were bypassed, IdentifyCaller never resolves a TLS
// call through the connection table (whose every fd here is an admin).
TEST_F(TcpAuthTest, ATlsCallNeverResolvesThroughTheConnectionTable) {
  for (int fd = 0; fd < 1024; ++fd) connections_.Set(fd, Caller::Unrestricted());
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  std::ifstream key_in(key_);
  std::string key((std::istreambuf_iterator<char>(key_in)), std::istreambuf_iterator<char>());
  options.pem_key_cert_pairs.push_back({key, root_pem_});
  Serve(grpc::SslServerCredentials(options));  // No processor.
  std::shared_ptr<grpc::Channel> channel = TlsChannel();
  const grpc::Status s = Call(channel.get(), {});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  std::string name;
  ASSERT_TRUE(Call(channel.get(), {absl::StrCat("Bearer ", kBobToken)}, &name).ok());
  EXPECT_EQ(name, "bob (token)");
}

TEST_F(TcpAuthTest, CredentialErrorsNameTheFlag) {
  EXPECT_THAT(TcpServerCredentials(dir_.Join("none.pem"), key_, policy_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-cert")));
  EXPECT_THAT(TcpServerCredentials(cert_, dir_.Join("none.pem"), policy_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-key")));
  // Swapped: the certificate file holds no key, and the key no certificate.
  EXPECT_THAT(TcpServerCredentials(key_, cert_, policy_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls-cert: " + key_ + " holds no PEM certificate")));
  EXPECT_THAT(TcpServerCredentials(cert_, cert_, policy_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls-key: " + cert_ + " holds no PEM private key")));
  absl::StatusOr<AccessPolicy> no_tokens =
      AccessPolicy::Parse("principals { name: \"u\" uids: 1 namespaces: \"n\" }", "test");
  ASSERT_TRUE(no_tokens.ok()) << no_tokens.status();
  EXPECT_THAT(TcpServerCredentials(cert_, key_, &*no_tokens),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token_file")));
}

// A key that is not the certificate's: gRPC refuses to serve the port (so
// evoked fails its start with --tcp-listen's error).
TEST_F(TcpAuthTest, AMismatchedKeyIsNotServed) {
  const std::string other = dir_.Join("other.pem");
  ASSERT_EQ(std::system(absl::StrCat("openssl genpkey -algorithm EC -pkeyopt "
                                     "ec_paramgen_curve:prime256v1 -out ",
                                     other, " >/dev/null 2>&1")
                            .c_str()),
            0);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      TcpServerCredentials(cert_, other, policy_.get());
  ASSERT_TRUE(creds.ok()) << creds.status();
  int port = 0;
  Probe probe(policy_.get(), &connections_);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", *creds, &port);
  builder.RegisterService(&probe);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_TRUE(server == nullptr || port == 0) << "port " << port;
  if (server != nullptr) server->Shutdown();
}

}  // namespace
}  // namespace evoke
