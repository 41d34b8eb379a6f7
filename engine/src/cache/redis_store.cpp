// The shared tier's Redis store: a minimal client for the commands it needs
// (AUTH, SELECT, GET, SET, DEL, SCAN) over RESP2, the protocol every Redis
// (and Valkey, KeyDB, ...) server speaks.
//
// One connection per store, opened on first use and reopened after a
// failure; a mutex serialises requests (the fused window's background
// compiler and the issuing thread may both look up kernels). Connecting and
// every request are bounded by the timeout: a dead server must cost a lookup
// that long at most, never hang a training step (the shared tier also stops
// asking for a while after a failure). Sends use MSG_NOSIGNAL so a server that
// closed the connection cannot kill the process with SIGPIPE.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>

#include "posix_file.h"
#include "vtpu/cache/byte_store.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

using runtime::Error;
using runtime::ErrorKind;

constexpr std::string_view kNamePrefix = "vtpu:entry:";
// Larger bulk replies are not ours (kernels are kilobytes to a few megabytes).
constexpr std::int64_t kMaxBulkBytes = std::int64_t{1} << 30;

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
    throw Error(ErrorKind::kRuntime, std::string("malformed ") + what + " in reply: '" + std::string(text) + "'");
  return value;
}

class Connection {
 public:
  Connection(const RedisAddress& address, std::chrono::milliseconds timeout) : timeout_(timeout) {
    open(address);
  }

  Reply command(std::initializer_list<std::string_view> args) {
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

  void open(const RedisAddress& address) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(address.port);
    if (int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0)
      throw Error(ErrorKind::kRuntime, std::string("cannot resolve host: ") + ::gai_strerror(rc));
    std::string last_error = "no address";
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
        pollfd p{fd.get(), POLLOUT, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(timeout_.count()));
        int so_error = 0;
        socklen_t len = sizeof(so_error);
        if (ready <= 0) {
          last_error = ready == 0 ? "connection timed out" : std::strerror(errno);
          continue;
        }
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0) {
          last_error = std::strerror(so_error != 0 ? so_error : errno);
          continue;
        }
      }
      fd_ = std::move(fd);
    }
    ::freeaddrinfo(found);
    if (!fd_.valid()) throw Error(ErrorKind::kRuntime, "cannot connect: " + last_error);
    // Blocking from here on, each send/recv bounded by the timeout.
    const int flags = ::fcntl(fd_.get(), F_GETFL);
    ::fcntl(fd_.get(), F_SETFL, flags & ~O_NONBLOCK);
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout_.count() % 1000) * 1000);
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    const int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!address.password.empty()) {
      const Reply auth = address.user.empty() ? command({"AUTH", address.password})
                                              : command({"AUTH", address.user, address.password});
      expect_ok(auth, "AUTH");
    }
    if (address.database != 0) expect_ok(command({"SELECT", std::to_string(address.database)}), "SELECT");
  }

  static void expect_ok(const Reply& reply, const char* what) {
    if (reply.type == '-') throw Error(ErrorKind::kRuntime, std::string(what) + " refused: " + reply.text);
  }

  void send_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw io_error("send");
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  Error io_error(const char* what) const {
    const int err = errno;
    return Error(ErrorKind::kRuntime, std::string(what) + ": " +
                                          (err == EAGAIN || err == EWOULDBLOCK ? std::string("timed out")
                                                                               : std::string(std::strerror(err))));
  }

  // More bytes from the socket into buffer_; throws on EOF, error or timeout.
  void fill() {
    char chunk[65536];
    for (;;) {
      const ssize_t n = ::recv(fd_.get(), chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) throw Error(ErrorKind::kRuntime, "the server closed the connection");
      if (n < 0) throw io_error("receive");
      buffer_.append(chunk, static_cast<std::size_t>(n));
      return;
    }
  }

  std::string read_line() {
    for (;;) {
      const std::size_t end = buffer_.find("\r\n", pos_);
      if (end != std::string::npos) {
        std::string line = buffer_.substr(pos_, end - pos_);
        pos_ = end + 2;
        return line;
      }
      compact();
      fill();
    }
  }

  std::string read_exact(std::size_t size) {
    while (buffer_.size() - pos_ < size + 2) {
      compact();
      fill();
    }
    if (buffer_.compare(pos_ + size, 2, "\r\n") != 0)
      throw Error(ErrorKind::kRuntime, "malformed bulk reply (no CRLF after the payload)");
    std::string out = buffer_.substr(pos_, size);
    pos_ += size + 2;
    return out;
  }

  void compact() {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }

  Reply read_reply(int depth) {
    if (depth > 4) throw Error(ErrorKind::kRuntime, "reply nested too deeply");
    const std::string line = read_line();
    if (line.empty()) throw Error(ErrorKind::kRuntime, "empty reply line");
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
        if (size < 0 || size > kMaxBulkBytes) throw Error(ErrorKind::kRuntime, "bulk length out of range");
        r.text = read_exact(static_cast<std::size_t>(size));
        return r;
      }
      case '*': {
        const std::int64_t count = parse_int(rest, "array length");
        if (count == -1) {
          r.nil = true;
          return r;
        }
        if (count < 0 || count > 1'000'000) throw Error(ErrorKind::kRuntime, "array length out of range");
        for (std::int64_t i = 0; i < count; ++i) r.elements.push_back(read_reply(depth + 1));
        return r;
      }
      default:
        throw Error(ErrorKind::kRuntime, "unknown reply type '" + std::string(1, r.type) + "'");
    }
  }

  std::chrono::milliseconds timeout_;
  detail::Fd fd_;
  std::string buffer_;
  std::size_t pos_ = 0;
};

