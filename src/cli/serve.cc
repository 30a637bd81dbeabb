// myriad serve --ckpt DIR: an OpenAI-compatible HTTP server in front of the
// serving engine (docs/serving.md). SIGINT/SIGTERM stop it gracefully and
// print a summary (requests, tokens, cache hits per tier, the bill).
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/ckpt_util.h"
#include "cli/verbs.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "edge/edge_front.h"
#include "edge/judge.h"
#include "edge/router.h"
#include "edge/tagger.h"
#include "serve/billing.h"
#include "serve/chat_template.h"
#include "serve/engine.h"
#include "serve/http/client.h"
#include "serve/http/server.h"
#include "serve/kv_pool.h"
#include "serve/kvcache/disk_tier.h"
#include "serve/kvcache/host_tier.h"
#include "serve/kvcache/redis_tier.h"

namespace myriad::cli {

namespace {

// The model id clients name: the run directory's name (runs/NAME/step_N -> NAME).
std::string DefaultModelName(const std::string& step_dir) {
  std::filesystem::path p(step_dir);
  if (p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  if (name.rfind("step_", 0) == 0 && !p.parent_path().filename().empty()) name = p.parent_path().filename().string();
  return name.empty() ? "myriad" : name;
}

}  // namespace

int RunServe(int argc, char** argv) {
  CLI::App app{"Serve a checkpoint over an OpenAI-compatible HTTP API (docs/serving.md)", "myriad serve"};
  app.option_defaults()->always_capture_default();
  std::string ckpt, hf, tokenizer_path, chat_template_path, prices_path, model_name;
  serve::ServerConfig scfg;
  serve::EngineConfig ecfg;
  int64_t max_body = static_cast<int64_t>(scfg.max_body_bytes);
  std::optional<double> price_miss, price_hit, price_out;  // unset: the table's value stands
  bool no_prefix_cache = false;
  std::string weights = "fp32";
  app.add_option("--ckpt", ckpt, "run directory or step directory (ours, or written by `myriad import`)");
  app.add_option("--hf", hf, "a Hugging Face model folder (config.json, safetensors, tokenizer, chat template)");
  app.add_option("--host", scfg.host, "address to bind (default 127.0.0.1: this machine only)");
  app.add_option("--port", scfg.port, "port (0: any free port, printed at start)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", scfg.api_key, "require 'Authorization: Bearer KEY' (default: $MYRIAD_API_KEY, else none)");
  app.add_option("--model-name", model_name, "the model id clients send (default: the run directory's name)");
  app.add_option("--max-batch", ecfg.max_batch, "sequences decoding at once")->check(CLI::PositiveNumber);
  app.add_option("--max-queue", ecfg.max_queue, "waiting requests before 429")->check(CLI::NonNegativeNumber);
  app.add_option("--kv-blocks", ecfg.kv_pool_blocks, "KV blocks of 16 tokens in the device pool (0: max-batch full sequences)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--step-tokens", ecfg.step_token_budget, "prefill+decode tokens per engine step")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-prefix-cache", no_prefix_cache, "do not reuse KV blocks across requests");
  std::string speculative = "off";
  app.add_option("--speculative", speculative,
                 "draft tokens and verify them in the batch's forward: mtp (the model's MTP modules), ngram "
                 "(prompt lookup), auto (n-gram where the context repeats, else MTP), off. The draft length "
                 "adapts to the batch and speculation turns off where the measured cost model says it does not pay")
      ->check(CLI::IsMember({"off", "ngram", "mtp", "auto"}));
  app.add_option("--draft-tokens", ecfg.draft_tokens, "the most draft tokens per request per step")
      ->check(CLI::Range(1, 16));
  app.add_flag("--fixed-draft", [&ecfg](int64_t) { ecfg.adaptive_draft = false; },
               "always draft --draft-tokens tokens (no cost model; benchmarks)");
  app.add_option("--weights", weights, "weight format the engine computes with: fp32, fp16 or int8 (converted at start)");
  app.add_option("--max-body-bytes", max_body, "largest request body (413 above)")->check(CLI::PositiveNumber);
  app.add_option("--http-threads", scfg.http_threads,
                 "completions executed at once (waiting, idle and slow connections take no thread)")
      ->check(CLI::PositiveNumber);
  app.add_option("--drain-timeout", scfg.drain_timeout_s, "seconds a stop waits for running requests")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--header-timeout-s", scfg.header_timeout_s,
                 "seconds a request's head may take from its first byte (then the connection is closed)")
      ->check(CLI::PositiveNumber);
  app.add_option("--body-timeout-s", scfg.body_timeout_s,
                 "seconds a request body may take to arrive, and each response write to finish")
      ->check(CLI::PositiveNumber);
  app.add_option("--keep-alive-timeout-s", scfg.keep_alive_timeout_s,
                 "seconds an idle kept-alive connection stays open")
      ->check(CLI::PositiveNumber);
  app.add_option("--chat-template", chat_template_path, "chat template TOML (default: the one stored with the model)");
  app.add_option("--tokenizer", tokenizer_path, "tokenizer model (default: the run's)");
  app.add_option("--prices", prices_path, "TOML file with a [prices] table (per 1M tokens)");
  app.add_option("--price-input-miss", price_miss, "price per 1M prompt tokens computed (default 0.9)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--price-input-hit", price_hit, "price per 1M prompt tokens from the KV cache (default 0.08)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--price-output", price_out, "price per 1M generated tokens (default 3.6)")->check(CLI::NonNegativeNumber);
  // KV tiers below the device pool, in this order: host memory, disk, Redis.
  int64_t kv_host_blocks = 0, kv_disk_mb = 1024;
  std::string kv_host_format = "fp32", kv_disk_dir, kv_redis_url;
  int kv_redis_ttl = 0;
  app.add_option("--kv-host-blocks", kv_host_blocks, "T1: blocks of 16 tokens kept in host memory (0: no host tier)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-host-format", kv_host_format, "T1 storage: fp32 (exact), fp16 or int8");
  app.add_option("--kv-disk", kv_disk_dir, "T2: directory for KV blocks on local disk (survives restarts)");
  app.add_option("--kv-disk-mb", kv_disk_mb, "T2 capacity in MiB")->check(CLI::PositiveNumber);
  app.add_option("--kv-redis", kv_redis_url, "T3: remote KV store shared by servers, e.g. redis://127.0.0.1:6379");
  app.add_flag("--kv-write-through", ecfg.write_through,
               "send each full KV block to the lower tiers at once (servers sharing Redis see each other's prefixes)");
  std::string kv_load = "auto";
  app.add_option("--kv-load", kv_load,
                 "a prefix hit in a lower tier: auto (load it or recompute it, whichever the cost model says is faster) "
                 "or always (load it)")
      ->check(CLI::IsMember({"auto", "always"}));
  app.add_option("--kv-redis-ttl", kv_redis_ttl, "T3: seconds a block lives in Redis (0: no expiry)")
      ->check(CLI::NonNegativeNumber);
  // Edge and cloud (docs/edge.md): this server answers on the device or
  // forwards to the cloud, as the router or the request says.
  bool edge = false;
  std::string cloud_url, cloud_model, cloud_key_env = "MYRIAD_CLOUD_API_KEY", cloud_prices_path, router_path, tagger_dir;
  double cloud_connect_timeout = 3;
  app.add_flag("--edge", edge, "answer on this device or forward to --cloud, per request (docs/edge.md)");
  app.add_option("--cloud", cloud_url, "the cloud's OpenAI-compatible endpoint, e.g. http://10.0.0.2:8000 (with --edge)");
  app.add_option("--cloud-model", cloud_model, "the model id to ask the cloud for (default: its /v1/models' first)");
  app.add_option("--cloud-api-key-env", cloud_key_env, "environment variable holding the cloud's API key");
  app.add_option("--cloud-prices", cloud_prices_path,
                 "TOML [prices] of the cloud, for the cost saved (default: this server's prices)");
  app.add_option("--router", router_path, "router.json of `myriad route train`: decides \"auto\" requests (default: edge)");
  app.add_option("--tagger", tagger_dir, "the desensitiser's tagger of names, addresses, organisations (myriad redact train)");
  app.add_option("--cloud-connect-timeout-s", cloud_connect_timeout,
                 "seconds to reach the cloud before the edge answers instead")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if ((!cloud_url.empty() || !router_path.empty() || !tagger_dir.empty()) && !edge) {
    std::fprintf(stderr, "myriad serve: --cloud needs --edge (hint: myriad serve --edge --cloud %s ...)\n",
                 cloud_url.c_str());
    return 2;
  }
  if (!cloud_url.empty()) {
    while (!cloud_url.empty() && cloud_url.back() == '/') cloud_url.pop_back();
    if (auto u = serve::ParseHttpUrl(cloud_url); !u.ok()) {
      std::fprintf(stderr, "myriad serve: --cloud: %s\n", u.status().message().c_str());
      return 2;
    }
  }
  ParseDraftMode(speculative, &ecfg.speculative);
  if (!ParseWeightFormat(weights, &ecfg.weights)) {
    std::fprintf(stderr, "myriad serve: --weights %s is not known (hint: fp32, fp16 or int8)\n", weights.c_str());
    return 2;
  }
  scfg.max_body_bytes = static_cast<size_t>(max_body);
  ecfg.prefix_cache = !no_prefix_cache;
  ecfg.load_or_recompute = kv_load == "auto";
  if (scfg.api_key.empty()) {
    if (const char* k = std::getenv("MYRIAD_API_KEY")) scfg.api_key = k;
  }

