#include "vtpu/cache/entry_codec.h"

#include <cstring>
#include <limits>

#include "vtpu/cache/hash128.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

constexpr char kMagic[8] = {'V', 'T', 'P', 'U', 'C', 'A', 'C', 'H'};
constexpr std::uint64_t kChecksumSeed = 0x76747075'73756d31ull;  // "vtpusum1"

void store_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out) : out_(out) {}
  void u32(std::uint32_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void str32(const std::string& s) {
    if (s.size() > std::numeric_limits<std::uint32_t>::max())
      throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                           "[compile cache] metadata string longer than 4 GiB");
    u32(static_cast<std::uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  std::vector<std::uint8_t>& out_;
};

// Bounds-checked reader: every read states how much it needs, so lengths
// taken from a corrupt file cannot walk past the buffer.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) : in_(in) {}
  bool u32(std::uint32_t& v) {
    std::uint64_t w;
    if (!le(w, 4)) return false;
    v = static_cast<std::uint32_t>(w);
    return true;
  }
  bool u64(std::uint64_t& v) { return le(v, 8); }
  bool str32(std::string& s) {
    std::uint32_t n;
    if (!u32(n) || n > remaining()) return false;
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool bytes(std::vector<std::uint8_t>& out, std::uint64_t n) {
    if (n > remaining()) return false;
    out.assign(in_.begin() + pos_, in_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }
  std::size_t remaining() const { return in_.size() - pos_; }

 private:
  bool le(std::uint64_t& v, int n) {
    if (remaining() < static_cast<std::size_t>(n)) return false;
    v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += n;
    return true;
  }
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
};

std::nullopt_t fail(std::string* why, const char* reason) {
  if (why) *why = reason;
  return std::nullopt;
}

}  // namespace

std::vector<std::uint8_t> encode_entry(const Key& key, const Entry& entry) {
  std::vector<std::uint8_t> body;
  body.reserve(64 + entry.footprint() + 8 * entry.metadata.size());
  Writer b(body);
  b.str32(key.hex());
  if (entry.metadata.size() > std::numeric_limits<std::uint32_t>::max())
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[compile cache] too many metadata items");
  b.u32(static_cast<std::uint32_t>(entry.metadata.size()));
  for (const auto& [k, v] : entry.metadata) {
    b.str32(k);
    b.str32(v);
  }
  b.u64(entry.data.size());
  b.bytes(entry.data.data(), entry.data.size());

  const Hash128 sum = hash128(body.data(), body.size(), kChecksumSeed);
  std::vector<std::uint8_t> out(kEntryHeaderSize + body.size());
  std::uint8_t* h = out.data();
  std::memcpy(h, kMagic, sizeof kMagic);
  store_le(h + 8, kEntryFormatVersion, 4);
  store_le(h + 12, kEntryHeaderSize, 4);
  store_le(h + 16, body.size(), 8);
  store_le(h + 24, sum.lo, 8);
  store_le(h + 32, sum.hi, 8);
  std::memcpy(h + kEntryHeaderSize, body.data(), body.size());
  return out;
}

std::optional<Entry> decode_entry(std::span<const std::uint8_t> bytes, const Key& key,
                                  std::string* why) {
  if (bytes.size() < kEntryHeaderSize) return fail(why, "shorter than the header (truncated)");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return fail(why, "bad magic");
  Reader h(bytes.subspan(sizeof kMagic, kEntryHeaderSize - sizeof kMagic));
  std::uint32_t version = 0, header_size = 0;
  std::uint64_t body_size = 0;
  Hash128 sum;
  h.u32(version);
  h.u32(header_size);
  h.u64(body_size);
  h.u64(sum.lo);
  h.u64(sum.hi);
  if (version != kEntryFormatVersion) return fail(why, "unsupported format version");
  if (header_size != kEntryHeaderSize) return fail(why, "bad header size");
  const auto body = bytes.subspan(kEntryHeaderSize);
  if (body_size != body.size())
    return fail(why, body_size > body.size() ? "body truncated" : "trailing bytes after body");
  if (hash128(body.data(), body.size(), kChecksumSeed) != sum) return fail(why, "checksum mismatch");

  Reader r(body);
  std::string stored_key;
  if (!r.str32(stored_key)) return fail(why, "malformed key field");
  if (stored_key != key.hex()) return fail(why, "entry belongs to another key");
  Entry entry;
  std::uint32_t count = 0;
  if (!r.u32(count)) return fail(why, "malformed metadata count");
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string k, v;
    if (!r.str32(k) || !r.str32(v)) return fail(why, "malformed metadata item");
    entry.metadata.emplace(std::move(k), std::move(v));
  }
  std::uint64_t data_size = 0;
  if (!r.u64(data_size) || !r.bytes(entry.data, data_size)) return fail(why, "malformed data field");
  if (r.remaining() != 0) return fail(why, "unparsed bytes in body");
  return entry;
}

}  // namespace vtpu::cache
