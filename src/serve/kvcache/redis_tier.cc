#include "serve/kvcache/redis_tier.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/checksum.h"
#include "core/env.h"
#include "core/log.h"
#include "serve/kvcache/block_record.h"

namespace myriad::serve {
namespace {

timeval ToTimeval(double seconds) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

// Blocks SIGPIPE in this thread while hiredis writes to a socket whose peer
// may be gone, and swallows one raised meanwhile, so a dead server cannot
// kill the process (and the process's own SIGPIPE disposition is untouched).
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    already_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (!already_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool already_pending_ = false;
};

bool ParseInt(const std::string& s, int lo, int hi, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Escapes SCAN MATCH glob characters in a literal prefix.
std::string GlobEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

class RedisTier::OpLock {
 public:
  explicit OpLock(RedisTier* t) : t_(t), lock_(t->mu_) {}
  ~OpLock() {
    std::lock_guard<std::mutex> p(t_->published_mu_);
    t_->published_ = t_->stats_;
    t_->published_outages_ = t_->outages_;
    t_->published_reconnects_ = t_->reconnects_;
  }

 private:
  RedisTier* t_;
  std::lock_guard<std::mutex> lock_;
};

struct RedisTier::Reply {
  redisReply* r = nullptr;
  ~Reply() {
    if (r) freeReplyObject(r);
  }
};

Result<RedisAddress> ParseRedisUrl(const std::string& url) {
  const std::string hint = " (hint: redis://HOST[:PORT][/DB], e.g. redis://127.0.0.1:6379)";
  auto bad = [&](const std::string& why) {
    return Status::Error("redis url '" + url + "': " + why + hint);
  };
  const std::string scheme = "redis://";
  if (url.compare(0, scheme.size(), scheme) != 0) return bad("must start with redis://");
  std::string rest = url.substr(scheme.size());
  RedisAddress a;
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    const std::string userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = userinfo.find(':');
    if (colon == std::string::npos) return bad("credentials must be [user]:password@");
    a.password = userinfo.substr(colon + 1);
  }
  std::string hostport = rest, db;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    hostport = rest.substr(0, slash);
    db = rest.substr(slash + 1);
  }
  std::string port;
  if (!hostport.empty() && hostport[0] == '[') {
    const auto close = hostport.find(']');
    if (close == std::string::npos) return bad("unterminated [ipv6] host");
    a.host = hostport.substr(1, close - 1);
    const std::string after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("expected :PORT after ]");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
  } else {
    const auto colon = hostport.find(':');
    a.host = hostport.substr(0, colon);
    if (colon != std::string::npos) {
      port = hostport.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (a.host.empty()) return bad("no host");
  if (!port.empty() && !ParseInt(port, 1, 65535, &a.port))
    return bad("port '" + port + "' is not a number in 1..65535");
  if (!db.empty() && !ParseInt(db, 0, 1 << 20, &a.db))
    return bad("database '" + db + "' is not a non-negative number");
  return a;
}

RedisTier::RedisTier(const RedisTierOptions& options, const char* role) : options_(options), role_(role) {}

RedisTier::~RedisTier() { DisconnectLocked(); }

Result<std::unique_ptr<RedisTier>> RedisTier::Create(const RedisTierOptions& o) {
  const std::string where = "redis kv tier " + o.address.host + ":" + std::to_string(o.address.port);
  if (o.address.host.empty()) return Status::Error(where + ": empty host");
  if (o.address.port < 1 || o.address.port > 65535)
    return Status::Error(where + ": port out of range 1..65535");
  if (o.ttl_seconds < 0) return Status::Error(where + ": ttl_seconds must be >= 0 (0: no expiry)");
  if (!(o.connect_timeout_s > 0) || !(o.op_timeout_s > 0) || o.retry_interval_s < 0)
    return Status::Error(where + ": timeouts must be > 0 and retry_interval_s >= 0");
  std::unique_ptr<RedisTier> t(new RedisTier(o, "lookups"));
  // Writes go over a connection of their own: a lookup (EXISTS, GET) never
  // queues behind a write-back SET.
  t->writer_.reset(new RedisTier(o, "writes"));
  return t;
}

std::string RedisTier::KeyOf(BlockKey key) const {
  return options_.key_prefix + options_.fingerprint.hex() + ":" + ChecksumHex(key);
}

void RedisTier::DisconnectLocked() {
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

Status RedisTier::ConnectLocked() {
  DisconnectLocked();
  const RedisAddress& a = options_.address;
  const std::string where = "redis " + a.host + ":" + std::to_string(a.port);
  redisContext* c = redisConnectWithTimeout(a.host.c_str(), a.port, ToTimeval(options_.connect_timeout_s));
  if (!c) return Status::Error(where + ": cannot allocate a connection");
  if (c->err) {
    Status s = Status::Error(where + ": connect failed: " + c->errstr);
    redisFree(c);
    return s;
  }
  redisSetTimeout(c, ToTimeval(options_.op_timeout_s));
  redisEnableKeepAlive(c);
  ctx_ = c;
  auto setup = [&](std::initializer_list<std::string> args) -> Status {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& s : args) {
      argv.push_back(s.data());
      lens.push_back(s.size());
    }
    ScopedSigpipeBlock guard;
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    Status st;
    if (!r) st = Status::Error(where + ": " + ctx_->errstr);
    else if (r->type == REDIS_REPLY_ERROR) st = Status::Error(where + ": " + std::string(r->str, r->len));
    if (r) freeReplyObject(r);
    return st;
  };
  Status s;
  if (!a.password.empty()) s = setup({"AUTH", a.password});
  if (s.ok() && a.db != 0) s = setup({"SELECT", std::to_string(a.db)});
  if (!s.ok()) DisconnectLocked();
  return s;
}

std::string RedisTier::WhereLocked() const {
  return std::string("redis kv tier ") + options_.address.host + ":" + std::to_string(options_.address.port) + " (" +
         role_ + ")";
}

void RedisTier::FailLocked(const std::string& what) {
  ++stats_.errors;
  DisconnectLocked();
  const uint64_t now = Env::Default()->NowMicros();
  retry_after_us_ = now + static_cast<uint64_t>(options_.retry_interval_s * 1e6);
  if (down_) {
    ++suppressed_;
    return;
  }
  down_ = true;
  down_since_us_ = now;
  suppressed_ = 0;
  ++outages_;
  LOG_WARN("%s: outage: %s; further errors are not logged until it reconnects (retrying every %gs; a cache "
           "error only costs a recompute)",
           WhereLocked().c_str(), what.c_str(), options_.retry_interval_s);
}

void RedisTier::UpLocked() {
  if (!down_) return;
  down_ = false;
  ++reconnects_;
  const double secs = static_cast<double>(Env::Default()->NowMicros() - down_since_us_) * 1e-6;
  LOG_INFO("%s: reconnected after an outage of %.1fs (%lld more errors meanwhile, not logged)", WhereLocked().c_str(),
           secs, static_cast<long long>(suppressed_));
}

bool RedisTier::ConnectedLocked() {
  if (ctx_) return true;
  if (Env::Default()->NowMicros() < retry_after_us_) {
    ++stats_.errors;  // failing fast while the server is believed down
    ++suppressed_;
    return false;
  }
  if (Status s = ConnectLocked(); !s.ok()) {
    FailLocked(s.message());
    return false;
  }
  return true;
}

std::unique_ptr<RedisTier::Reply> RedisTier::CommandLocked(int argc, const char** argv, const size_t* lens) {
  if (!ConnectedLocked()) return nullptr;
  auto reply = std::make_unique<Reply>();
  {
    ScopedSigpipeBlock guard;
    reply->r = static_cast<redisReply*>(redisCommandArgv(ctx_, argc, argv, lens));
  }
  if (!reply->r) {
    FailLocked(std::string(argv[0]) + " failed: " + ctx_->errstr);
    return nullptr;
  }
  UpLocked();  // the server answered
  if (reply->r->type == REDIS_REPLY_ERROR) {
    // The server answered: the connection is fine, the command was not.
    ++stats_.errors;
    LogTierError("redis", stats_.errors, std::string(argv[0]) + ": " + std::string(reply->r->str, reply->r->len));
    return nullptr;
  }
  return reply;
}

void RedisTier::Put(const KvBlock& b) {
  if (writer_) {
    writer_->Put(b);
    return;
  }
  if (options_.block_floats > 0 && static_cast<int64_t>(b.data.size()) != options_.block_floats) {
    OpLock lock(this);
    ++stats_.errors;
    return;
  }
  const std::string record = EncodeBlockRecord(b, options_.fingerprint);
  const std::string key = KeyOf(b.key), ttl = std::to_string(options_.ttl_seconds);
  const char* argv[5] = {"SET", key.data(), record.data(), "EX", ttl.data()};
  const size_t lens[5] = {3, key.size(), record.size(), 2, ttl.size()};
  OpLock lock(this);
  if (!CommandLocked(options_.ttl_seconds > 0 ? 5 : 3, argv, lens)) return;
  ++stats_.puts;
  stats_.bytes_written += static_cast<int64_t>(b.data.size() * sizeof(float));
}

bool RedisTier::Get(BlockKey key, KvBlock* out) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string k = KeyOf(key);
  const char* argv[2] = {"GET", k.data()};
  const size_t lens[2] = {3, k.size()};
  OpLock lock(this);
  auto reply = CommandLocked(2, argv, lens);
  if (!reply || reply->r->type != REDIS_REPLY_STRING) {
    if (reply && reply->r->type != REDIS_REPLY_NIL) ++stats_.errors;  // not a string: not ours
    ++stats_.misses;
    return false;
  }
  Status s = DecodeBlockRecord(std::string_view(reply->r->str, reply->r->len), options_.fingerprint, key,
                               options_.block_floats, out);
  if (!s.ok()) {
    ++stats_.errors;
    ++stats_.misses;
    LogTierError("redis", stats_.errors, k + " dropped: " + s.message());
    const char* del[2] = {"DEL", k.data()};
    const size_t del_lens[2] = {3, k.size()};
    (void)CommandLocked(2, del, del_lens);
    return false;
  }
  ++stats_.hits;
  stats_.bytes_read += static_cast<int64_t>(out->data.size() * sizeof(float));
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

bool RedisTier::Contains(BlockKey key) {
  const std::string k = KeyOf(key);
  const char* argv[2] = {"EXISTS", k.data()};
  const size_t lens[2] = {6, k.size()};
  OpLock lock(this);
  auto reply = CommandLocked(2, argv, lens);
  return reply && reply->r->type == REDIS_REPLY_INTEGER && reply->r->integer > 0;
}

std::vector<bool> RedisTier::ContainsMany(const std::vector<BlockKey>& keys) {
  std::vector<bool> out(keys.size(), false);
  if (keys.empty()) return out;
  std::vector<std::string> ks;
  ks.reserve(keys.size());
  for (BlockKey k : keys) ks.push_back(KeyOf(k));
  OpLock lock(this);
  if (!ConnectedLocked()) return out;
  ScopedSigpipeBlock guard;
  // All the EXISTS go out in one write; the replies come back in order.
  for (const std::string& k : ks) {
    const char* argv[2] = {"EXISTS", k.data()};
    const size_t lens[2] = {6, k.size()};
    if (redisAppendCommandArgv(ctx_, 2, argv, lens) != REDIS_OK) {
      FailLocked(std::string("EXISTS (pipelined) failed: ") + ctx_->errstr);
      return std::vector<bool>(keys.size(), false);
    }
  }
  for (size_t i = 0; i < ks.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      FailLocked(std::string("EXISTS (pipelined) failed: ") + ctx_->errstr);
      return std::vector<bool>(keys.size(), false);
    }
    if (i == 0) UpLocked();
    auto* r = static_cast<redisReply*>(raw);
    out[i] = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    if (r->type == REDIS_REPLY_ERROR) ++stats_.errors;
    freeReplyObject(r);
  }
  return out;
}

void RedisTier::Evict(BlockKey key) {
  const std::string k = KeyOf(key);
  const char* argv[2] = {"DEL", k.data()};
  const size_t lens[2] = {3, k.size()};
  OpLock lock(this);
  (void)CommandLocked(2, argv, lens);
}

int64_t RedisTier::size_blocks() {
  const std::string match = GlobEscape(options_.key_prefix + options_.fingerprint.hex() + ":") + "*";
  std::string cursor = "0";
  int64_t n = 0;
  OpLock lock(this);
  do {
    const char* argv[6] = {"SCAN", cursor.data(), "MATCH", match.data(), "COUNT", "1000"};
    const size_t lens[6] = {4, cursor.size(), 5, match.size(), 5, 4};
    auto reply = CommandLocked(6, argv, lens);
    if (!reply) return 0;
    redisReply* r = reply->r;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING) {
      ++stats_.errors;
      return 0;
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    n += static_cast<int64_t>(r->element[1]->elements);
  } while (cursor != "0");
  return n;
}

TierStats RedisTier::stats() {
  TierStats w;
  if (writer_) w = writer_->stats();
  std::lock_guard<std::mutex> lock(published_mu_);
  TierStats s = published_;
  s.puts += w.puts;
  s.bytes_written += w.bytes_written;
  s.errors += w.errors;
  return s;
}

int64_t RedisTier::outages() {
  const int64_t w = writer_ ? writer_->outages() : 0;
  std::lock_guard<std::mutex> lock(published_mu_);
  return published_outages_ + w;
}

int64_t RedisTier::reconnects() {
  const int64_t w = writer_ ? writer_->reconnects() : 0;
  std::lock_guard<std::mutex> lock(published_mu_);
  return published_reconnects_ + w;
}

Status RedisTier::Ping() {
  OpLock lock(this);
  if (!ctx_) RETURN_IF_ERROR(ConnectLocked());
  ScopedSigpipeBlock guard;
  auto* r = static_cast<redisReply*>(redisCommand(ctx_, "PING"));
  const std::string where = "redis " + options_.address.host + ":" + std::to_string(options_.address.port);
  if (!r) {
    Status s = Status::Error(where + ": PING failed: " + ctx_->errstr);
    DisconnectLocked();
    return s;
  }
  const bool ok = r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "PONG";
  const std::string got = r->str ? std::string(r->str, r->len) : "";
  freeReplyObject(r);
  if (!ok) return Status::Error(where + ": PING answered '" + got + "'");
  UpLocked();
  return Status::Ok();
}

}  // namespace myriad::serve
