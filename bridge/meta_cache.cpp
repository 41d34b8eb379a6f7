#include "meta_cache.h"

#include <ATen/core/Tensor.h>

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace vtpu::bridge {
namespace {

// Bounded so that a program with ever new shapes does not grow it forever (a
// steady training step needs a few hundred entries; a server cycling through
// thousands of batch and sequence shapes needs tens of thousands). When full,
// an eighth of the entries goes, in the map's bucket order (unrelated to age):
// emptying it all at once made a working set just above the bound miss on
// every call, re-running Python meta kernels (a review measured 5-14x the
// issue time per step with 1,000-3,000 shapes in rotation).
constexpr std::size_t kMaxEntries = 32768;
constexpr std::size_t kEvictedWhenFull = kMaxEntries / 8;

std::mutex g_mutex;
std::unordered_map<std::string, std::vector<c10::IValue>>& entries() {
  static auto* map = new std::unordered_map<std::string, std::vector<c10::IValue>>();
  return *map;
}

void put_int(std::string& key, std::int64_t v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_double(std::string& key, double v) {
  std::int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_int(key, bits);
}

// The storages of the tensor arguments seen so far, in order: a tensor's key
// names the first earlier argument sharing its storage, since meta kernels
// check overlap between arguments (an out= tensor over an input raises).
using SeenStorages = std::vector<const void*>;

// False for a tensor whose values, not only its metadata, may decide the
// output's shape: an integer or bool tensor on another device than vtpu
// (the CPU), which the meta kernel reads (x[cpu_mask] has as many rows as
// the mask has true elements).
// Keyed by metadata, an all-false mask got the rows of an earlier mask of the
// same shape. Wrapped Python numbers (x * 2) are values in elementwise math.
bool values_may_shape_the_result(const at::Tensor& t) {
  return t.device().type() != c10::DeviceType::PrivateUse1 && t.device().type() != c10::DeviceType::Meta &&
         (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) && !t.unsafeGetTensorImpl()->is_wrapped_number();
}

bool put_tensor(std::string& key, const at::Tensor& t, SeenStorages& seen) {
  if (!t.defined()) {
    key += 'u';
    return true;
  }
  if (values_may_shape_the_result(t)) return false;
  key += 'T';
  key += static_cast<char>(t.scalar_type());
  key += static_cast<char>(t.device().type());
  key += static_cast<char>(t.layout());
  // A wrapped Python number promotes as a number, a 0-dim tensor as a
  // tensor: int64 // 1.0 is float32, int64 // tensor(1.0, float64) float64.
  key += static_cast<char>((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0) |
                           (t.unsafeGetTensorImpl()->is_wrapped_number() ? 4 : 0));
  put_int(key, t.dim());
  for (std::int64_t s : t.sizes()) put_int(key, s);
  for (std::int64_t s : t.strides()) put_int(key, s);
  put_int(key, t.storage_offset());
  const void* storage = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
  std::int64_t shares_with = -1;
  for (std::size_t i = 0; storage != nullptr && i < seen.size(); ++i)
    if (seen[i] == storage) {
      shares_with = static_cast<std::int64_t>(i);
      break;
    }
  put_int(key, shares_with);
  seen.push_back(storage);
  return true;
}

// False for a value the key does not describe.
bool put_value(std::string& key, const c10::IValue& v, SeenStorages& seen) {
  if (v.isTensor()) {
    if (!put_tensor(key, v.toTensor(), seen)) return false;
  } else if (v.isNone()) {
    key += 'n';
  } else if (v.isBool()) {
    key += v.toBool() ? 'B' : 'b';
  } else if (v.isInt()) {
    key += 'i';
    put_int(key, v.toInt());
  } else if (v.isDouble()) {
    key += 'd';
    put_double(key, v.toDouble());
  } else if (v.isString()) {
    key += 's';
    key += v.toStringRef();
    key += '\0';
  } else if (v.isDevice()) {
    key += 'D';
    key += static_cast<char>(v.toDevice().type());
    put_int(key, v.toDevice().index());
  } else if (v.isScalar()) {  // a Scalar argument that is not an int/double/bool IValue
    return false;
  } else if (v.isList()) {
    key += '[';
    for (const c10::IValue& e : v.toListRef())
      if (!put_value(key, e, seen)) return false;
    key += ']';
  } else {
    return false;  // SymInt, complex, objects, ...
  }
  return true;
}

}  // namespace

std::optional<std::string> meta_cache_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                          std::size_t first) {
  const c10::FunctionSchema& schema = op.schema();
  std::string key;
  key.reserve(160);
  const c10::FunctionSchema* identity = &schema;
  key.append(reinterpret_cast<const char*>(&identity), sizeof identity);
  SeenStorages seen;
  for (std::size_t i = first; i < stack.size(); ++i)
    if (!put_value(key, stack[i], seen)) return std::nullopt;
  return key;
}

std::optional<std::vector<c10::IValue>> meta_cache_find(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = entries().find(key);
  if (it == entries().end()) return std::nullopt;
  return it->second;
}

void meta_cache_insert(std::string key, std::vector<c10::IValue> returns) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& map = entries();
  if (map.size() >= kMaxEntries) {
    auto it = map.begin();
    for (std::size_t i = 0; i < kEvictedWhenFull && it != map.end(); ++i) it = map.erase(it);
  }
  map.emplace(std::move(key), std::move(returns));
}

}  // namespace vtpu::bridge
