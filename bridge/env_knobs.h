// Numeric tuning knobs read from the environment once per process.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace vtpu::bridge {

// The value of `name` as a non-negative integer; unset or empty gives
// `fallback`, anything else that is not one is reported on stderr (a knob
// must never stop a program) and gives `fallback` too.
inline std::int64_t env_non_negative(const char* name, std::int64_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(env, &end, 10);
  if (*end != '\0' || value < 0 || errno == ERANGE || !std::isdigit(static_cast<unsigned char>(*env))) {
    std::fprintf(stderr, "vtpu: %s=%s is not a non-negative integer; using %lld\n", name, env,
                 static_cast<long long>(fallback));
    return fallback;
  }
  return static_cast<std::int64_t>(value);
}

}  // namespace vtpu::bridge