  // Prices: defaults, then the file, then single flags.
  serve::PriceTable prices;
  if (!prices_path.empty()) {
    auto p = prices.OverriddenFromToml(prices_path);
    if (!p.ok()) {
      std::fprintf(stderr, "myriad serve: %s\n", p.status().message().c_str());
      return 2;
    }
    prices = *p;
  }
  if (price_miss) prices.input_cache_miss = *price_miss;
  if (price_hit) prices.input_cache_hit = *price_hit;
  if (price_out) prices.output = *price_out;
  serve::PriceTable cloud_prices = prices;
  if (!cloud_prices_path.empty()) {
    auto p = prices.OverriddenFromToml(cloud_prices_path);
    if (!p.ok()) {
      std::fprintf(stderr, "myriad serve: --cloud-prices: %s\n", p.status().message().c_str());
      return 2;
    }
    cloud_prices = *p;
  }

  // SIGINT/SIGTERM are taken by sigwait below: block them before any thread
  // (engine, OpenMP, HTTP) starts, so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto lm = LoadModelFor(ckpt, hf);
  if (!lm.ok()) {
    std::fprintf(stderr, "myriad serve: %s\n", lm.status().message().c_str());
    return 1;
  }
  if (tokenizer_path.empty()) tokenizer_path = lm->tokenizer_path;
  auto tok = Tokenizer::Load(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "myriad serve: %s\n", tok.status().message().c_str());
    return 1;
  }
  std::string template_origin = chat_template_path;
  auto tmpl = chat_template_path.empty() ? serve::ChatTemplate::ForModel(lm->dir, lm->hf_dir, &template_origin)
                                         : serve::ChatTemplate::LoadFile(chat_template_path);
  if (!tmpl.ok()) {
    std::fprintf(stderr, "myriad serve: %s\n", tmpl.status().message().c_str());
    return 1;
  }
  scfg.model_name = model_name.empty() ? DefaultModelName(lm->dir) : model_name;
  scfg.context_tokens = lm->model->config().max_seq_len;
  scfg.vocab_size = lm->model->config().vocab_size;
  scfg.model_eos_ids = lm->eos_token_ids;

