// The shared tier's Redis store: a minimal client for the commands it needs
// (AUTH, SELECT, GET, SET, DEL, SCAN) over RESP2, the protocol every Redis
// (and Valkey, KeyDB, ...) server speaks.
//
// One connection per store, opened on first use and reopened after a
// failure; a mutex serialises requests (the fused window's background
// compiler and the issuing thread may both look up kernels). Connecting and
// each whole request run against one deadline (a server dripping a byte at a
// time must not stretch it), reply lines are capped and bulk replies are
// refused above kMaxStoredEntryBytes before anything is allocated: a dead or
// hostile server costs a lookup the timeout at most, never a hang or the
// process's memory (the shared tier also stops asking for a while after it
// fails). Sends use MSG_NOSIGNAL so a server that closed the connection
// cannot kill the process with SIGPIPE. Host name resolution is the system
// resolver's and is not bounded by the timeout. "rediss://" runs the same
// protocol over TLS (tls_channel.h), the handshake within the connection's
// deadline.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>

#include "posix_file.h"
#include "tls_channel.h"
#include "vtpu/cache/byte_store.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

using runtime::Error;
using runtime::ErrorKind;

constexpr std::string_view kNamePrefix = "vtpu:entry:";
constexpr std::int64_t kMaxBulkBytes = static_cast<std::int64_t>(kMaxStoredEntryBytes);
constexpr std::size_t kMaxLineBytes = 64 * 1024;

using Clock = std::chrono::steady_clock;

// Server bytes in messages: printable ASCII as it is, the rest as \xNN.
std::string printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

struct Reply {
  char type = 0;  // '+', '-', ':', '$', '*'
  bool nil = false;
  std::string text;  // simple string, error or bulk payload
  std::int64_t integer = 0;
  std::vector<Reply> elements;
};

std::int64_t parse_int(std::string_view text, const char* what) {
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw StoreUnavailable(std::string("malformed ") + what + " in reply: '" + printable(text) + "'");
  return value;
}

class Connection {
 public:
  Connection(const RedisAddress& address, std::chrono::milliseconds timeout, const TlsOptions& tls)
      : timeout_(timeout) {
    deadline_ = Clock::now() + timeout_;
    open(address, tls);
  }

  Reply command(std::initializer_list<std::string_view> args) {
    deadline_ = Clock::now() + timeout_;
    std::string out;
    append_header(out, '*', args.size());
    for (std::string_view arg : args) {
      append_header(out, '$', arg.size());
      out.append(arg);
      out.append("\r\n");
    }
    send_all(out);
    return read_reply(0);
  }

 private:
  static void append_header(std::string& out, char type, std::size_t count) {
    out.push_back(type);
    out.append(std::to_string(count));
    out.append("\r\n");
  }

