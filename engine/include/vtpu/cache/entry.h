// A compile-cache entry: the compiled artefact (a shared object, opaque to the
// cache) plus a little metadata the compiler wants back with it (e.g. the
// kernel symbol name, the compiler command line for diagnostics).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vtpu::cache {

struct Entry {
  std::vector<std::uint8_t> data;
  std::map<std::string, std::string> metadata;

  friend bool operator==(const Entry&, const Entry&) = default;

  // Bytes this entry accounts for in the in-memory tier's bound.
  std::size_t footprint() const noexcept {
    std::size_t n = data.size();
    for (const auto& [k, v] : metadata) n += k.size() + v.size();
    return n;
  }

  static Entry from_string(std::string_view bytes, std::map<std::string, std::string> metadata = {}) {
    return Entry{std::vector<std::uint8_t>(bytes.begin(), bytes.end()), std::move(metadata)};
  }
};

}  // namespace vtpu::cache