  // Lower KV tiers (each checked now, so a bad setting fails at start).
  const ModelConfig& mcfg = lm->model->config();
  const serve::ModelFingerprint fp = serve::FingerprintModel(*lm->model);
  std::unique_ptr<serve::HostTier> host_tier;
  std::unique_ptr<serve::DiskTier> disk_tier;
  std::unique_ptr<serve::RedisTier> redis_tier;
  if (kv_host_blocks > 0) {
    auto fmt = serve::ParseKvStorageFormat(kv_host_format);
    if (!fmt.ok()) {
      std::fprintf(stderr, "myriad serve: --kv-host-format: %s\n", fmt.status().message().c_str());
      return 2;
    }
    serve::HostTierOptions ho;
    ho.capacity_blocks = kv_host_blocks;
    ho.format = *fmt;
    ho.row_floats = serve::KvRowFloats(mcfg);
    host_tier = std::make_unique<serve::HostTier>(ho);
    ecfg.tiers.push_back(host_tier.get());
  }
  if (!kv_disk_dir.empty()) {
    serve::DiskTierOptions dopt;
    dopt.dir = kv_disk_dir;
    dopt.capacity_bytes = kv_disk_mb << 20;
    dopt.fingerprint = fp;
    dopt.block_floats = serve::BlockFloats(mcfg);
    auto d = serve::DiskTier::Open(dopt);
    if (!d.ok()) {
      std::fprintf(stderr, "myriad serve: --kv-disk: %s\n", d.status().message().c_str());
      return 1;
    }
    disk_tier = std::move(d).value();
    LOG_INFO("serve: disk KV tier %s: %lld blocks of this model found", kv_disk_dir.c_str(),
             static_cast<long long>(disk_tier->size_blocks()));
    ecfg.tiers.push_back(disk_tier.get());
  }
  if (!kv_redis_url.empty()) {
    auto addr = serve::ParseRedisUrl(kv_redis_url);
    if (!addr.ok()) {
      std::fprintf(stderr, "myriad serve: --kv-redis: %s\n", addr.status().message().c_str());
      return 2;
    }
    serve::RedisTierOptions ro;
    ro.address = *addr;
    ro.fingerprint = fp;
    ro.block_floats = serve::BlockFloats(mcfg);
    ro.ttl_seconds = kv_redis_ttl;
    auto r = serve::RedisTier::Create(ro);
    if (!r.ok()) {
      std::fprintf(stderr, "myriad serve: --kv-redis: %s\n", r.status().message().c_str());
      return 1;
    }
    redis_tier = std::move(r).value();
    if (Status ping = redis_tier->Ping(); !ping.ok())
      LOG_WARN("serve: Redis KV tier not reachable yet (%s); requests go on without it until it is",
               ping.message().c_str());
    ecfg.tiers.push_back(redis_tier.get());
  }