  void open(const RedisAddress& address, const TlsOptions& tls) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(address.port);
    if (int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0)
      throw StoreUnavailable(std::string("cannot resolve host: ") + ::gai_strerror(rc));
    std::string last_error = "no address";
    // Every address tried shares the one deadline.
    for (addrinfo* ai = found; ai != nullptr && !fd_.valid(); ai = ai->ai_next) {
      detail::Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (!fd.valid()) {
        last_error = std::strerror(errno);
        continue;
      }
      if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
          last_error = std::strerror(errno);
          continue;
        }
        if (!wait_for(fd.get(), POLLOUT)) {
          last_error = "connection timed out";
          continue;
        }
        int so_error = 0;
        socklen_t len = sizeof(so_error);
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0) {
          last_error = std::strerror(so_error != 0 ? so_error : errno);
          continue;
        }
      }
      fd_ = std::move(fd);
    }
    ::freeaddrinfo(found);
    if (!fd_.valid()) throw StoreUnavailable("cannot connect: " + last_error);
    // The socket stays non-blocking: every send and receive waits in poll()
    // for what is left of the request's deadline.
    const int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (address.tls) {
      tls_ = std::make_unique<detail::TlsChannel>(fd_.get(), address.host, tls);
      for (detail::TlsStep step = tls_->handshake(); step.wait != 0; step = tls_->handshake())
        if (!wait_for(fd_.get(), step.wait)) throw StoreUnavailable("TLS handshake: timed out");
    }
    if (!address.password.empty()) {
      const Reply auth = address.user.empty() ? command({"AUTH", address.password})
                                              : command({"AUTH", address.user, address.password});
      expect_ok(auth, "AUTH");
    }
    if (address.database != 0) expect_ok(command({"SELECT", std::to_string(address.database)}), "SELECT");
  }

  // A refused AUTH or SELECT makes the whole store unusable.
  static void expect_ok(const Reply& reply, const char* what) {
    if (reply.type == '-') throw StoreUnavailable(std::string(what) + " refused: " + printable(reply.text));
  }

  // Waits for `events` on `fd` until the deadline; false when it passed.
  bool wait_for(int fd, short events) const {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, events, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) throw StoreUnavailable(std::string("poll: ") + std::strerror(errno));
    }
  }

  void send_all(std::string_view bytes) {
    while (tls_ && !bytes.empty()) {
      const detail::TlsStep step = tls_->write(bytes.data(), bytes.size());
      bytes.remove_prefix(step.bytes);
      if (step.wait != 0 && !wait_for(fd_.get(), step.wait)) throw StoreUnavailable("send: timed out");
    }
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!wait_for(fd_.get(), POLLOUT)) throw StoreUnavailable("send: timed out");
        continue;
      }
      throw StoreUnavailable(std::string("send: ") + std::strerror(errno));
    }
  }

  // More bytes from the socket into buffer_, within the deadline.
  void fill() {
    char chunk[65536];
    while (tls_) {
      const detail::TlsStep step = tls_->read(chunk, sizeof(chunk));
      if (step.bytes > 0) {
        buffer_.append(chunk, step.bytes);
        return;
      }
      if (step.wait == 0) throw StoreUnavailable("the server closed the connection");
      if (!wait_for(fd_.get(), step.wait)) throw StoreUnavailable("receive: timed out");
    }
    for (;;) {
      const ssize_t n = ::recv(fd_.get(), chunk, sizeof(chunk), 0);
      if (n > 0) {
        buffer_.append(chunk, static_cast<std::size_t>(n));
        return;
      }
      if (n == 0) throw StoreUnavailable("the server closed the connection");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) throw StoreUnavailable(std::string("receive: ") + std::strerror(errno));
      if (!wait_for(fd_.get(), POLLIN)) throw StoreUnavailable("receive: timed out");
    }
  }

  std::string read_line() {
    std::size_t scanned = pos_;  // resume the search where it stopped: no rescans
    for (;;) {
      const std::size_t end = buffer_.find("\r\n", scanned);
      if (end != std::string::npos) {
        if (end - pos_ > kMaxLineBytes) throw StoreUnavailable("reply line too long");
        std::string line = buffer_.substr(pos_, end - pos_);
        pos_ = end + 2;
        return line;
      }
      if (buffer_.size() - pos_ > kMaxLineBytes) throw StoreUnavailable("reply line too long");
      // Resume at the last byte held: a CR there may pair with an LF to come.
      const std::size_t pending = buffer_.size() - pos_;
      compact();
      scanned = pending > 0 ? pending - 1 : 0;
      fill();
    }
  }

  std::string read_exact(std::size_t size) {
    while (buffer_.size() - pos_ < size + 2) {
      compact();
      fill();
    }
    if (buffer_.compare(pos_ + size, 2, "\r\n") != 0)
      throw StoreUnavailable("malformed bulk reply (no CRLF after the payload)");
    std::string out = buffer_.substr(pos_, size);
    pos_ += size + 2;
    return out;
  }

  void compact() {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }

  Reply read_reply(int depth) {
    if (depth > 4) throw StoreUnavailable("reply nested too deeply");
    const std::string line = read_line();
    if (line.empty()) throw StoreUnavailable("empty reply line");
    Reply r;
    r.type = line[0];
    const std::string_view rest = std::string_view(line).substr(1);
    switch (r.type) {
      case '+':
      case '-':
        r.text = rest;
        return r;
      case ':':
        r.integer = parse_int(rest, "integer");
        return r;
      case '$': {
        const std::int64_t size = parse_int(rest, "bulk length");
        if (size == -1) {
          r.nil = true;
          return r;
        }
        if (size < 0 || size > kMaxBulkBytes) throw StoreUnavailable("bulk length out of range: " + std::to_string(size));
        r.text = read_exact(static_cast<std::size_t>(size));
        return r;
      }
      case '*': {
        const std::int64_t count = parse_int(rest, "array length");
        if (count == -1) {
          r.nil = true;
          return r;
        }
        if (count < 0 || count > 1'000'000) throw StoreUnavailable("array length out of range");
        for (std::int64_t i = 0; i < count; ++i) r.elements.push_back(read_reply(depth + 1));
        return r;
      }
      default:
        throw StoreUnavailable("unknown reply type '" + printable(std::string_view(&r.type, 1)) + "'");
    }
  }

  std::chrono::milliseconds timeout_;
  Clock::time_point deadline_;
  detail::Fd fd_;
  std::unique_ptr<detail::TlsChannel> tls_;  // "rediss://": every byte goes through it
  std::string buffer_;
  std::size_t pos_ = 0;
};

