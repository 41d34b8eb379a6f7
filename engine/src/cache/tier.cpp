#include "vtpu/cache/tier.h"

namespace vtpu::cache {

std::shared_ptr<const Entry> CacheTier::get_or_create(const Key& key,
                                                      const std::function<Entry()>& build) {
  if (auto hit = get(key)) return hit;
  auto made = std::make_shared<const Entry>(build());
  put(key, made);
  return made;
}

}  // namespace vtpu::cache
