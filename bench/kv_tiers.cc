// KV-cache tiers on a replayed multi-turn agent trace: Myriad's engine with
// (a) no prefix cache (the peer), (b) the device pool only, (c) all four tiers
// (device pool + host + disk + Redis), the device pool sized to about 10% of
// the trace's KV working set. Reports hit rate and its ideal, TTFT p50/p99,
// throughput and the bill; one JSON line per configuration.
//
//   bench_kv_tiers --config configs/demo-moe.toml [--set k=v ...] [--sessions 80] [--turns 5]
//                  [--concurrency 4 (engine batch)] [--active 16 (sessions in flight)]
//                  [--think-min-ms 500] [--think-max-ms 1500] [--repeats 1 (alternating rounds)]
//                  [--redis redis://127.0.0.1:6379] [--disk-dir DIR] [--seed 1]
//                  [--only a|b|c] [--tiers host,disk,redis (the lower tiers of (c))]
// bench/kv_tiers.sh starts a redis-server on a free loopback port for (c).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_args.h"
#include "core/rng.h"
#include "serve/billing.h"
#include "serve/engine.h"
#include "serve/kvcache/disk_tier.h"
#include "serve/kvcache/host_tier.h"
#include "serve/kvcache/redis_tier.h"
#include "serve/kv_pool.h"
#include "train/trainer.h"

using namespace myriad;
using namespace myriad::serve;

namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A session: one of a few shared system prompts, then turns of user text;
// the assistant's replies (generated) are appended to the context.
struct Session {
  int system = 0;
  std::vector<std::vector<int32_t>> user;  // per turn
  std::vector<int> think_ms;               // pause before each turn after the first
};

struct Trace {
  std::vector<std::vector<int32_t>> systems;
  std::vector<Session> sessions;
};

Trace MakeTrace(int n_sessions, int turns, int vocab, uint64_t seed, int think_min_ms, int think_max_ms) {
  Rng rng(seed);
  Trace t;
  auto text = [&](int n) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = 3 + static_cast<int32_t>(rng.Below(vocab - 3));
    return v;
  };
  for (int s = 0; s < 3; ++s) t.systems.push_back(text(96 + 32 * s));
  for (int i = 0; i < n_sessions; ++i) {
    Session s;
    s.system = static_cast<int>(rng.Below(3));
    const int nt = turns - 1 + static_cast<int>(rng.Below(3));
    for (int k = 0; k < nt; ++k) {
      s.user.push_back(text(24 + static_cast<int>(rng.Below(40))));
      s.think_ms.push_back(think_min_ms + static_cast<int>(rng.Below(std::max(1, think_max_ms - think_min_ms))));
    }
    t.sessions.push_back(std::move(s));
  }
  return t;
}