class RedisStore final : public ByteStore {
 public:
  RedisStore(RedisAddress address, std::chrono::milliseconds timeout, TlsOptions tls)
      : address_(std::move(address)), timeout_(timeout), tls_(std::move(tls)) {}

  std::string describe() const override { return (address_.tls ? "redis (TLS) " : "redis ") + address_.describe(); }

  std::optional<std::vector<std::uint8_t>> fetch(const std::string& name) override {
    const Reply r = request({"GET", std::string(kNamePrefix) + name});
    if (r.nil) return std::nullopt;
    if (r.type != '$') throw unexpected("GET", r);
    return std::vector<std::uint8_t>(r.text.begin(), r.text.end());
  }

  void store(const std::string& name, std::span<const std::uint8_t> bytes) override {
    const std::string_view value(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    const Reply r = request({"SET", std::string(kNamePrefix) + name, value});
    if (r.type != '+') throw unexpected("SET", r);
  }

  bool remove(const std::string& name) override {
    const Reply r = request({"DEL", std::string(kNamePrefix) + name});
    if (r.type != ':') throw unexpected("DEL", r);
    return r.integer > 0;
  }

  void clear() override {
    // SCAN, not KEYS: it does not block a server other clients share.
    std::string cursor = "0";
    do {
      const Reply r = request({"SCAN", cursor, "MATCH", std::string(kNamePrefix) + "*", "COUNT", "1000"});
      if (r.type != '*' || r.elements.size() != 2 || r.elements[1].type != '*') throw unexpected("SCAN", r);
      cursor = r.elements[0].text;
      for (const Reply& key : r.elements[1].elements) request({"DEL", key.text});
    } while (cursor != "0");
  }

  StoreUsage usage() override { return {}; }

 private:
  Reply request(std::initializer_list<std::string_view> args) {
    std::lock_guard<std::mutex> lock(mutex_);
    Reply r;
    try {
      if (!connection_) connection_ = std::make_unique<Connection>(address_, timeout_, tls_);
      r = connection_->command(args);
    } catch (const StoreUnavailable& e) {
      connection_.reset();  // the stream may be mid-reply: start over next time
      throw StoreUnavailable("[compile cache] shared tier " + describe() + ": " + e.what());
    } catch (const std::exception& e) {
      connection_.reset();
      throw StoreUnavailable("[compile cache] shared tier " + describe() + ": " + e.what());
    }
    // The server refused this request (a key of another type, ...): about
    // this key only, the connection stays usable.
    if (r.type == '-') throw Error(ErrorKind::kRuntime, "[compile cache] shared tier " + describe() +
                                                            ": server error: " + printable(r.text));
    return r;
  }

  Error unexpected(const char* command, const Reply& r) const {
    return Error(ErrorKind::kRuntime, "[compile cache] shared tier " + describe() + ": unexpected reply to " +
                                          command + " (type '" + printable(std::string_view(&r.type, 1)) + "')");
  }

  const RedisAddress address_;
  const std::chrono::milliseconds timeout_;
  const TlsOptions tls_;
  std::mutex mutex_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace

namespace {

// RFC 3986 percent-decoding of URL credentials ("p%40ss" is "p@ss").
std::optional<std::string> percent_decoded(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    unsigned value = 0;
    if (i + 2 >= text.size()) return std::nullopt;  // needs two hex digits after '%'
    auto [end, ec] = std::from_chars(text.data() + i + 1, text.data() + i + 3, value, 16);
    if (ec != std::errc() || end != text.data() + i + 3) return std::nullopt;
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

}  // namespace

std::string redact_url(std::string_view url) {
  const auto scheme = url.find("://");
  const auto at = url.rfind('@');
  if (scheme == std::string_view::npos || at == std::string_view::npos || at < scheme) return std::string(url);
  const std::string_view userinfo = url.substr(scheme + 3, at - scheme - 3);
  const auto colon = userinfo.find(':');
  if (colon == std::string_view::npos) return std::string(url);
  return std::string(url.substr(0, scheme + 3 + colon + 1)) + "***" + std::string(url.substr(at));
}

RedisAddress RedisAddress::parse(std::string_view url) {
  const auto invalid = [&](const std::string& why) {
    return Error(ErrorKind::kInvalidArgument, "VTPU_SHARED_CACHE: '" + redact_url(url) + "': " + why +
                                                  " (expected redis[s]://[[user]:password@]host[:port][/db])");
  };
  RedisAddress a;
  std::string_view rest;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("rediss://")) {
    rest = url.substr(9);
    a.tls = true;
  } else {
    throw invalid("not a redis:// or rediss:// URL");
  }
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = userinfo.find(':');
    if (colon == std::string_view::npos) throw invalid("credentials need a ':' before the password");
    const auto user = percent_decoded(userinfo.substr(0, colon));
    const auto password = percent_decoded(userinfo.substr(colon + 1));
    if (!user || !password) throw invalid("malformed %-escape in the credentials");
    a.user = *user;
    a.password = *password;
    if (a.password.empty()) throw invalid("empty password");
  }
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!db.empty()) {
      auto [end, ec] = std::from_chars(db.data(), db.data() + db.size(), a.database);
      if (ec != std::errc() || end != db.data() + db.size() || a.database < 0)
        throw invalid("database must be a non-negative number");
    }
  }
  std::string_view host = rest;
  if (rest.starts_with('[')) {  // [IPv6]:port
    const auto close = rest.find(']');
    if (close == std::string_view::npos) throw invalid("unclosed '[' in the host");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(':')) throw invalid("junk after the IPv6 address");
  } else if (const auto colon = rest.find(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    rest = rest.substr(colon);
  } else {
    rest = {};
  }
  if (rest.starts_with(':')) {
    const std::string_view port = rest.substr(1);
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535)
      throw invalid("port must be 1-65535");
    a.port = static_cast<std::uint16_t>(value);
  }
  if (host.empty()) throw invalid("no host");
  a.host = host;
  return a;
}

std::string RedisAddress::describe() const {
  const bool v6 = host.find(':') != std::string::npos;
  std::string out;
  if (v6) out.push_back('[');
  out.append(host);
  if (v6) out.push_back(']');
  out.push_back(':');
  out.append(std::to_string(port));
  if (database != 0) {
    out.push_back('/');
    out.append(std::to_string(database));
  }
  return out;
}

std::unique_ptr<ByteStore> open_redis_store(RedisAddress address, std::chrono::milliseconds timeout,
                                            TlsOptions tls) {
  if (timeout.count() <= 0) throw Error(ErrorKind::kInvalidArgument, "[compile cache] redis timeout must be positive");
  return std::make_unique<RedisStore>(std::move(address), timeout, std::move(tls));
}

}  // namespace vtpu::cache
