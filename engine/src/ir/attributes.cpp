#include "vtpu/ir/attributes.h"

#include <algorithm>
#include <charconv>

#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace {

constexpr const char* kTypeNames[] = {"bool", "int", "double", "string", "int list", "dtype"};

[[noreturn]] void fail(std::string_view key, const char* want, const AttrValue* got) {
  std::string msg = "attribute '" + std::string(key) + "' ";
  msg += got ? std::string("has type ") + kTypeNames[got->index()] + ", expected " + want
             : std::string("is required (") + want + ")";
  throw runtime::Error(runtime::ErrorKind::kInvalidArgument, msg);
}

template <class T>
const T* typed(const Attributes& a, std::string_view key, const char* want, bool required) {
  const AttrValue* v = a.find(key);
  if (!v) {
    if (required) fail(key, want, nullptr);
    return nullptr;
  }
  const T* p = std::get_if<T>(v);
  if (!p) fail(key, want, v);
  return p;
}

}  // namespace

Attributes::Attributes(std::initializer_list<Entry> entries) {
  for (const Entry& e : entries) set(e.first, e.second);
}

Attributes& Attributes::set(std::string key, AttrValue value) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                             [](const Entry& e, const std::string& k) { return e.first < k; });
  if (it != entries_.end() && it->first == key) {
    it->second = std::move(value);
  } else {
    entries_.insert(it, Entry{std::move(key), std::move(value)});
  }
  return *this;
}

bool Attributes::erase(std::string_view key) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.first == key; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

const AttrValue* Attributes::find(std::string_view key) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                             [](const Entry& e, std::string_view k) { return e.first < k; });
  return (it != entries_.end() && it->first == key) ? &it->second : nullptr;
}

bool Attributes::get_bool(std::string_view key, bool fallback) const {
  const bool* p = typed<bool>(*this, key, "bool", false);
  return p ? *p : fallback;
}

std::int64_t Attributes::get_int(std::string_view key) const {
  return *typed<std::int64_t>(*this, key, "int", true);
}

std::int64_t Attributes::get_int(std::string_view key, std::int64_t fallback) const {
  const std::int64_t* p = typed<std::int64_t>(*this, key, "int", false);
  return p ? *p : fallback;
}

double Attributes::get_double(std::string_view key) const {
  const AttrValue* v = find(key);
  if (!v) fail(key, "double", nullptr);
  return get_double(key, 0.0);
}

double Attributes::get_double(std::string_view key, double fallback) const {
  const AttrValue* v = find(key);
  if (!v) return fallback;
  if (const auto* i = std::get_if<std::int64_t>(v)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(v)) return *d;
  fail(key, "double", v);
}

std::string Attributes::get_string(std::string_view key, std::string fallback) const {
  const std::string* p = typed<std::string>(*this, key, "string", false);
  return p ? *p : fallback;
}

std::vector<std::int64_t> Attributes::get_ints(std::string_view key) const {
  return *typed<std::vector<std::int64_t>>(*this, key, "int list", true);
}

std::vector<std::int64_t> Attributes::get_ints(std::string_view key,
                                               std::vector<std::int64_t> fallback) const {
  const auto* p = typed<std::vector<std::int64_t>>(*this, key, "int list", false);
  return p ? *p : fallback;
}

std::optional<DType> Attributes::get_dtype(std::string_view key) const {
  const DType* p = typed<DType>(*this, key, "dtype", false);
  return p ? std::optional<DType>(*p) : std::nullopt;
}

std::string to_string(const AttrValue& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(std::int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, d);  // shortest round-trip form
      std::string s(buf, r.ptr);
      // Keep doubles visibly doubles: 1 -> 1.0 (but not inf/nan/1e+20).
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(const std::string& s) const { return "\"" + s + "\""; }
    std::string operator()(const std::vector<std::int64_t>& v) const {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) s += ",";
        s += std::to_string(v[i]);
      }
      return s + "]";
    }
    std::string operator()(DType t) const { return std::string(name(t)); }
  };
  return std::visit(Visitor{}, value);
}

}  // namespace vtpu::ir
