// Attributes of an IR node: a small typed key/value set kept sorted by key, so
// that printing and hashing see one deterministic order whatever the order of
// insertion.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "vtpu/ir/dtype.h"

namespace vtpu::ir {

// The index of each alternative is part of the canonical hash encoding.
using AttrValue = std::variant<bool, std::int64_t, double, std::string,
                               std::vector<std::int64_t>, DType>;

class Attributes {
 public:
  using Entry = std::pair<std::string, AttrValue>;

  Attributes() = default;
  Attributes(std::initializer_list<Entry> entries);

  // Inserts or replaces.
  Attributes& set(std::string key, AttrValue value);
  bool erase(std::string_view key);
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const AttrValue* find(std::string_view key) const;

  // Typed reads. A present value of another type throws
  // Error(kInvalidArgument) naming the key; the versions without a default
  // also throw when the key is absent. get_double accepts an int value (alpha
  // may be given either way).
  bool get_bool(std::string_view key, bool fallback) const;
  std::int64_t get_int(std::string_view key) const;
  std::int64_t get_int(std::string_view key, std::int64_t fallback) const;
  double get_double(std::string_view key) const;
  double get_double(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key, std::string fallback) const;
  std::vector<std::int64_t> get_ints(std::string_view key) const;
  std::vector<std::int64_t> get_ints(std::string_view key,
                                     std::vector<std::int64_t> fallback) const;
  std::optional<DType> get_dtype(std::string_view key) const;

  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  bool operator==(const Attributes&) const = default;

 private:
  std::vector<Entry> entries_;  // sorted by key, unique keys
};

// "1", "0.5", "true", "\"floor\"", "[0,1]", "float32": how the printer shows
// a value. Doubles print as the shortest text that reads back exactly.
std::string to_string(const AttrValue& value);

}  // namespace vtpu::ir
