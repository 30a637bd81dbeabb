// T3: KV blocks in a Redis server shared by several serving processes.
//
// Each block is one Redis string under "<key_prefix><fingerprint hex>:<key
// hex>" (default prefix "myriad:kv:"), holding the same record as a disk
// file (block_record.h), so a corrupt, truncated or foreign value is refused
// (and DELeted) instead of used. Put is SET (with EX when ttl_seconds > 0),
// Get is GET, Contains is EXISTS, Evict is DEL. Capacity and eviction are
// Redis's own (maxmemory-policy); this tier evicts nothing itself.
//
// One synchronous hiredis connection per tier, guarded by a mutex. Every
// failure (refused connection, timeout, dropped socket, error reply) is
// counted in errors and reported as a miss / a dropped Put; nothing throws.
// After a failure the connection is dropped and operations fail fast for
// retry_interval_s, then the next one reconnects, so a dead server costs a
// request at most one connect timeout per interval. SIGPIPE from a dead
// socket is blocked for the calling thread during each command.
//
// A hung (not dead) server makes a call wait for op_timeout_s: the engine
// calls this tier only from its lookup, I/O and write-back threads, never
// from the scheduler (remote() is true). stats() never waits for a command
// in flight.
//
// Logging, per connection (lookups, writes): the first failure of an outage
// is one warning with the error; further failures are counted, not logged;
// the first command that succeeds again logs the reconnect, with the
// outage's length and how many errors were suppressed.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "serve/kvcache/tier.h"

struct redisContext;

namespace myriad::serve {

struct RedisAddress {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;             // SELECTed after connecting when non-zero
  std::string password;   // AUTH after connecting when non-empty
};

// "redis://[[user]:password@]host[:port][/db]" (host may be "[ipv6]");
// errors name the URL and what is wrong with it.
Result<RedisAddress> ParseRedisUrl(const std::string& url);

struct RedisTierOptions {
  RedisAddress address;
  std::string key_prefix = "myriad:kv:";
  ModelFingerprint fingerprint;
  int64_t block_floats = 0;        // BlockFloats(cfg); 0 accepts any size
  int ttl_seconds = 0;             // 0: keys do not expire
  double connect_timeout_s = 0.5;
  double op_timeout_s = 2.0;
  double retry_interval_s = 1.0;   // fail fast this long after a failure before reconnecting
};

class RedisTier : public KvTier {
 public:
  // Checks the options; does not need the server to be up (see Ping).
  static Result<std::unique_ptr<RedisTier>> Create(const RedisTierOptions& options);
  ~RedisTier() override;

  std::string name() const override { return "redis"; }
  bool remote() const override { return true; }
  void Put(const KvBlock& b) override;
  bool Get(BlockKey key, KvBlock* out) override;
  bool Contains(BlockKey key) override;
  std::vector<bool> ContainsMany(const std::vector<BlockKey>& keys) override;  // pipelined EXISTS
  void Evict(BlockKey key) override;
  // Counts this model's keys with SCAN MATCH: O(keys in the database); for
  // stats pages, not for every request. 0 when the server is unreachable.
  int64_t size_blocks() override;
  TierStats stats() override;

  // Connects if needed (ignoring the retry interval) and PINGs: for startup
  // checks and health endpoints. Does not count errors.
  Status Ping();
  std::string KeyOf(BlockKey key) const;
  // Outages begun and ended (reconnects), both connections together.
  int64_t outages();
  int64_t reconnects();

 private:
  RedisTier(const RedisTierOptions& options, const char* role);
  struct Reply;
  class OpLock;  // mu_ for one operation; publishes stats_ when it ends
  // Runs one command; null on any failure (counted, connection dropped).
  std::unique_ptr<Reply> CommandLocked(int argc, const char** argv, const size_t* lens);
  bool ConnectedLocked();  // connects if needed (not while failing fast)
  Status ConnectLocked();
  void DisconnectLocked();
  void FailLocked(const std::string& what);
  void UpLocked();  // a command succeeded: ends an outage (logged)
  std::string WhereLocked() const;

  const RedisTierOptions options_;
  const char* role_;  // "lookups" or "writes", for the log
  std::mutex mu_;     // one command at a time on ctx_
  redisContext* ctx_ = nullptr;
  uint64_t retry_after_us_ = 0;
  TierStats stats_;   // under mu_
  bool down_ = false;  // in an outage (under mu_), since down_since_us_
  uint64_t down_since_us_ = 0;
  int64_t suppressed_ = 0, outages_ = 0, reconnects_ = 0;
  std::mutex published_mu_;  // never held while waiting for the server
  TierStats published_;      // stats_ as of the last operation's end
  int64_t published_outages_ = 0, published_reconnects_ = 0;
  std::unique_ptr<RedisTier> writer_;  // Put's own connection (null in the writer itself)
};

}  // namespace myriad::serve
