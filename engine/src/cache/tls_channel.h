// TLS over a connected non-blocking socket, for the shared tier's Redis
// store ("rediss://"): OpenSSL, with the server's certificate verified
// against the system's trust store or a given CA bundle and its name checked
// against the host the URL names (a DNS name or an IP literal), and a client
// certificate for servers that ask for one (redis-server's default
// tls-auth-clients). The channel never blocks: each call does what the
// socket allows and says which poll() event it waits for, so the Redis
// connection keeps its one deadline per request.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "vtpu/cache/byte_store.h"

namespace vtpu::cache::detail {

// One step of TLS I/O: `bytes` moved (0 with `wait` set: nothing yet, poll
// for that event and call again).
struct TlsStep {
  std::size_t bytes = 0;
  short wait = 0;  // POLLIN or POLLOUT, or 0 when done
};

class TlsChannel {
 public:
  // `fd` stays owned by the caller and must outlive the channel. Throws
  // StoreUnavailable when the TLS settings cannot be used (an unreadable CA
  // bundle, a key that does not match its certificate).
  TlsChannel(int fd, const std::string& host, const TlsOptions& options);
  ~TlsChannel();
  TlsChannel(const TlsChannel&) = delete;
  TlsChannel& operator=(const TlsChannel&) = delete;

  // The handshake; done when the step waits for nothing. A certificate that
  // does not verify throws StoreUnavailable saying why.
  TlsStep handshake();
  TlsStep write(const char* data, std::size_t size);
  // bytes == 0 and wait == 0: the server closed the connection.
  TlsStep read(char* data, std::size_t size);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vtpu::cache::detail
