#include "vtpu/cache/shared_tier.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "vtpu/cache/entry_codec.h"
#include "vtpu/cache/sha256.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

using runtime::Error;
using runtime::ErrorKind;

constexpr std::string_view kMagic = "VTPUSIG1";
constexpr std::string_view kDomain{"vtpu shared cache entry\0", 24};  // NUL ends the domain tag
constexpr std::size_t kHeader = 8 + 32;

std::span<const std::uint8_t> as_bytes(std::string_view text) {
  return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

Digest256 signature(std::string_view signing_key, const Key& key, std::span<const std::uint8_t> payload) {
  return hmac_sha256(signing_key, {as_bytes(kDomain), as_bytes(key.hex()), payload});
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

std::chrono::milliseconds timeout_from_env() {
  const std::string text = env_or_empty("VTPU_SHARED_CACHE_TIMEOUT");
  if (text.empty()) return SharedTier::Options{}.timeout;
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(seconds) || seconds <= 0 || seconds > 3600)
    throw Error(ErrorKind::kInvalidArgument,
                "VTPU_SHARED_CACHE_TIMEOUT must be a number of seconds in (0, 3600], got '" + text + "'");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

// VTPU_SHARED_CACHE_TLS_{CA,CERT,KEY}; set for a redis:// or directory
// tier they would be silently unused, so that is an error.
TlsOptions tls_from_env(const std::string& where, bool tls) {
  TlsOptions options{env_or_empty("VTPU_SHARED_CACHE_TLS_CA"), env_or_empty("VTPU_SHARED_CACHE_TLS_CERT"),
                     env_or_empty("VTPU_SHARED_CACHE_TLS_KEY")};
  const bool any = !options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty();
  if (any && !tls)
    throw Error(ErrorKind::kInvalidArgument, "VTPU_SHARED_CACHE_TLS_* is set but VTPU_SHARED_CACHE ('" +
                                                 redact_url(where) + "') is not a rediss:// URL");
  if (!options.key_file.empty() && options.cert_file.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "VTPU_SHARED_CACHE_TLS_KEY is set without VTPU_SHARED_CACHE_TLS_CERT (the client certificate)");
  return options;
}

}  // namespace

SharedTier::SharedTier(std::unique_ptr<ByteStore> store, std::string signing_key, Options options)
    : store_(std::move(store)), signing_key_(std::move(signing_key)), options_(options) {
  if (!store_) throw Error(ErrorKind::kInvalidArgument, "[compile cache] shared tier without a store");
  if (signing_key_.size() < kMinSigningKeyBytes)
    throw Error(ErrorKind::kInvalidArgument,
                "VTPU_CACHE_KEY must be at least " + std::to_string(kMinSigningKeyBytes) +
                    " bytes (the shared compile cache signs its entries with it; e.g. 32 random hex digits, "
                    "the same on every server)");
}

std::shared_ptr<SharedTier> SharedTier::from_env() {
  const std::string where = env_or_empty("VTPU_SHARED_CACHE");
  if (where.empty()) return nullptr;
  const char* key = std::getenv("VTPU_CACHE_KEY");
  if (key == nullptr || *key == '\0')
    throw Error(ErrorKind::kInvalidArgument,
                "VTPU_SHARED_CACHE is set but VTPU_CACHE_KEY is not: entries of the shared compile cache are "
                "signed and verified with that key (the same on every server), and none can be trusted without it");
  Options options;
  options.timeout = timeout_from_env();
  std::unique_ptr<ByteStore> store;
  if (where.starts_with("redis://") || where.starts_with("rediss://")) {
    RedisAddress address = RedisAddress::parse(where);
    TlsOptions tls = tls_from_env(where, address.tls);
    store = open_redis_store(std::move(address), options.timeout, std::move(tls));
  } else if (where.find("://") != std::string::npos) {
    throw Error(ErrorKind::kInvalidArgument,
                "VTPU_SHARED_CACHE: '" + redact_url(where) + "': unknown scheme (a directory path, redis://host:port or rediss://host:port)");
  } else {
    tls_from_env(where, false);
    store = open_directory_store(where);
  }
  return std::make_shared<SharedTier>(std::move(store), key, options);
}

std::vector<std::uint8_t> SharedTier::seal(const Key& key, const Entry& entry) const {
  const std::vector<std::uint8_t> payload = encode_entry(key, entry);
  const Digest256 mac = signature(signing_key_, key, payload);
  std::vector<std::uint8_t> out(kHeader + payload.size());
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  std::memcpy(out.data() + kMagic.size(), mac.data(), mac.size());
  std::memcpy(out.data() + kHeader, payload.data(), payload.size());
  return out;
}

std::optional<Entry> SharedTier::open(const Key& key, std::span<const std::uint8_t> bytes, bool* refused,
                                      std::string* why) const {
  *refused = true;
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    if (why) *why = "not a signed entry";
    return std::nullopt;
  }
  Digest256 claimed{};
  std::memcpy(claimed.data(), bytes.data() + kMagic.size(), claimed.size());
  const auto payload = bytes.subspan(kHeader);
  if (!digests_equal(claimed, signature(signing_key_, key, payload))) {
    if (why) *why = "signature does not verify (another VTPU_CACHE_KEY, or tampered)";
    return std::nullopt;
  }
  *refused = false;  // authentic; what follows can only be our own writer's bug
  return decode_entry(payload, key, why);
}

