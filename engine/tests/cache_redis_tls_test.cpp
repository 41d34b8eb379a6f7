// The shared tier's Redis store over TLS ("rediss://") against a real
// redis-server with a throwaway CA: entries round-trip; a certificate from an
// untrusted CA or for another name is refused (a counted miss, never a
// connection); a server asking for a client certificate gets one when it is
// configured; a plain/TLS mismatch and a silent server cost the timeout at
// most; the environment's TLS settings are checked.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "local_redis.h"
#include "scoped_env.h"
#include "temp_dir.h"
#include "vtpu/cache/shared_tier.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

using runtime::Error;
using runtime::ErrorKind;
using vtpu::testing::LocalRedis;
using vtpu::testing::TempDir;

const std::string kSigningKey = "0123456789abcdef0123456789abcdef";
const Key kKey = make_key({"tls entry"});

Entry sample_entry() {
  Entry e;
  e.metadata["symbol"] = "vtpu_kernel_tls";
  for (int i = 0; i < 70000; ++i) e.data.push_back(static_cast<std::uint8_t>(i % 251));  // several TLS records
  return e;
}

SharedTier::Options quick_options(std::chrono::milliseconds timeout) {
  SharedTier::Options o;
  o.timeout = timeout;
  o.retry_after = std::chrono::milliseconds(0);
  return o;
}

bool run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// A CA, a server certificate for `names` (subjectAltName entries) signed by
// it, a client certificate signed by it, and a second CA nobody trusts.
class Certificates {
 public:
  explicit Certificates(const std::string& names) {
    const std::string d = dir_.path() + "/";
    const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::ofstream(d + "server.ext") << "subjectAltName=" << names << "\n";
    ok_ = run("openssl req -x509" + key + " -keyout " + d + "ca.key -out " + d + "ca.crt -days 2 -subj /CN=vtpu-test-ca") &&
          run("openssl req -x509" + key + " -keyout " + d + "other.key -out " + d + "other.crt -days 2 -subj /CN=other-ca") &&
          run("openssl req" + key + " -keyout " + d + "server.key -out " + d + "server.csr -subj /CN=vtpu-test-server") &&
          run("openssl x509 -req -in " + d + "server.csr -CA " + d + "ca.crt -CAkey " + d + "ca.key -CAcreateserial -out " +
              d + "server.crt -days 2 -extfile " + d + "server.ext") &&
          run("openssl req" + key + " -keyout " + d + "client.key -out " + d + "client.csr -subj /CN=vtpu-test-client") &&
          run("openssl x509 -req -in " + d + "client.csr -CA " + d + "ca.crt -CAkey " + d + "ca.key -CAcreateserial -out " +
              d + "client.crt -days 2");
  }
  bool ok() const { return ok_; }
  std::string file(const std::string& name) const { return dir_.path() + "/" + name; }
  // redis-server's TLS settings; `clients`: its tls-auth-clients (yes, no, optional).
  std::vector<std::string> server_args(const std::string& clients) const {
    return {"--tls-cert-file", file("server.crt"), "--tls-key-file", file("server.key"),
            "--tls-ca-cert-file", file("ca.crt"), "--tls-auth-clients", clients};
  }

 private:
  TempDir dir_;
  bool ok_ = false;
};

#define REQUIRE_TOOLS()                                                                                       \
  const auto binary = vtpu::testing::redis_server_binary();                                                   \
  if (!binary) GTEST_SKIP() << "redis-server is not installed (make test installs it)";                       \
  if (!run("openssl version")) GTEST_SKIP() << "the openssl command is not installed (make test installs it)"

// Handshakes get 5 s: a loaded CI machine (tests in parallel) can take over
// 1 s to finish one, and the verification failures these tests expect would
// then read as timeouts. The tests that wait for a timeout pass a short one.
std::shared_ptr<SharedTier> open_tier(const std::string& url, TlsOptions tls = {},
                                      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  return std::make_shared<SharedTier>(open_redis_store(RedisAddress::parse(url), timeout, std::move(tls)),
                                      kSigningKey, quick_options(timeout));
}

