#include "vtpu/cache/compile_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "vtpu/cache/disk_tier.h"
#include "vtpu/cache/memory_tier.h"
#include "vtpu/cache/shared_tier.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {

using runtime::Error;
using runtime::ErrorKind;

CompileCache::CompileCache(std::vector<std::shared_ptr<CacheTier>> tiers, bool cache_only)
    : tiers_(std::move(tiers)), cache_only_(cache_only), hits_(tiers_.size()) {
  if (tiers_.empty()) throw Error(ErrorKind::kInvalidArgument, "[compile cache] no tiers");
  std::set<std::string> names;
  for (const auto& tier : tiers_) {
    if (!tier) throw Error(ErrorKind::kInvalidArgument, "[compile cache] null tier");
    // Stats are keyed by name, so two tiers with one name would be ambiguous.
    if (!names.insert(tier->name()).second)
      throw Error(ErrorKind::kInvalidArgument, "[compile cache] duplicate tier '" + tier->name() + "'");
  }
}

std::unique_ptr<CompileCache> CompileCache::from_env() {
  std::vector<std::shared_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_shared<MemoryTier>());
  auto disk = std::make_shared<DiskTier>(DiskTier::Options::from_env());
  if (const char* shared_dir = std::getenv("VTPU_SHARED_CACHE")) {
    // The disk tier trims and locks its directory its own way; the two tiers
    // in one directory would delete each other's temporary files.
    std::error_code ec;
    if (std::filesystem::equivalent(disk->dir(), shared_dir, ec))
      throw Error(ErrorKind::kInvalidArgument,
                  "VTPU_SHARED_CACHE and VTPU_CACHE_DIR name the same directory (" + disk->dir() +
                      "); the shared tier needs a directory of its own");
  }
  tiers.push_back(std::move(disk));
  if (auto shared = SharedTier::from_env()) tiers.push_back(std::move(shared));
  return std::make_unique<CompileCache>(std::move(tiers), cache_only_from_env());
}

bool CompileCache::cache_only_from_env() {
  const char* raw = std::getenv("VTPU_CACHE_ONLY");
  std::string value = raw ? raw : "";
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (value.empty() || value == "0" || value == "false" || value == "no" || value == "off") return false;
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  // Reject typos loudly: silently compiling on a server meant to be cache-only
  // is exactly what the flag exists to prevent.
  throw Error(ErrorKind::kInvalidArgument,
              "VTPU_CACHE_ONLY must be 1/true/yes/on or 0/false/no/off, got '" + std::string(raw) + "'");
}

void CompileCache::promote(const Key& key, const std::shared_ptr<const Entry>& entry,
                           std::size_t level) {
  for (std::size_t i = 0; i < level; ++i) tiers_[i]->put(key, entry);
}

std::shared_ptr<const Entry> CompileCache::get(const Key& key) {
  for (std::size_t i = 0; i < tiers_.size(); ++i) {
    if (auto hit = tiers_[i]->get(key)) {
      hits_[i].fetch_add(1, std::memory_order_relaxed);
      promote(key, hit, i);
      return hit;
    }
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

void CompileCache::put(const Key& key, Entry entry) {
  promote(key, std::make_shared<const Entry>(std::move(entry)), tiers_.size());
}

std::shared_ptr<const Entry> CompileCache::get_or_create(const Key& key,
                                                         const std::function<Entry()>& build) {
  if (cache_only_) {
    if (auto hit = get(key)) return hit;
    throw_cache_only_miss(key);
  }
  // Build through the last tier that makes cooperating processes build once
  // (the disk tier's per-key lock); the tiers below it (the shared tier) are
  // asked from inside that build, so while one local process fetches or
  // compiles a kernel the others wait for it instead of asking the network.
  std::size_t coordinator = tiers_.size() - 1;
  for (std::size_t i = tiers_.size(); i-- > 0;) {
    if (tiers_[i]->coordinates_builds()) {
      coordinator = i;
      break;
    }
  }
  for (std::size_t i = 0; i < coordinator; ++i) {
    if (auto hit = tiers_[i]->get(key)) {
      hits_[i].fetch_add(1, std::memory_order_relaxed);
      promote(key, hit, i);
      return hit;
    }
  }
  bool built = false;
  std::size_t found_in = coordinator;
  auto entry = tiers_[coordinator]->get_or_create(key, [&]() -> Entry {
    for (std::size_t i = coordinator + 1; i < tiers_.size(); ++i) {
      if (auto hit = tiers_[i]->get(key)) {
        found_in = i;
        return *hit;
      }
    }
    built = true;
    builds_.fetch_add(1, std::memory_order_relaxed);
    Entry made;
    try {
      made = build();
    } catch (...) {
      build_failures_.fetch_add(1, std::memory_order_relaxed);
      throw;
    }
    auto shared = std::make_shared<const Entry>(made);
    for (std::size_t i = coordinator + 1; i < tiers_.size(); ++i) tiers_[i]->put(key, shared);
    return made;
  });
  (built ? misses_ : hits_[found_in]).fetch_add(1, std::memory_order_relaxed);
  promote(key, entry, coordinator);
  return entry;
}

void CompileCache::throw_cache_only_miss(const Key& key) const {
  throw Error(ErrorKind::kRuntime, "[compile cache] cache-only mode (VTPU_CACHE_ONLY=1): no entry for key " +
                                       key.hex() + "; compiling is disabled");
}

CacheStats CompileCache::stats() const {
  CacheStats s;
  for (std::size_t i = 0; i < tiers_.size(); ++i) {
    s.hits[tiers_[i]->name()] = hits_[i].load(std::memory_order_relaxed);
    s.tiers.emplace_back(tiers_[i]->name(), tiers_[i]->stats());
  }
  s.misses = misses_.load(std::memory_order_relaxed);
  s.builds = builds_.load(std::memory_order_relaxed);
  s.build_failures = build_failures_.load(std::memory_order_relaxed);
  return s;
}

void CompileCache::clear() {
  // The tiers below the build coordinator (the shared tier) are the fleet's,
  // not this process's to empty.
  for (const auto& tier : tiers_) {
    tier->clear();
    if (tier->coordinates_builds()) break;
  }
}

}  // namespace vtpu::cache
