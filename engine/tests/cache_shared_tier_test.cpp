// The shared compile-cache tier: SHA-256/HMAC known answers (FIPS 180-4
// examples, RFC 4231), signed entries refused under another key or when
// tampered with, the directory and Redis stores, a CompileCache whose second
// "server" fetches instead of compiling, a failing store costing one attempt
// per rest interval, and the environment's configuration errors.
#include "vtpu/cache/shared_tier.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "local_redis.h"
#include "scoped_env.h"
#include "temp_dir.h"
#include "vtpu/cache/compile_cache.h"
#include "vtpu/cache/disk_tier.h"
#include "vtpu/cache/memory_tier.h"
#include "vtpu/cache/sha256.h"
#include "vtpu/runtime/error.h"

namespace vtpu::cache {
namespace {

namespace fs = std::filesystem;
using vtpu::testing::LocalRedis;
using vtpu::testing::TempDir;
using vtpu::testing::free_port;
using vtpu::testing::redis_server_binary;
using runtime::Error;
using runtime::ErrorKind;

const std::string kSigningKey = "0123456789abcdef0123456789abcdef";

std::span<const std::uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::string hmac_hex(const std::string& key, const std::string& data) {
  return digest_hex(hmac_sha256(key, {bytes_of(data)}));
}

TEST(Sha256Test, KnownAnswers) {
  EXPECT_EQ(digest_hex(sha256(bytes_of(""))), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(digest_hex(sha256(bytes_of("abc"))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest_hex(sha256(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(digest_hex(sha256(bytes_of(million))), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, PiecewiseUpdatesEqualOneShot) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>(i * 7 + 3));
  const Digest256 whole = sha256(bytes_of(text));
  for (std::size_t step : {1u, 3u, 55u, 63u, 64u, 65u, 127u}) {
    Sha256 h;
    for (std::size_t at = 0; at < text.size(); at += step)
      h.update(text.data() + at, std::min(step, text.size() - at));
    EXPECT_EQ(h.finish(), whole) << "step " << step;
  }
}

TEST(Sha256Test, HmacRfc4231) {
  EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(hmac_hex(key4, std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Keys longer than the block are hashed first.
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'),
                     "This is a test using a larger than block-size key and a larger than block-size data. The "
                     "key needs to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // Parts are concatenated.
  EXPECT_EQ(digest_hex(hmac_sha256("Jefe", {bytes_of("what do ya "), bytes_of("want for nothing?")})),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// A store in memory that can be told to fail, counting the calls that reach it.
class FakeStore final : public ByteStore {
 public:
  std::map<std::string, std::vector<std::uint8_t>>* data;
  bool failing = false;        // the whole store down (StoreUnavailable)
  bool refusing_keys = false;  // each request refused on its own (a read-only mount, ...)
  int calls = 0;
  explicit FakeStore(std::map<std::string, std::vector<std::uint8_t>>* d) : data(d) {}
  std::string describe() const override { return "fake"; }
  std::optional<std::vector<std::uint8_t>> fetch(const std::string& name) override {
    touch();
    auto it = data->find(name);
    if (it == data->end()) return std::nullopt;
    return it->second;
  }
  void store(const std::string& name, std::span<const std::uint8_t> bytes) override {
    touch();
    (*data)[name] = std::vector<std::uint8_t>(bytes.begin(), bytes.end());
  }
  bool remove(const std::string& name) override { touch(); return data->erase(name) > 0; }
  void clear() override { touch(); data->clear(); }
  StoreUsage usage() override { return {true, data->size(), 0}; }

 private:
  void touch() {
    ++calls;
    if (failing) throw StoreUnavailable("fake store down");
    if (refusing_keys) throw Error(ErrorKind::kRuntime, "fake store refuses this key");
  }
};

SharedTier::Options quick_options() {
  SharedTier::Options o;
  o.timeout = std::chrono::milliseconds(500);
  o.retry_after = std::chrono::milliseconds(200);
  return o;
}

const Key kKey = make_key({"fused add mul f32", "x86_64", "g++ -O2"});
const Entry kEntry = Entry::from_string("\x7f" "ELF kernel bytes", {{"symbol", "vtpu_kernel_1"}});

TEST(SharedTierTest, SealedEntriesOpenOnlyUnderTheirKeyAndSigningKey) {
  std::map<std::string, std::vector<std::uint8_t>> data;
  SharedTier tier(std::make_unique<FakeStore>(&data), kSigningKey, quick_options());
  const auto sealed = tier.seal(kKey, kEntry);
  bool refused = true;
  std::string why;
  auto opened = tier.open(kKey, sealed, &refused, &why);
  ASSERT_TRUE(opened) << why;
  EXPECT_FALSE(refused);
  EXPECT_EQ(*opened, kEntry);

  SharedTier other(std::make_unique<FakeStore>(&data), "another key of sixteen+ bytes", quick_options());
  EXPECT_FALSE(other.open(kKey, sealed, &refused, &why));
  EXPECT_TRUE(refused);
  EXPECT_NE(why.find("signature"), std::string::npos) << why;

  const Key other_key = make_key({"something else"});
  EXPECT_FALSE(tier.open(other_key, sealed, &refused));
  EXPECT_TRUE(refused);

  // Any flipped bit, in the MAC or the payload, is refused.
  for (std::size_t at : {std::size_t{9}, std::size_t{40}, std::size_t{60}, sealed.size() - 1}) {
    auto bad = sealed;
    bad[at] ^= 0x01;
    EXPECT_FALSE(tier.open(kKey, bad, &refused)) << "flipped byte " << at;
    EXPECT_TRUE(refused);
  }
  auto truncated = sealed;
  truncated.resize(sealed.size() - 3);
  EXPECT_FALSE(tier.open(kKey, truncated, &refused));
  EXPECT_FALSE(tier.open(kKey, bytes_of("VTPUSIG1"), &refused));
  EXPECT_FALSE(tier.open(kKey, std::span<const std::uint8_t>(), &refused));
}

TEST(SharedTierTest, RefusesShortSigningKeysAndNullStores) {
  std::map<std::string, std::vector<std::uint8_t>> data;
  try {
    SharedTier tier(std::make_unique<FakeStore>(&data), "short", quick_options());
    FAIL() << "a 5-byte key was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("VTPU_CACHE_KEY"), std::string::npos);
  }
  EXPECT_THROW(SharedTier(nullptr, kSigningKey, quick_options()), Error);
}

TEST(SharedTierTest, DirectoryStoreRoundTripsAcrossInstancesAndRefusesForgeries) {
  TempDir tmp;
  SharedTier writer(open_directory_store(tmp.path()), kSigningKey, quick_options());
  EXPECT_EQ(writer.get(kKey), nullptr);
  writer.put(kKey, std::make_shared<const Entry>(kEntry));
  EXPECT_TRUE(fs::exists(tmp.sub(kKey.hex() + ".vtpu")));
  EXPECT_EQ(writer.usage().entries, 1u);
  EXPECT_GT(writer.usage().bytes, kEntry.data.size());
  EXPECT_EQ(writer.stats().entries, 0u) << "stats() must not list the shared directory";

  SharedTier reader(open_directory_store(tmp.path()), kSigningKey, quick_options());
  auto hit = reader.get(kKey);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, kEntry);
  EXPECT_EQ(reader.stats().hits, 1u);

  // A server with another key neither loads the entry nor deletes it; its put replaces it.
  SharedTier stranger(open_directory_store(tmp.path()), "a different signing key!", quick_options());
  std::vector<std::string> notices;
  stranger.set_notice([&](const std::string& m) { notices.push_back(m); });
  EXPECT_EQ(stranger.get(kKey), nullptr);
  EXPECT_EQ(stranger.get(kKey), nullptr);
  ASSERT_EQ(notices.size(), 1u) << "one notice for the first refusal, none after";
  EXPECT_NE(notices[0].find("VTPU_CACHE_KEY"), std::string::npos) << notices[0];
  EXPECT_EQ(stranger.stats().refused, 2u);
  EXPECT_TRUE(fs::exists(tmp.sub(kKey.hex() + ".vtpu")));
  stranger.put(kKey, std::make_shared<const Entry>(kEntry));
  EXPECT_NE(stranger.get(kKey), nullptr);
  EXPECT_EQ(reader.get(kKey), nullptr);  // now the first key's servers refuse it
  EXPECT_EQ(reader.stats().refused, 1u);

  // A plain (unsigned) disk-tier entry dropped into the shared directory is refused.
  TempDir local;
  DiskTier disk(DiskTier::Options{local.path(), DiskTier::kDefaultMaxBytes});
  disk.put(kKey, std::make_shared<const Entry>(kEntry));
  fs::copy_file(disk.entry_path(kKey), tmp.sub(kKey.hex() + ".vtpu"), fs::copy_options::overwrite_existing);
  EXPECT_EQ(reader.get(kKey), nullptr);
  EXPECT_EQ(reader.stats().refused, 2u);

  // clear() removes entries and leftover temp files, nothing else.
  std::ofstream(tmp.sub(".tmp." + kKey.hex() + ".vtpu.host.1.0")) << "partial";
  std::ofstream(tmp.sub("README")) << "not ours";
  reader.clear();
  EXPECT_FALSE(fs::exists(tmp.sub(kKey.hex() + ".vtpu")));
  EXPECT_FALSE(fs::exists(tmp.sub(".tmp." + kKey.hex() + ".vtpu.host.1.0")));
  EXPECT_TRUE(fs::exists(tmp.sub("README")));
  EXPECT_EQ(reader.usage().entries, 0u);
}

TEST(SharedTierTest, AMissingDirectoryIsAnUnavailableStoreUntilItAppears) {
  TempDir tmp;
  const std::string dir = tmp.sub("not-mounted-yet");
  SharedTier tier(open_directory_store(dir), kSigningKey, quick_options());
  EXPECT_EQ(tier.get(kKey), nullptr);
  EXPECT_EQ(tier.stats().errors, 1u);
  EXPECT_NE(tier.last_error().find("not-mounted-yet"), std::string::npos) << tier.last_error();
  fs::create_directory(dir);
  tier.put(kKey, std::make_shared<const Entry>(kEntry));  // resting: not written
  EXPECT_FALSE(fs::exists(dir + "/" + kKey.hex() + ".vtpu"));
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  tier.put(kKey, std::make_shared<const Entry>(kEntry));
  EXPECT_NE(tier.get(kKey), nullptr);
  EXPECT_EQ(tier.stats().errors, 1u);
  EXPECT_THROW(open_directory_store(""), Error);
}

TEST(SharedTierTest, DirectoryStoreReadsOnlyRegularFilesOfBoundedSize) {
  // Whoever can write the shared directory is not trusted: a FIFO hung the
  // reader, a link to /dev/zero ate its memory, a huge sparse file was read whole.
  TempDir tmp;
  SharedTier tier(open_directory_store(tmp.path()), kSigningKey, quick_options());
  const Key fifo_key = make_key({"fifo"}), zero_key = make_key({"zero"}), big_key = make_key({"big"}),
            dir_key = make_key({"dir"});
  ASSERT_EQ(::mkfifo(tmp.sub(fifo_key.hex() + ".vtpu").c_str(), 0644), 0);
  fs::create_symlink("/dev/zero", tmp.sub(zero_key.hex() + ".vtpu"));
  { std::ofstream(tmp.sub(big_key.hex() + ".vtpu")); }
  fs::resize_file(tmp.sub(big_key.hex() + ".vtpu"), std::uintmax_t{3} << 30);  // sparse
  fs::create_directory(tmp.sub(dir_key.hex() + ".vtpu"));
  const auto start = std::chrono::steady_clock::now();
  for (const Key& k : {fifo_key, zero_key, big_key, dir_key}) EXPECT_EQ(tier.get(k), nullptr) << k.hex();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(tier.stats().errors, 4u) << tier.last_error();
  // Those were about single entries: the store stays in use for the others.
  tier.put(kKey, std::make_shared<const Entry>(kEntry));
  EXPECT_NE(tier.get(kKey), nullptr);
  EXPECT_EQ(tier.usage().entries, 2u) << "the sparse file and our entry are the regular ones";
}

TEST(SharedTierTest, DirectoryStoreNeverWritesThroughALink) {
  TempDir tmp, elsewhere;
  const std::string victim = elsewhere.sub("victim.txt");
  std::ofstream(victim) << "precious";
  SharedTier tier(open_directory_store(tmp.path()), kSigningKey, quick_options());
  fs::create_symlink(victim, tmp.sub(kKey.hex() + ".vtpu"));  // planted under the entry's own name
  EXPECT_EQ(tier.get(kKey), nullptr);
  tier.put(kKey, std::make_shared<const Entry>(kEntry));
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  EXPECT_FALSE(fs::is_symlink(tmp.sub(kKey.hex() + ".vtpu")));
  EXPECT_NE(tier.get(kKey), nullptr);
  for (const auto& file : fs::directory_iterator(tmp.path()))  // no temp file left behind
    EXPECT_FALSE(file.path().filename().string().starts_with(".tmp.")) << file.path();
}

// Two "servers" with their own memory and disk tiers over one shared directory.
std::unique_ptr<CompileCache> server_cache(const std::string& local_dir, const std::string& shared_dir,
                                           const std::string& signing_key = kSigningKey) {
  std::vector<std::shared_ptr<CacheTier>> tiers = {
      std::make_shared<MemoryTier>(), std::make_shared<DiskTier>(DiskTier::Options{local_dir, DiskTier::kDefaultMaxBytes}),
      std::make_shared<SharedTier>(open_directory_store(shared_dir), signing_key, quick_options())};
  return std::make_unique<CompileCache>(std::move(tiers));
}

TEST(SharedTierTest, SecondServerFetchesInsteadOfCompiling) {
  TempDir shared, local_a, local_b;
  int builds = 0;
  const auto build = [&] {
    ++builds;
    return kEntry;
  };
  auto a = server_cache(local_a.path(), shared.path());
  EXPECT_EQ(*a->get_or_create(kKey, build), kEntry);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(a->stats().misses, 1u);

  auto b = server_cache(local_b.path(), shared.path());
  EXPECT_EQ(*b->get_or_create(kKey, build), kEntry);
  EXPECT_EQ(builds, 1) << "server b compiled although the shared tier had the kernel";
  EXPECT_EQ(b->stats().hits_in("shared"), 1u);
  EXPECT_EQ(b->stats().builds, 0u);
  EXPECT_TRUE(fs::exists(local_b.sub(kKey.hex() + ".entry"))) << "the fetched entry was not kept locally";

  // b's next process finds it on its own disk without asking the shared tier.
  auto b2 = server_cache(local_b.path(), shared.path());
  EXPECT_EQ(*b2->get_or_create(kKey, build), kEntry);
  EXPECT_EQ(b2->stats().hits_in("disk"), 1u);
  EXPECT_EQ(b2->stats().hits_in("shared"), 0u);

  // A server with another signing key refuses the entry and compiles its own.
  TempDir local_c;
  auto c = server_cache(local_c.path(), shared.path(), "some other sixteen-byte key");
  EXPECT_EQ(*c->get_or_create(kKey, build), kEntry);
  EXPECT_EQ(builds, 2);
  const auto& shared_stats = c->stats().tiers.back().second;
  EXPECT_EQ(shared_stats.refused, 1u);

  // get() reads through to the shared tier too.
  TempDir local_d;
  auto d = server_cache(local_d.path(), shared.path(), "some other sixteen-byte key");
  EXPECT_NE(d->get(kKey), nullptr);
  EXPECT_EQ(d->stats().hits_in("shared"), 1u);
}

TEST(SharedTierTest, FailingStoreIsAMissAndRestsBeforeTheNextAttempt) {
  std::map<std::string, std::vector<std::uint8_t>> data;
  auto store = std::make_unique<FakeStore>(&data);
  FakeStore* fake = store.get();
  fake->failing = true;
  auto tier = std::make_shared<SharedTier>(std::move(store), kSigningKey, quick_options());
  int notices = 0;
  tier->set_notice([&](const std::string& m) {
    ++notices;
    EXPECT_NE(m.find("fake store down"), std::string::npos) << m;
  });
  TempDir local;
  CompileCache cache({std::make_shared<MemoryTier>(),
                      std::make_shared<DiskTier>(DiskTier::Options{local.path(), DiskTier::kDefaultMaxBytes}), tier});
  int builds = 0;
  const auto build = [&] {
    ++builds;
    return kEntry;
  };
  EXPECT_EQ(*cache.get_or_create(kKey, build), kEntry);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(fake->calls, 1) << "the put right after a failed fetch should not have tried the store";
  EXPECT_EQ(tier->stats().errors, 1u);
  EXPECT_NE(tier->last_error().find("fake store down"), std::string::npos);
  const Key second = make_key({"second kernel"});
  EXPECT_EQ(tier->get(second), nullptr);
  EXPECT_EQ(fake->calls, 1) << "asked the store again while it rested";

  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  fake->failing = false;
  tier->put(second, std::make_shared<const Entry>(kEntry));
  EXPECT_EQ(fake->calls, 2);
  EXPECT_NE(tier->get(second), nullptr);
  fake->failing = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(tier->get(kKey), nullptr);
  EXPECT_EQ(tier->stats().errors, 2u);
  EXPECT_EQ(notices, 1) << "a store failure is noticed once per process";
}

TEST(SharedTierTest, ARequestRefusedForOneKeyDoesNotRestTheStore) {
  // A read-only mount refusing a put, a Redis key of another type: gets of
  // other keys must go on (resting made every server compile what the store had).
  std::map<std::string, std::vector<std::uint8_t>> data;
  auto store = std::make_unique<FakeStore>(&data);
  FakeStore* fake = store.get();
  SharedTier tier(std::move(store), kSigningKey, quick_options());
  const Key other = make_key({"other kernel"});
  tier.put(other, std::make_shared<const Entry>(kEntry));
  fake->refusing_keys = true;
  tier.put(kKey, std::make_shared<const Entry>(kEntry));
  EXPECT_EQ(tier.get(kKey), nullptr);
  EXPECT_EQ(tier.stats().errors, 2u);
  fake->refusing_keys = false;
  const int calls = fake->calls;
  EXPECT_NE(tier.get(other), nullptr);
  EXPECT_EQ(fake->calls, calls + 1) << "the store was resting after a per-key refusal";
}

TEST(RedisAddressTest, ParsesUrlsAndRejectsBadOnes) {
  auto a = RedisAddress::parse("redis://cache.internal");
  EXPECT_EQ(a.host, "cache.internal");
  EXPECT_EQ(a.port, 6379);
  EXPECT_EQ(a.database, 0);
  EXPECT_TRUE(a.password.empty());
  a = RedisAddress::parse("redis://:s3cret@10.0.0.5:7000/3");
  EXPECT_EQ(a.host, "10.0.0.5");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(a.password, "s3cret");
  EXPECT_TRUE(a.user.empty());
  EXPECT_EQ(a.database, 3);
  EXPECT_EQ(a.describe(), "10.0.0.5:7000/3");
  a = RedisAddress::parse("redis://vtpu:p@ss@[::1]:6380");
  EXPECT_EQ(a.user, "vtpu");
  EXPECT_EQ(a.password, "p@ss");  // the last '@' ends the credentials
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.describe(), "[::1]:6380");
  for (const char* bad : {"rediss:/host", "http://host", "redis://", "redis://host:0", "redis://host:70000",
                          "redis://host:port", "redis://host/x", "redis://user@host", "redis://:@host",
                          "redis://[::1", "redis://[::1]x"}) {
    try {
      RedisAddress::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("VTPU_SHARED_CACHE"), std::string::npos) << bad;
    }
  }
}

TEST(RedisStoreTest, RoundTripsAuthenticatesClearsAndSurvivesTheServerGoingAway) {
  const auto binary = redis_server_binary();
  if (!binary) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server; make test installs it)";
  LocalRedis redis(*binary, "test-password");
  ASSERT_TRUE(redis.accepting()) << "redis-server did not start";
  const std::string url = "redis://:test-password@127.0.0.1:" + std::to_string(redis.port()) + "/2";
  auto open = [&](const std::string& u, const std::string& key = kSigningKey) {
    return std::make_shared<SharedTier>(open_redis_store(RedisAddress::parse(u), std::chrono::milliseconds(1000)),
                                        key, quick_options());
  };
  auto writer = open(url);
  EXPECT_EQ(writer->get(kKey), nullptr);
  EXPECT_EQ(writer->stats().errors, 0u) << writer->last_error();
  // Binary bytes (NUL, CR/LF) survive the protocol.
  Entry binary_entry = kEntry;
  for (int i = 0; i < 70000; ++i) binary_entry.data.push_back(static_cast<std::uint8_t>(i % 256));
  binary_entry.data.push_back('\r');
  binary_entry.data.push_back('\n');
  writer->put(kKey, std::make_shared<const Entry>(binary_entry));
  auto reader = open(url);
  auto hit = reader->get(kKey);
  ASSERT_NE(hit, nullptr) << reader->last_error();
  EXPECT_EQ(*hit, binary_entry);

  // Another database of the same server does not see it; another signing key refuses it.
  auto other_db = open("redis://:test-password@127.0.0.1:" + std::to_string(redis.port()) + "/3");
  EXPECT_EQ(other_db->get(kKey), nullptr);
  EXPECT_EQ(other_db->stats().errors, 0u) << other_db->last_error();
  auto stranger = open(url, "not the servers' shared key");
  EXPECT_EQ(stranger->get(kKey), nullptr);
  EXPECT_EQ(stranger->stats().refused, 1u);

  // A wrong password is an error (counted, a miss), not an exception.
  auto wrong = open("redis://:nope@127.0.0.1:" + std::to_string(redis.port()) + "/2");
  EXPECT_EQ(wrong->get(kKey), nullptr);
  EXPECT_EQ(wrong->stats().errors, 1u);
  EXPECT_NE(wrong->last_error().find("AUTH"), std::string::npos) << wrong->last_error();

  // A key of another type answers with a server error: this key is a miss,
  // the store is not rested (its other entries are still fetched).
  const Key listed = make_key({"a list, not a string"});
  const std::string lpush = "redis-cli -p " + std::to_string(redis.port()) +
                            " -a test-password --no-auth-warning -n 2 LPUSH vtpu:entry:" + listed.hex() +
                            " x >/dev/null 2>&1";
  if (std::system(lpush.c_str()) == 0) {
    const auto errors = reader->stats().errors;
    EXPECT_EQ(reader->get(listed), nullptr);
    EXPECT_EQ(reader->stats().errors, errors + 1);
    EXPECT_NE(reader->last_error().find("WRONGTYPE"), std::string::npos) << reader->last_error();
    EXPECT_NE(reader->get(kKey), nullptr) << "a per-key server error rested the store";
  } else {
    ADD_FAILURE() << "redis-cli could not add a list key (is redis-tools installed with redis-server?)";
  }

  const Key second = make_key({"second"});
  writer->put(second, std::make_shared<const Entry>(kEntry));
  EXPECT_TRUE(writer->remove(second));
  EXPECT_FALSE(writer->remove(second));
  writer->put(second, std::make_shared<const Entry>(kEntry));
  reader->clear();
  EXPECT_EQ(reader->get(kKey), nullptr);
  EXPECT_EQ(reader->get(second), nullptr);

  // The server dies: lookups become counted misses that take at most the timeout.
  writer->put(kKey, std::make_shared<const Entry>(kEntry));
  redis.stop();
  const auto errors_before = reader->stats().errors;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(reader->get(kKey), nullptr);
  EXPECT_EQ(reader->get(second), nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(reader->stats().errors, errors_before + 1) << "the second lookup should have found the store resting";
}

// A server on a loopback port that answers the first request with `reply`,
// sent in pieces of `chunk` bytes every `gap`, then holds the connection.
class HostileServer {
 public:
  HostileServer(std::string reply, std::size_t chunk, std::chrono::milliseconds gap) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    ::listen(listener_, 4);
    thread_ = std::thread([this, reply = std::move(reply), chunk, gap] {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      char request[4096];
      (void)::recv(client, request, sizeof(request), 0);
      for (std::size_t at = 0; at < reply.size() && !stop_; at += chunk) {
        if (::send(client, reply.data() + at, std::min(chunk, reply.size() - at), MSG_NOSIGNAL) < 0) break;
        std::this_thread::sleep_for(gap);
      }
      while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ::close(client);
    });
  }
  ~HostileServer() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    thread_.join();
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(RedisStoreTest, AHostileServerCostsTheTimeoutAtMost) {
  struct Case {
    const char* what;
    std::string reply;
    std::size_t chunk;
    int gap_ms;
  };
  const std::vector<Case> cases = {
      {"a byte at a time", "$5\r\nhello\r\n", 1, 150},
      {"a line without end", "+" + std::string(1 << 20, 'A'), 65536, 1},
      {"a huge bulk length", "$999999999999\r\n", 64, 1},
      {"a negative length", "$-7\r\n", 64, 1},
      {"garbage", std::string("\x01\x02\r\n", 4), 64, 1},
  };
  for (const Case& c : cases) {
    HostileServer server(c.reply, c.chunk, std::chrono::milliseconds(c.gap_ms));
    SharedTier tier(open_redis_store(RedisAddress::parse(server.url()), std::chrono::milliseconds(500)), kSigningKey,
                    quick_options());
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(tier.get(kKey), nullptr) << c.what;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500)) << c.what;
    EXPECT_EQ(tier.stats().errors, 1u) << c.what;
    EXPECT_EQ(tier.last_error().find('\x01'), std::string::npos) << "raw server bytes in a message";
  }
}

TEST(RedisStoreTest, CredentialsArePercentDecodedAndNeverShown) {
  const auto a = RedisAddress::parse("redis://us%65r:p%40ss%3Aword@host:1");
  EXPECT_EQ(a.user, "user");
  EXPECT_EQ(a.password, "p@ss:word");
  EXPECT_EQ(redact_url("redis://user:secret@host:1/2"), "redis://user:***@host:1/2");
  EXPECT_EQ(redact_url("redis://:secret@host"), "redis://:***@host");
  EXPECT_EQ(redact_url("redis://host:1"), "redis://host:1");
  try {
    RedisAddress::parse("redis://:secret@host:99999");
    ADD_FAILURE() << "bad port accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RedisAddress::parse("redis://:bad%zzescape@host"), Error);
}

TEST(RedisStoreTest, NothingListeningIsACountedMiss) {
  auto tier = std::make_shared<SharedTier>(
      open_redis_store(RedisAddress::parse("redis://127.0.0.1:" + std::to_string(free_port())),
                       std::chrono::milliseconds(500)),
      kSigningKey, quick_options());
  EXPECT_EQ(tier->get(kKey), nullptr);
  tier->put(kKey, std::make_shared<const Entry>(kEntry));  // resting: not attempted, no throw
  EXPECT_EQ(tier->stats().errors, 1u);
  EXPECT_NE(tier->last_error().find("connect"), std::string::npos) << tier->last_error();
}

using vtpu::testing::ScopedEnv;

TEST(SharedTierTest, FromEnvironment) {
  TempDir tmp;
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", std::nullopt);
    EXPECT_EQ(SharedTier::from_env(), nullptr);
  }
  const auto expect_invalid = [](const char* needle) {
    try {
      SharedTier::from_env();
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", tmp.path());
    ScopedEnv key("VTPU_CACHE_KEY", std::nullopt);
    expect_invalid("VTPU_CACHE_KEY");
  }
  ScopedEnv key("VTPU_CACHE_KEY", kSigningKey);
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", tmp.path());
    auto tier = SharedTier::from_env();
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->describe(), "directory " + tmp.path());
    ScopedEnv local("VTPU_CACHE_DIR", tmp.sub("local"));
    auto cache = CompileCache::from_env();
    ASSERT_EQ(cache->tiers().size(), 3u);
    EXPECT_EQ(cache->tiers().back()->name(), "shared");
  }
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", "redis://127.0.0.1:6399");
    auto tier = SharedTier::from_env();  // connects lazily: no server needed to configure
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->describe(), "redis 127.0.0.1:6399");
  }
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", "s3://bucket/cache");
    expect_invalid("unknown scheme");
  }
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", "http://user:topsecret@host/cache");
    expect_invalid("unknown scheme");
    try {
      SharedTier::from_env();
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("topsecret"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", tmp.sub("absent"));
    EXPECT_NE(SharedTier::from_env(), nullptr) << "a directory mounted later is a store down, not a bad setting";
  }
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", tmp.path());
    ScopedEnv local("VTPU_CACHE_DIR", tmp.path());
    try {
      CompileCache::from_env();
      ADD_FAILURE() << "one directory for both tiers was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    }
  }
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", "redis://:hunter2@127.0.0.1:0");
    try {
      SharedTier::from_env();
      ADD_FAILURE() << "port 0 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << "password in a message: " << e.what();
    }
  }
  {
    ScopedEnv shared("VTPU_SHARED_CACHE", tmp.path());
    ScopedEnv timeout("VTPU_SHARED_CACHE_TIMEOUT", "soon");
    expect_invalid("VTPU_SHARED_CACHE_TIMEOUT");
  }
}

}  // namespace
}  // namespace vtpu::cache