bool SharedTier::store_resting() const { return now_ns() < resting_until_ns_.load(std::memory_order_relaxed); }

void SharedTier::note_failure(const std::exception& e, bool store_down) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  if (store_down)
    resting_until_ns_.store(now_ns() + std::chrono::nanoseconds(options_.retry_after).count(),
                            std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    last_error_ = e.what();
  }
  notice_once(failure_noticed_, std::string("the shared compile cache (") + store_->describe() +
                                    ") failed; lookups go on without it" +
                                    (store_down ? " (asked again in " +
                                                      std::to_string(options_.retry_after.count() / 1000) + " s)"
                                                : std::string()) +
                                    ": " + e.what());
}

void SharedTier::notice_once(std::atomic<bool>& flag, const std::string& message) {
  if (notice_ && !flag.exchange(true)) notice_(message);
}

std::string SharedTier::last_error() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return last_error_;
}

std::shared_ptr<const Entry> SharedTier::get(const Key& key) {
  std::optional<std::vector<std::uint8_t>> bytes;
  if (!store_resting()) {
    try {
      bytes = store_->fetch(key.hex());
    } catch (const StoreUnavailable& e) {
      note_failure(e, /*store_down=*/true);
    } catch (const std::exception& e) {
      note_failure(e, /*store_down=*/false);  // this entry only: the next key is asked
    }
  }
  if (!bytes) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  bool refused = false;
  std::string why;
  std::optional<Entry> entry = open(key, *bytes, &refused, &why);
  if (!entry) {
    (refused ? refused_ : corrupt_).fetch_add(1, std::memory_order_relaxed);
    if (refused)
      notice_once(refusal_noticed_, "the shared compile cache (" + store_->describe() + ") holds an entry for kernel " +
                                        key.hex() + " that was refused (" + why +
                                        "); it was not loaded (is VTPU_CACHE_KEY the same on every server?)");
    misses_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  hits_.fetch_add(1, std::memory_order_relaxed);
  return std::make_shared<const Entry>(std::move(*entry));
}

void SharedTier::put(const Key& key, std::shared_ptr<const Entry> entry) {
  if (!entry)
    throw Error(ErrorKind::kInvalidArgument, "[compile cache] put of a null entry for key " + key.hex());
  if (store_resting()) return;
  try {
    store_->store(key.hex(), seal(key, *entry));
  } catch (const StoreUnavailable& e) {
    note_failure(e, /*store_down=*/true);
  } catch (const std::exception& e) {
    // A read-only mount, a full disk: gets still work, so keep asking.
    note_failure(e, /*store_down=*/false);
  }
}

bool SharedTier::remove(const Key& key) { return store_->remove(key.hex()); }

void SharedTier::clear() { store_->clear(); }

TierStats SharedTier::stats() const {
  TierStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.corrupt_discarded = corrupt_.load(std::memory_order_relaxed);
  s.refused = refused_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace vtpu::cache
