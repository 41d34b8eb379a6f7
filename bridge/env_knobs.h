// Tuning knobs and switches read from the environment once per process.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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

// An on/off switch: unset or empty gives `fallback`; 1/true/yes/on and
// 0/false/no/off (any case) say it; anything else is reported on stderr and
// gives `fallback`. One reading for every switch: `VTPU_GENERATED_KERNELS=false`
// used to leave generated kernels on (only "0" turned them off) and
// `VTPU_PROFILE_OPS=true` left profiling off (only "1" turned it on).
inline bool env_switch(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  std::string value;
  for (const char* c = env; *c != '\0'; ++c)
    if (!std::isspace(static_cast<unsigned char>(*c))) value.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(*c))));
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off") return false;
  std::fprintf(stderr, "vtpu: %s=%s is not one of 1/true/yes/on or 0/false/no/off; using %s\n", name, env,
               fallback ? "on" : "off");
  return fallback;
}

}  // namespace vtpu::bridge