TEST(RedisTlsTest, ParsesRedissUrls) {
  const RedisAddress a = RedisAddress::parse("rediss://:pw@cache.internal:6380/4");
  EXPECT_TRUE(a.tls);
  EXPECT_EQ(a.host, "cache.internal");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.database, 4);
  EXPECT_FALSE(RedisAddress::parse("redis://cache.internal").tls);
  EXPECT_NE(open_redis_store(a, std::chrono::milliseconds(100))->describe().find("TLS"), std::string::npos);
}

TEST(RedisTlsTest, EntriesRoundTripOverTlsToAVerifiedServer) {
  REQUIRE_TOOLS();
  Certificates certs("DNS:localhost,IP:127.0.0.1");
  ASSERT_TRUE(certs.ok()) << "openssl could not make the test certificates";
  LocalRedis redis(*binary, "tls-password", certs.server_args("no"));
  ASSERT_TRUE(redis.accepting()) << "redis-server did not start with TLS (built without it?)";
  const std::string port = std::to_string(redis.port());
  const TlsOptions trusted{certs.file("ca.crt"), "", ""};
  auto writer = open_tier("rediss://:tls-password@127.0.0.1:" + port + "/1", trusted);
  const Entry entry = sample_entry();
  writer->put(kKey, std::make_shared<const Entry>(entry));
  EXPECT_EQ(writer->stats().errors, 0u) << writer->last_error();
  // By host name too (checked against the certificate's DNS name, sent as SNI).
  auto reader = open_tier("rediss://:tls-password@localhost:" + port + "/1", trusted);
  auto hit = reader->get(kKey);
  ASSERT_NE(hit, nullptr) << reader->last_error();
  EXPECT_EQ(*hit, entry);
  reader->clear();
  EXPECT_EQ(writer->get(kKey), nullptr);
  EXPECT_EQ(writer->stats().errors, 0u) << writer->last_error();
}

TEST(RedisTlsTest, AServerThatDoesNotVerifyIsNeverUsed) {
  REQUIRE_TOOLS();
  Certificates certs("DNS:cache.example");  // names neither localhost nor 127.0.0.1
  ASSERT_TRUE(certs.ok());
  LocalRedis redis(*binary, "", certs.server_args("no"));
  ASSERT_TRUE(redis.accepting());
  const std::string port = std::to_string(redis.port());
  struct Case {
    const char* what;
    std::string host;
    TlsOptions tls;
    const char* expected;  // in the error
  };
  const std::vector<Case> cases = {
      {"the system's trust store only", "127.0.0.1", {}, "does not verify"},
      {"another CA", "127.0.0.1", {certs.file("other.crt"), "", ""}, "does not verify"},
      {"the right CA, another IP", "127.0.0.1", {certs.file("ca.crt"), "", ""}, "IP address mismatch"},
      {"the right CA, another name", "localhost", {certs.file("ca.crt"), "", ""}, "hostname mismatch"},
  };
  for (const Case& c : cases) {
    auto tier = open_tier("rediss://" + c.host + ":" + port, c.tls);
    EXPECT_EQ(tier->get(kKey), nullptr) << c.what;
    EXPECT_EQ(tier->stats().errors, 1u) << c.what;
    EXPECT_NE(tier->last_error().find(c.expected), std::string::npos) << c.what << ": " << tier->last_error();
  }
  // A CA file that cannot be read is named in the error.
  auto missing = open_tier("rediss://127.0.0.1:" + port, {certs.file("absent.crt"), "", ""});
  EXPECT_EQ(missing->get(kKey), nullptr);
  EXPECT_NE(missing->last_error().find("absent.crt"), std::string::npos) << missing->last_error();
}