class RedisStore final : public ByteStore {
 public:
  RedisStore(RedisAddress address, std::chrono::milliseconds timeout)
      : address_(std::move(address)), timeout_(timeout) {}

  std::string describe() const override { return "redis " + address_.describe(); }

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
    try {
      if (!connection_) connection_ = std::make_unique<Connection>(address_, timeout_);
      Reply r = connection_->command(args);
      if (r.type == '-') throw Error(ErrorKind::kRuntime, "server error: " + r.text);
      return r;
    } catch (const Error& e) {
      connection_.reset();  // the stream may be mid-reply: start over next time
      throw Error(ErrorKind::kRuntime, "[compile cache] shared tier " + describe() + ": " + e.what());
    }
  }

  Error unexpected(const char* command, const Reply& r) const {
    return Error(ErrorKind::kRuntime, "[compile cache] shared tier " + describe() + ": unexpected reply to " +
                                          command + " (type '" + std::string(1, r.type) + "')");
  }

  const RedisAddress address_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace

RedisAddress RedisAddress::parse(std::string_view url) {
  const auto invalid = [&](const std::string& why) {
    return Error(ErrorKind::kInvalidArgument, "VTPU_SHARED_CACHE: '" + std::string(url) + "': " + why +
                                                  " (expected redis://[[user]:password@]host[:port][/db])");
  };
  constexpr std::string_view kScheme = "redis://";
  if (url.starts_with("rediss://")) throw invalid("TLS (rediss://) is not supported");
  if (!url.starts_with(kScheme)) throw invalid("not a redis:// URL");
  std::string_view rest = url.substr(kScheme.size());
  RedisAddress a;
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = userinfo.find(':');
    if (colon == std::string_view::npos) throw invalid("credentials need a ':' before the password");
    a.user = userinfo.substr(0, colon);
    a.password = userinfo.substr(colon + 1);
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

std::unique_ptr<ByteStore> open_redis_store(RedisAddress address, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) throw Error(ErrorKind::kInvalidArgument, "[compile cache] redis timeout must be positive");
  return std::make_unique<RedisStore>(std::move(address), timeout);
}

}  // namespace vtpu::cache