struct Result1 {
  std::string name;
  std::vector<double> ttft;
  int64_t prompt = 0, cached = 0, ideal = 0, completion = 0, requests = 0;
  double seconds = 0, cost = 0;
  EngineStats stats;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// `active` sessions are in flight at once (each thinking between its turns);
// the engine decodes at most ec.max_batch of their requests at a time.
Result1 Replay(const std::string& name, const Model& model, const Trace& trace, EngineConfig ec, int active,
               int max_tokens) {
  Result1 r;
  r.name = name;
  auto eng = Engine::Create(&model, ec);
  if (!eng.ok()) { std::fprintf(stderr, "%s: %s\n", name.c_str(), eng.status().message().c_str()); std::exit(1); }
  Engine& engine = **eng;
  std::mutex mu;
  // Ideal hits: full blocks of the prompt already seen as a prefix of an
  // earlier request's tokens (prompt + reply) -- what a cache of unlimited
  // size would serve.
  std::unordered_set<std::string> seen;
  auto prefix_keys = [](const std::vector<int32_t>& toks, size_t n_blocks) {
    std::vector<std::string> keys;
    std::string k;
    for (size_t b = 0; b < n_blocks; ++b) {
      k.append(reinterpret_cast<const char*>(toks.data() + b * kBlockTokens), kBlockTokens * sizeof(int32_t));
      keys.push_back(k);
    }
    return keys;
  };
  std::atomic<size_t> next{0};
  const double t0 = Now();
  auto worker = [&] {
    for (;;) {
      const size_t si = next++;
      if (si >= trace.sessions.size()) return;
      const Session& s = trace.sessions[si];
      std::vector<int32_t> ctx = trace.systems[s.system];
      for (size_t k = 0; k < s.user.size(); ++k) {
        if (k > 0) std::this_thread::sleep_for(std::chrono::milliseconds(s.think_ms[k]));
        ctx.insert(ctx.end(), s.user[k].begin(), s.user[k].end());
        int64_t ideal = 0;
        {
          // Blocks of earlier prompts count as seen from their submission
          // (their KV exists once prefilled), replies once they finish.
          std::lock_guard<std::mutex> l(mu);
          const size_t nb = (ctx.size() - 1) / kBlockTokens;
          bool matching = true;
          for (const auto& key : prefix_keys(ctx, nb)) {
            matching = matching && seen.count(key);
            if (matching) ideal += kBlockTokens;
            seen.insert(key);
          }
        }
        GenerationParams gp;
        gp.max_tokens = max_tokens;
        std::mutex rm;
        std::condition_variable cv;
        bool done = false;
        double first = 0;
        TokenEvent last;
        std::vector<int32_t> out;
        const double sent = Now();
        auto id = engine.Submit(ctx, gp, [&](const TokenEvent& e) {
          std::lock_guard<std::mutex> l(rm);
          if (e.token >= 0) {
            if (first == 0) first = Now();
            out.push_back(e.token);
          }
          if (e.done) { last = e; done = true; cv.notify_all(); }
        });
        if (!id.ok()) { std::fprintf(stderr, "%s: submit: %s\n", name.c_str(), id.status().message().c_str()); std::exit(1); }
        {
          std::unique_lock<std::mutex> l(rm);
          cv.wait(l, [&] { return done; });
        }
        std::lock_guard<std::mutex> l(mu);
        r.ttft.push_back((first > 0 ? first : Now()) - sent);
        r.prompt += last.prompt_tokens;
        r.cached += last.cached_tokens;
        r.completion += last.completion_tokens;
        r.ideal += ideal;
        r.requests++;
        std::vector<int32_t> full = ctx;
        full.insert(full.end(), out.begin(), out.end());
        const size_t nb = full.size() > 1 ? (full.size() - 1) / kBlockTokens : 0;
        for (const auto& key : prefix_keys(full, nb)) seen.insert(key);
        ctx.insert(ctx.end(), out.begin(), out.end());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < active; ++i) threads.emplace_back(worker);
  for (auto& th : threads) th.join();
  r.seconds = Now() - t0;
  r.stats = engine.stats();
  engine.Shutdown();
  r.cost = PriceRequest(PriceTable{}, r.prompt, r.cached, r.completion).total();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args;
  args.opts = {{"--sessions", "80"}, {"--turns", "5"}, {"--concurrency", "4"}, {"--active", "16"}, {"--max-tokens", "8"},
               {"--redis", ""}, {"--disk-dir", ""}, {"--seed", "1"}, {"--only", ""}, {"--pool-frac", "0.10"},
               {"--tiers", "host,disk,redis"}, {"--think-min-ms", "500"}, {"--think-max-ms", "1500"},
               {"--repeats", "1"}};
  if (!args.Parse(argc, argv)) return 2;
  ModelConfig mc;
  TrainConfig tc;
  Status s = LoadRunConfig(args.config, args.sets, &mc, &tc);
  if (!s.ok()) { std::fprintf(stderr, "%s\n", s.message().c_str()); return 1; }
  Model model(mc);
  model.InitWeights(tc.seed);
  const Trace trace = MakeTrace(args.Int("--sessions"), args.Int("--turns"), static_cast<int>(mc.vocab_size),
                                static_cast<uint64_t>(args.Int("--seed")), args.Int("--think-min-ms"),
                                args.Int("--think-max-ms"));
  const int max_tokens = args.Int("--max-tokens"), conc = args.Int("--concurrency"), active = args.Int("--active");
  // KV working set: every session's final context (system prompts once).
  int64_t ws_tokens = 0;
  for (const auto& sys : trace.systems) ws_tokens += static_cast<int64_t>(sys.size());
  for (const auto& se : trace.sessions)
    for (const auto& u : se.user) ws_tokens += static_cast<int64_t>(u.size()) + max_tokens;
  const int64_t ws_blocks = (ws_tokens + kBlockTokens - 1) / kBlockTokens;
  // The running requests' own blocks must fit: concurrency x the longest context.
  int64_t max_ctx = 0;
  for (const auto& se : trace.sessions) {
    int64_t n = static_cast<int64_t>(trace.systems[se.system].size());
    for (const auto& u : se.user) n += static_cast<int64_t>(u.size()) + max_tokens;
    max_ctx = std::max(max_ctx, n);
  }
  if (max_ctx >= mc.max_seq_len) {
    std::fprintf(stderr, "the trace's longest context (%lld) needs model.max_seq_len > it (hint: --set model.max_seq_len=1024)\n",
                 static_cast<long long>(max_ctx));
    return 2;
  }
  const int64_t pool = std::max<int64_t>(
      static_cast<int64_t>(std::atof(args.Str("--pool-frac").c_str()) * static_cast<double>(ws_blocks)),
      static_cast<int64_t>(conc) * ((max_ctx + kBlockTokens - 1) / kBlockTokens + 1));
  std::fprintf(stderr, "# trace: %zu sessions, working set %lld tokens (%lld blocks); device pool %lld blocks (%.0f%%)\n",
               trace.sessions.size(), static_cast<long long>(ws_tokens), static_cast<long long>(ws_blocks),
               static_cast<long long>(pool), 100.0 * pool / ws_blocks);
  const std::string only = args.Str("--only");
  EngineConfig base;
  base.kv_pool_blocks = pool;
  base.max_batch = conc;
  base.max_queue = active + 8;
  auto run_a = [&]() -> Result1 {
    EngineConfig ec = base;
    ec.prefix_cache = false;
    return Replay("a_no_cache", model, trace, ec, active, max_tokens);
  };
  auto run_b = [&]() -> Result1 { return Replay("b_device_only", model, trace, base, active, max_tokens); };
  auto run_c = [&]() -> Result1 {
    // Fresh tiers each time: an empty host pool, disk directory and Redis key space.
    ModelFingerprint fp = FingerprintModel(model);
    HostTierOptions ho;
    ho.capacity_blocks = ws_blocks / 2;
    HostTier host(ho);
    std::string dir = args.Str("--disk-dir");
    if (dir.empty()) dir = (std::filesystem::temp_directory_path() / "myriad-bench-kv-disk").string();
    std::filesystem::remove_all(dir);
    DiskTierOptions dopt;
    dopt.dir = dir;
    dopt.capacity_bytes = ws_blocks * BlockFloats(mc) * 4 * 2;
    dopt.fingerprint = fp;
    dopt.block_floats = BlockFloats(mc);
    auto disk = DiskTier::Open(dopt);
    if (!disk.ok()) { std::fprintf(stderr, "disk tier: %s\n", disk.status().message().c_str()); std::exit(1); }
    EngineConfig ec = base;
    const std::string want = "," + args.Str("--tiers") + ",";
    auto wanted = [&](const char* t) { return want.find("," + std::string(t) + ",") != std::string::npos; };
    if (wanted("host")) ec.tiers.push_back(&host);
    if (wanted("disk")) ec.tiers.push_back(disk->get());
    std::unique_ptr<RedisTier> redis;
    if (!args.Str("--redis").empty() && wanted("redis")) {
      auto addr = ParseRedisUrl(args.Str("--redis"));
      if (!addr.ok()) { std::fprintf(stderr, "%s\n", addr.status().message().c_str()); std::exit(1); }
      RedisTierOptions ro;
      ro.address = *addr;
      ro.fingerprint = fp;
      ro.block_floats = BlockFloats(mc);
      ro.key_prefix = "myriad:bench:" + std::to_string(Now()) + ":";
      auto rt = RedisTier::Create(ro);
      if (!rt.ok()) { std::fprintf(stderr, "redis tier: %s\n", rt.status().message().c_str()); std::exit(1); }
      redis = std::move(rt).value();
      ec.tiers.push_back(redis.get());
    }
    Result1 r = Replay(ec.tiers.size() == 3 ? "c_four_tiers" : "c_tiers_" + args.Str("--tiers"), model, trace, ec,
                       active, max_tokens);
    redis.reset();
    disk.value().reset();  // flushes (syncfs) before the directory goes
    std::filesystem::remove_all(dir);
    return r;
  };
  // Alternating rounds (a b c a b c ...): each variant's row is its median
  // round by TTFT p50, the ratio is of the medians.
  const int repeats = std::max(1, args.Int("--repeats"));
  std::vector<std::vector<Result1>> rounds(3);
  for (int rep = 0; rep < repeats; ++rep) {
    if (only.empty() || only == "a") rounds[0].push_back(run_a());
    if (only.empty() || only == "b") rounds[1].push_back(run_b());
    if (only.empty() || only == "c") rounds[2].push_back(run_c());
    for (const auto& v : rounds)
      if (static_cast<int>(v.size()) == rep + 1)
        std::fprintf(stderr, "# round %d/%d %-16s TTFT p50 %.1f ms\n", rep + 1, repeats, v.back().name.c_str(),
                     Percentile(v.back().ttft, 0.5) * 1e3);
  }
  std::vector<Result1> results;
  std::vector<std::vector<double>> p50s;
  for (auto& v : rounds) {
    if (v.empty()) continue;
    std::vector<double> p;
    for (const auto& r : v) p.push_back(Percentile(r.ttft, 0.5));
    std::vector<size_t> order(v.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] < p[y]; });
    results.push_back(std::move(v[order[order.size() / 2]]));
    p50s.push_back(p);
  }
  const Result1* peer = results.empty() || results[0].name != "a_no_cache" ? nullptr : &results[0];
  for (const auto& r : results) {
    nlohmann::json tiers = nlohmann::json::object();
    tiers["device"] = r.stats.t0_hits;
    for (const auto& [n, v] : r.stats.tier_hits) tiers[n] = v;
    const double hit = r.prompt ? static_cast<double>(r.cached) / r.prompt : 0;
    const double ideal = r.prompt ? static_cast<double>(r.ideal) / r.prompt : 0;
    nlohmann::json j = {
        {"bench", "kv_tiers"},
        {"config", {{"variant", r.name}, {"model", args.config}, {"sessions", trace.sessions.size()},
                    {"max_batch", conc}, {"active_sessions", active}, {"device_pool_blocks", pool}, {"working_set_blocks", ws_blocks}}},
        {"myriad", Percentile(r.ttft, 0.5) * 1e3},
        {"peer", peer ? nlohmann::json(Percentile(peer->ttft, 0.5) * 1e3) : nlohmann::json(nullptr)},
        {"unit", "ms TTFT p50 (peer: no prefix cache)"},
        {"ttft_p99_ms", Percentile(r.ttft, 0.99) * 1e3},
        {"hit_rate", hit}, {"ideal_hit_rate", ideal}, {"hit_vs_ideal", ideal > 0 ? hit / ideal : 0},
        {"tokens_per_s", (r.prompt + r.completion) / r.seconds}, {"requests", r.requests},
        {"prompt_tokens", r.prompt}, {"cached_tokens", r.cached}, {"completion_tokens", r.completion},
        {"recomputed_hit_tokens", r.stats.recomputed_hit_tokens}, {"hits_by_tier_tokens", tiers},
        {"bill", r.cost}, {"seconds", r.seconds}, {"rounds", repeats},
        {"ttft_p50_ms_by_round", [&] {
           std::vector<double> ms;
           for (double x : p50s[&r - results.data()]) ms.push_back(x * 1e3);
           return ms;
         }()}};
    std::printf("%s\n", j.dump().c_str());
    std::fprintf(stderr, "# %-24s hit %.3f (ideal %.3f, %.0f%% of it)  TTFT p50 %.1f ms p99 %.1f ms  %.0f tok/s  bill %.6f%s\n",
                 r.name.c_str(), hit, ideal, ideal > 0 ? 100 * hit / ideal : 0, Percentile(r.ttft, 0.5) * 1e3,
                 Percentile(r.ttft, 0.99) * 1e3, (r.prompt + r.completion) / r.seconds, r.cost,
                 peer && &r != peer ? (" | TTFT p50 " + std::to_string(Percentile(peer->ttft, 0.5) / std::max(1e-9, Percentile(r.ttft, 0.5))) + "x better than no cache").c_str() : "");
  }
  return 0;
}