  auto engine = serve::Engine::Create(lm->model.get(), ecfg);
  if (!engine.ok()) {
    std::fprintf(stderr, "myriad serve: %s\n", engine.status().message().c_str());
    return 1;
  }
  serve::HttpServer server(engine->get(), &*tok, std::move(*tmpl), prices, scfg);
  std::unique_ptr<edge::Tagger> tagger;
  std::unique_ptr<edge::Redactor> redactor;
  std::unique_ptr<edge::Router> router;
  std::unique_ptr<edge::EdgeFront> front;
  if (edge) {
    edge::EdgeFrontConfig fc;
    fc.cloud_url = cloud_url;
    fc.cloud_model = cloud_model;
    if (const char* k = std::getenv(cloud_key_env.c_str())) fc.cloud_api_key = k;
    fc.connect_timeout_s = cloud_connect_timeout;
    fc.cloud_prices = cloud_prices;
    if (!tagger_dir.empty()) {
      auto t = edge::LoadTagger(tagger_dir);
      if (!t.ok()) {
        std::fprintf(stderr, "myriad serve: --tagger: %s\n", t.status().message().c_str());
        server.Shutdown();
        (*engine)->Shutdown();
        return 1;
      }
      tagger = std::move(t).value();
    }
    redactor = std::make_unique<edge::Redactor>(tagger.get());
    if (!router_path.empty()) {
      auto r = edge::Router::Load(router_path, *lm->model, *tok, edge::PiiThrough(redactor.get()));
      if (!r.ok()) {
        std::fprintf(stderr, "myriad serve: --router: %s\n", r.status().message().c_str());
        server.Shutdown();
        (*engine)->Shutdown();
        return 1;
      }
      router = std::make_unique<edge::Router>(std::move(r).value());
    }
    front = std::make_unique<edge::EdgeFront>(fc, redactor.get(), router.get());
    server.SetFront(front.get());
    LOG_INFO("serve: edge front: cloud %s, router %s, tagger %s", cloud_url.empty() ? "none (every request on the edge)"
                                                                        : cloud_url.c_str(),
             router_path.empty() ? "none (auto = edge)" : router_path.c_str(),
             tagger_dir.empty() ? "none (patterns only)" : tagger_dir.c_str());
  }
  if (Status st = server.Start(); !st.ok()) {
    std::fprintf(stderr, "myriad serve: %s\n", st.message().c_str());
    (*engine)->Shutdown();
    return 1;
  }
  LOG_INFO("serve: model '%s' (%s, step %lld, context %lld tokens), chat template: %s", scfg.model_name.c_str(),
           lm->dir.c_str(), static_cast<long long>(lm->step), static_cast<long long>(scfg.context_tokens),
           template_origin.c_str());
  LOG_INFO("serve: max_batch %d, max_queue %d, weights %s, prefix cache %s, api key %s", ecfg.max_batch,
           ecfg.max_queue, WeightFormatName(ecfg.weights), ecfg.prefix_cache ? "on" : "off", scfg.api_key.empty() ? "off" : "required");
  {
    std::string tiers = "device";
    for (auto* t : ecfg.tiers) tiers += " -> " + t->name();
    LOG_INFO("serve: KV tiers: %s (model fingerprint %s)", tiers.c_str(), fp.hex().c_str());
  }
  std::fprintf(stderr, "myriad serve: listening on %s (POST /v1/chat/completions, /v1/completions; GET /v1/models, "
                       "/health, /metrics)\n", server.url().c_str());
  std::fflush(stderr);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "myriad serve: %s received: refusing new requests, finishing running ones "
                       "(a second signal exits at once)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::thread([stop_signals] {
    int again = 0;
    sigwait(&stop_signals, &again);
    std::fprintf(stderr, "myriad serve: second signal: exiting without draining\n");
    std::_Exit(130);
  }).detach();
  server.Shutdown();
  (*engine)->Shutdown();
  std::fprintf(stderr, "myriad serve: shutdown summary\n%s", server.Summary().c_str());
  std::fflush(stderr);
  return 0;
}

}  // namespace myriad::cli
