// Test helpers for the shared tier's Redis store: a free loopback port and a
// throwaway redis-server on it (plain or TLS), killed with the object.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace vtpu::testing {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

inline std::optional<std::string> redis_server_binary() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    const std::string path = std::string(dir) + "/redis-server";
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return std::nullopt;
}

class LocalRedis {
 public:
  // `tls_args`: redis-server's --tls-* settings; when given, the port
  // speaks TLS only.
  LocalRedis(const std::string& binary, const std::string& password, std::vector<std::string> tls_args = {})
      : port_(free_port()) {
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<std::string> args = {binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                       "--loglevel", "warning"};
      if (tls_args.empty()) {
        args.insert(args.end(), {"--port", std::to_string(port_)});
      } else {
        args.insert(args.end(), {"--port", "0", "--tls-port", std::to_string(port_)});
        args.insert(args.end(), tls_args.begin(), tls_args.end());
      }
      if (!password.empty()) args.insert(args.end(), {"--requirepass", password});
      std::vector<char*> argv;
      for (auto& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    // Ready when it accepts connections (bounded wait).
    for (int i = 0; i < 100 && !accepting(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~LocalRedis() { stop(); }
  LocalRedis(const LocalRedis&) = delete;
  LocalRedis& operator=(const LocalRedis&) = delete;
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  int port() const { return port_; }
  bool accepting() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace vtpu::testing
