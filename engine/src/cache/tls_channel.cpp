#include "tls_channel.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>

#include <climits>

namespace vtpu::cache::detail {
namespace {

struct CtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};

// OpenSSL's queued errors for this thread, oldest first, and the queue
// emptied (a later call must not report them again).
std::string openssl_errors() {
  std::string out;
  while (const unsigned long code = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(code, text, sizeof(text));
    if (!out.empty()) out.append("; ");
    out.append(text);
  }
  return out.empty() ? "unknown TLS error" : out;
}

bool is_ip_literal(const std::string& host) {
  unsigned char buffer[16];
  return ::inet_pton(AF_INET, host.c_str(), buffer) == 1 || ::inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

}  // namespace

struct TlsChannel::State {
  std::unique_ptr<SSL_CTX, CtxFree> ctx;
  std::unique_ptr<SSL, SslFree> ssl;
};

TlsChannel::TlsChannel(int fd, const std::string& host, const TlsOptions& options) : state_(new State) {
  ERR_clear_error();
  state_->ctx.reset(SSL_CTX_new(TLS_client_method()));
  SSL_CTX* ctx = state_->ctx.get();
  if (ctx == nullptr) throw StoreUnavailable("TLS: " + openssl_errors());
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const bool trusted = options.ca_file.empty()
                           ? SSL_CTX_set_default_verify_paths(ctx) == 1
                           : SSL_CTX_load_verify_locations(ctx, options.ca_file.c_str(), nullptr) == 1;
  if (!trusted)
    throw StoreUnavailable("TLS: cannot load the trusted CAs" +
                           (options.ca_file.empty() ? std::string(" of the system") : " from '" + options.ca_file + "'") +
                           ": " + openssl_errors());
  if (!options.cert_file.empty()) {
    const std::string& key = options.key_file.empty() ? options.cert_file : options.key_file;
    if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1)
      throw StoreUnavailable("TLS: cannot load the client certificate '" + options.cert_file + "': " + openssl_errors());
    if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1)
      throw StoreUnavailable("TLS: cannot use the client key '" + key + "': " + openssl_errors());
  }
  state_->ssl.reset(SSL_new(ctx));
  SSL* ssl = state_->ssl.get();
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) throw StoreUnavailable("TLS: " + openssl_errors());
  // The name the certificate must carry: an IP literal is checked against
  // the certificate's IP addresses, a host name against its DNS names (and
  // sent as SNI, which an IP literal must not be).
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (is_ip_literal(host)) {
    if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1) throw StoreUnavailable("TLS: " + openssl_errors());
  } else {
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (SSL_set1_host(ssl, host.c_str()) != 1 || SSL_set_tlsext_host_name(ssl, host.c_str()) != 1)
      throw StoreUnavailable("TLS: " + openssl_errors());
  }
  SSL_set_connect_state(ssl);
}

TlsChannel::~TlsChannel() = default;

namespace {

// What an SSL_* call's return value means for the caller.
TlsStep step_after(SSL* ssl, int rc, const char* what) {
  const int error = SSL_get_error(ssl, rc);
  switch (error) {
    case SSL_ERROR_WANT_READ: return {0, POLLIN};
    case SSL_ERROR_WANT_WRITE: return {0, POLLOUT};
    case SSL_ERROR_ZERO_RETURN: return {0, 0};
    default: break;
  }
  if (error == SSL_ERROR_SSL && SSL_get_verify_result(ssl) != X509_V_OK) {
    const long verify = SSL_get_verify_result(ssl);
    ERR_clear_error();
    throw StoreUnavailable(std::string("TLS ") + what + ": the server's certificate does not verify (" +
                           X509_verify_cert_error_string(verify) + ")");
  }
  if (error == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
    throw StoreUnavailable(std::string("TLS ") + what + ": the connection was closed or reset");
  throw StoreUnavailable(std::string("TLS ") + what + ": " + openssl_errors());
}

int clamp(std::size_t size) { return size > static_cast<std::size_t>(INT_MAX) ? INT_MAX : static_cast<int>(size); }

}  // namespace

TlsStep TlsChannel::handshake() {
  ERR_clear_error();
  SSL* ssl = state_->ssl.get();
  const int rc = SSL_do_handshake(ssl);
  if (rc == 1) return {0, 0};
  const TlsStep step = step_after(ssl, rc, "handshake");
  if (step.wait == 0) throw StoreUnavailable("TLS handshake: the server closed the connection");
  return step;
}

TlsStep TlsChannel::write(const char* data, std::size_t size) {
  ERR_clear_error();
  SSL* ssl = state_->ssl.get();
  const int rc = SSL_write(ssl, data, clamp(size));
  if (rc > 0) return {static_cast<std::size_t>(rc), 0};
  const TlsStep step = step_after(ssl, rc, "send");
  if (step.wait == 0) throw StoreUnavailable("TLS send: the server closed the connection");
  return step;
}

TlsStep TlsChannel::read(char* data, std::size_t size) {
  ERR_clear_error();
  SSL* ssl = state_->ssl.get();
  const int rc = SSL_read(ssl, data, clamp(size));
  if (rc > 0) return {static_cast<std::size_t>(rc), 0};
  return step_after(ssl, rc, "receive");
}

}  // namespace vtpu::cache::detail
