#include "vtpu/runtime/memory_size.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string_view>

#include "vtpu/runtime/error.h"

namespace vtpu::runtime {
namespace {

std::size_t unit_multiplier(std::string unit, const std::string& text) {
  for (auto& c : unit) c = static_cast<char>(std::tolower(c));
  if (unit.empty() || unit == "b") return 1;
  if (unit == "k" || unit == "kb") return 1000ull;
  if (unit == "kib") return 1ull << 10;
  if (unit == "m" || unit == "mb") return 1000ull * 1000;
  if (unit == "mib") return 1ull << 20;
  if (unit == "g" || unit == "gb") return 1000ull * 1000 * 1000;
  if (unit == "gib") return 1ull << 30;
  if (unit == "t" || unit == "tb") return 1000ull * 1000 * 1000 * 1000;
  if (unit == "tib") return 1ull << 40;
  throw Error(ErrorKind::kInvalidArgument,
              "[memory size] unknown unit '" + unit + "' in '" + text +
                  "' (use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB)");
}

}  // namespace

std::size_t parse_memory_size(const std::string& text) {
  std::size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  const std::size_t number_start = pos;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.'))
    ++pos;
  if (pos == number_start)
    throw Error(ErrorKind::kInvalidArgument,
                "[memory size] expected a number such as '8GiB', got '" + text + "'");
  // The digits-and-dots span must be exactly one number ("1.2.3", "." are not).
  const std::string number_text = text.substr(number_start, pos - number_start);
  char* number_end = nullptr;
  const double number = std::strtod(number_text.c_str(), &number_end);
  if (number_end != number_text.c_str() + number_text.size())
    throw Error(ErrorKind::kInvalidArgument,
                "[memory size] malformed number in '" + text + "'");
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  std::string unit = text.substr(pos);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  const double bytes = number * static_cast<double>(unit_multiplier(unit, text));
  if (bytes < 0 || bytes > 1.8e19)
    throw Error(ErrorKind::kInvalidArgument, "[memory size] out of range: '" + text + "'");
  return static_cast<std::size_t>(bytes);
}

std::size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::size_t{8} << 30;  // conservative guess
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
}

std::size_t default_device_capacity(double default_fraction, std::string* ignored_setting) {
  const auto fallback = static_cast<std::size_t>(static_cast<double>(physical_memory_bytes()) * default_fraction);
  const char* env = std::getenv("VTPU_MEMORY_LIMIT");
  if (env == nullptr || *env == '\0') return fallback;
  try {
    return parse_memory_size(env);
  } catch (const Error& e) {
    const std::string why = std::string("VTPU_MEMORY_LIMIT: ") + e.what();
    if (ignored_setting == nullptr) throw Error(ErrorKind::kInvalidArgument, why);
    *ignored_setting = why;
    return fallback;
  }
}

}  // namespace vtpu::runtime