TEST(RedisTlsTest, AClientCertificateIsPresentedWhenTheServerAsks) {
  REQUIRE_TOOLS();
  Certificates certs("IP:127.0.0.1");
  ASSERT_TRUE(certs.ok());
  LocalRedis redis(*binary, "", certs.server_args("yes"));
  ASSERT_TRUE(redis.accepting());
  const std::string url = "rediss://127.0.0.1:" + std::to_string(redis.port());
  auto anonymous = open_tier(url, {certs.file("ca.crt"), "", ""});
  EXPECT_EQ(anonymous->get(kKey), nullptr);
  EXPECT_EQ(anonymous->stats().errors, 1u) << "the server accepted a client without a certificate";
  auto known = open_tier(url, {certs.file("ca.crt"), certs.file("client.crt"), certs.file("client.key")});
  known->put(kKey, std::make_shared<const Entry>(sample_entry()));
  EXPECT_EQ(known->stats().errors, 0u) << known->last_error();
  auto hit = known->get(kKey);
  ASSERT_NE(hit, nullptr) << known->last_error();
  EXPECT_EQ(*hit, sample_entry());
  // A key that does not belong to the certificate is refused before connecting.
  auto mismatched = open_tier(url, {certs.file("ca.crt"), certs.file("client.crt"), certs.file("server.key")});
  EXPECT_EQ(mismatched->get(kKey), nullptr);
  EXPECT_NE(mismatched->last_error().find("client key"), std::string::npos) << mismatched->last_error();
}

TEST(RedisTlsTest, MismatchedProtocolsAndASilentServerCostTheTimeoutAtMost) {
  REQUIRE_TOOLS();
  Certificates certs("IP:127.0.0.1");
  ASSERT_TRUE(certs.ok());
  LocalRedis tls_server(*binary, "", certs.server_args("no"));
  LocalRedis plain_server(*binary, "");
  ASSERT_TRUE(tls_server.accepting() && plain_server.accepting());
  // A listener that accepts and never says a word: the handshake waits.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(listener, 4);
  const std::string silent_port = std::to_string(ntohs(addr.sin_port));
  const TlsOptions trusted{certs.file("ca.crt"), "", ""};
  struct Case {
    const char* what;
    std::string url;
  };
  const std::vector<Case> cases = {
      {"redis:// to a TLS port", "redis://127.0.0.1:" + std::to_string(tls_server.port())},
      {"rediss:// to a plain port", "rediss://127.0.0.1:" + std::to_string(plain_server.port())},
      {"rediss:// to a silent server", "rediss://127.0.0.1:" + silent_port},
  };
  for (const Case& c : cases) {
    auto tier = open_tier(c.url, trusted, std::chrono::milliseconds(1000));
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(tier->get(kKey), nullptr) << c.what;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2500)) << c.what;
    EXPECT_EQ(tier->stats().errors, 1u) << c.what;
  }
  ::close(listener);
}

TEST(RedisTlsTest, TheEnvironmentsTlsSettingsAreChecked) {
  using vtpu::testing::ScopedEnv;
  ScopedEnv key("VTPU_CACHE_KEY", kSigningKey.c_str());
  {
    // TLS files for a plain URL would go unused: an error naming both.
    ScopedEnv where("VTPU_SHARED_CACHE", "redis://127.0.0.1:1");
    ScopedEnv ca("VTPU_SHARED_CACHE_TLS_CA", "/etc/ssl/certs/ca-certificates.crt");
    try {
      SharedTier::from_env();
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("rediss://"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv where("VTPU_SHARED_CACHE", "rediss://127.0.0.1:1");
    ScopedEnv client_key("VTPU_SHARED_CACHE_TLS_KEY", "/tmp/key.pem");
    EXPECT_THROW(SharedTier::from_env(), Error);  // a key without its certificate
  }
  {
    ScopedEnv where("VTPU_SHARED_CACHE", "rediss://:secret@127.0.0.1:1");
    auto tier = SharedTier::from_env();
    ASSERT_NE(tier, nullptr);
    EXPECT_NE(tier->describe().find("TLS"), std::string::npos) << tier->describe();
    EXPECT_EQ(tier->describe().find("secret"), std::string::npos);
  }
}

}  // namespace
}  // namespace vtpu::cache
