// Myriad's side of bench/speculative.py: batch-1 greedy decode tokens/s with
// speculative decoding (n-gram, MTP, auto drafts) against plain decoding
// (off), on a trained checkpoint and held-out prompts, through the loop
// `myriad generate` runs (InferenceSession + SpeculativeDecoder: Prefill,
// then Step). Prints one JSON line per (prompt kind, draft length, mode).
//
//   bench_speculative [--ckpt runs/demo-moe] [--data data/default] [--prompt-len 48] [--tokens 128]
//                     [--prompts 4] [--rounds 3] [--draft-tokens 1,2,3,4] [--modes off,ngram,mtp,auto]
//                     [--kinds text,code,edit] [--edit-context 100] [--edit-restart 20] [--weights fp32]
//
// Prompts come from the validation shard (val_000.bin; documents the model
// never trained on): "text" is the first P tokens of fortunes-en documents,
// "code" the first P tokens of python-stdlib documents, and "edit" a
// python-stdlib document's first --edit-context tokens followed by its first
// --edit-restart tokens again (rewriting it), so the continuation repeats
// earlier context. Each prompt is continued for exactly --tokens tokens
// (eos is not a stop: every mode does the same work), greedily, so every
// mode's output must be identical to off's (checked; "identical" below).
// Within a round the modes alternate (off ngram mtp auto off ...); a mode's
// tokens/s in a round is all its prompts' tokens over their decode time
// (prefill excluded, as in `myriad generate --stats`).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "data/shards.h"
#include "model/inference.h"
#include "model/sampler.h"
#include "model/speculative.h"
#include "ops/ops.h"
#include "train/checkpoint/checkpoint.h"
#include "train/trainer.h"

using namespace myriad;

namespace {

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// One mode's pass over a kind's prompts: the tokens, the decode seconds and
// the drafters' counters.
struct Pass {
  double seconds = 0;
  int64_t tokens = 0;
  SpeculativeStats stats;
  int64_t ngram_steps = 0, mtp_steps = 0;
  std::vector<std::vector<int32_t>> outputs;
};

void AddStats(const SpeculativeStats& s, SpeculativeStats* into) {
  into->steps += s.steps;
  into->emitted += s.emitted;
  if (into->proposed.size() < s.proposed.size()) {
    into->proposed.resize(s.proposed.size(), 0);
    into->accepted.resize(s.proposed.size(), 0);
  }
  for (size_t i = 0; i < s.proposed.size(); ++i) into->proposed[i] += s.proposed[i], into->accepted[i] += s.accepted[i];
}

Pass Decode(const Model& model, WeightFormat fmt, const std::vector<std::vector<int32_t>>& prompts, int n,
            DraftMode mode, int k) {
  Pass pass;
  const int64_t V = model.config().vocab_size;
  SamplingParams greedy;
  greedy.temperature = 0;
  for (const auto& prompt : prompts) {
    // A fresh session per prompt, as `myriad generate` has.
    InferenceSession owned(model, model.config().max_seq_len, fmt);
    InferenceSession* session = &owned;
    Rng rng(1);
    std::vector<int32_t> out;
    out.reserve(n);
    if (mode == DraftMode::kOff) {
      const float* logits = session->Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        int32_t next = SampleToken(logits, V, greedy, &rng);
        out.push_back(next);
        if (i + 1 < n) logits = session->Forward(&next, 1);
      }
      pass.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      SpeculativeDecoder dec(session, mode, k);
      const float* logits = dec.Prefill(prompt);
      auto t0 = std::chrono::steady_clock::now();
      std::vector<int32_t> context = prompt;
      std::vector<int32_t> emit = {SampleToken(logits, V, greedy, &rng)};
      while (true) {
        for (int32_t t : emit) out.push_back(t), context.push_back(t);
        if (static_cast<int>(out.size()) >= n) break;
        emit = dec.Step(context, n - static_cast<int>(out.size()), greedy, &rng);
      }
      pass.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out.resize(n);
      AddStats(dec.stats(), &pass.stats);
      pass.ngram_steps += dec.ngram_steps();
      pass.mtp_steps += dec.mtp_steps();
    }
    pass.tokens += n;
    pass.outputs.push_back(std::move(out));
  }
  return pass;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> o = {
      {"--ckpt", "runs/demo-moe"}, {"--data", "data/default"}, {"--prompt-len", "48"}, {"--tokens", "128"},
      {"--prompts", "4"},          {"--rounds", "3"},          {"--draft-tokens", "1,2,3,4"},
      {"--modes", "off,ngram,mtp,auto"}, {"--kinds", "text,code,edit"}, {"--edit-context", "100"},
      {"--edit-restart", "20"},    {"--weights", "fp32"}};
  for (int i = 1; i < argc; i += 2) {
    if (!o.count(argv[i]) || i + 1 >= argc) {
      std::fprintf(stderr, "bench_speculative: %s %s\n", argv[i], o.count(argv[i]) ? "needs a value" : "is not a flag");
      return 2;
    }
    o[argv[i]] = argv[i + 1];
  }
  const int P = std::stoi(o["--prompt-len"]), N = std::stoi(o["--tokens"]), n_prompts = std::stoi(o["--prompts"]);
  const int rounds = std::stoi(o["--rounds"]), edit_ctx = std::stoi(o["--edit-context"]),
            edit_restart = std::stoi(o["--edit-restart"]);
  WeightFormat fmt;
  if (!ParseWeightFormat(o["--weights"], &fmt)) {
    std::fprintf(stderr, "bench_speculative: unknown --weights %s (fp32, fp16 or int8)\n", o["--weights"].c_str());
    return 2;
  }
  std::vector<DraftMode> modes;
  for (const auto& m : Split(o["--modes"])) {
    DraftMode d;
    if (!ParseDraftMode(m, &d)) {
      std::fprintf(stderr, "bench_speculative: unknown mode %s (off, ngram, mtp, auto)\n", m.c_str());
      return 2;
    }
    if (d != DraftMode::kOff) modes.push_back(d);
  }
  modes.insert(modes.begin(), DraftMode::kOff);  // the baseline, always, first in each round
  std::vector<int> ks;
  for (const auto& k : Split(o["--draft-tokens"])) ks.push_back(std::stoi(k));

  // The model, as the CLI loads a Myriad checkpoint (cli::LoadModelFromCheckpoint).
  auto ck = LoadCheckpoint(Env::Default(), o["--ckpt"]);
  if (!ck.ok()) {
    std::fprintf(stderr, "bench_speculative: %s (hint: `make demo` trains runs/demo-moe)\n", ck.status().message().c_str());
    return 1;
  }
  if (!ck->manifest.contains("model_config")) {
    std::fprintf(stderr, "bench_speculative: %s has no model_config\n", ck->dir.c_str());
    return 1;
  }
  auto mc = ModelConfig::FromJson(ck->manifest["model_config"]);
  if (!mc.ok()) {
    std::fprintf(stderr, "bench_speculative: %s\n", mc.status().message().c_str());
    return 1;
  }
  Model model(*mc);
  if (Status s = RestoreModel(*ck, &model); !s.ok()) {
    std::fprintf(stderr, "bench_speculative: %s\n", s.message().c_str());
    return 1;
  }
  const bool has_mtp = SpeculativeDecoder::HasMtp(model.config());
  if (!has_mtp) {
    std::vector<DraftMode> keep;
    for (DraftMode m : modes)
      if (m == DraftMode::kOff || m == DraftMode::kNgram) keep.push_back(m);
    if (keep.size() != modes.size()) std::fprintf(stderr, "bench_speculative: no MTP modules: mtp and auto skipped\n");
    modes = keep;
  }

  // Held-out documents by source. prepare writes the val shard in corpus
  // order, and the default corpus lists its sources as fortunes-en,
  // fortunes-zh, python-stdlib (LoadDefaultCorpus); data.json gives each
  // source's val document count.
  const std::string data = o["--data"];
  std::ifstream jf(data + "/data.json");
  if (!jf) {
    std::fprintf(stderr, "bench_speculative: cannot read %s/data.json (hint: `make demo` prepares data/default)\n",
                 data.c_str());
    return 1;
  }
  nlohmann::json dj = nlohmann::json::parse(jf);
  const std::vector<std::string> order = {"fortunes-en", "fortunes-zh", "python-stdlib"};
  std::map<std::string, std::pair<uint64_t, uint64_t>> docs_of;  // source -> [first, end)
  uint64_t at = 0;
  for (const auto& src : order) {
    if (!dj["sources"].contains(src)) {
      std::fprintf(stderr, "bench_speculative: %s/data.json has no source %s (the default corpus is needed)\n",
                   data.c_str(), src.c_str());
      return 1;
    }
    const uint64_t n = dj["sources"][src]["val"]["documents"].get<uint64_t>();
    docs_of[src] = {at, at + n};
    at += n;
  }
  auto shard = ShardReader::Open(data + "/val_000.bin");
  if (!shard.ok()) {
    std::fprintf(stderr, "bench_speculative: %s\n", shard.status().message().c_str());
    return 1;
  }
  if (shard->num_documents() != at || dj["sources"].size() != order.size()) {
    std::fprintf(stderr, "bench_speculative: val_000.bin has %llu documents, data.json's sources %llu\n",
                 static_cast<unsigned long long>(shard->num_documents()), static_cast<unsigned long long>(at));
    return 1;
  }
  const int64_t eos = dj.value("eos_id", -1);
  // Documents of `src` with at least `len` tokens (without the eos).
  auto documents = [&](const std::string& src, int len) {
    std::vector<std::vector<int32_t>> out;
    for (uint64_t d = docs_of[src].first; d < docs_of[src].second && static_cast<int>(out.size()) < n_prompts; ++d) {
      std::vector<int32_t> doc = shard->ReadDocument(d);
      if (!doc.empty() && doc.back() == eos) doc.pop_back();
      if (static_cast<int>(doc.size()) >= len) out.push_back(std::move(doc));
    }
    return out;
  };
  std::map<std::string, std::vector<std::vector<int32_t>>> prompts;
  for (const auto& kind : Split(o["--kinds"])) {
    std::vector<std::vector<int32_t>> ps;
    if (kind == "text" || kind == "code") {
      for (auto& d : documents(kind == "text" ? "fortunes-en" : "python-stdlib", P))
        ps.emplace_back(d.begin(), d.begin() + P);
    } else if (kind == "edit") {
      for (auto& d : documents("python-stdlib", edit_ctx)) {
        std::vector<int32_t> p(d.begin(), d.begin() + edit_ctx);
        p.insert(p.end(), d.begin(), d.begin() + edit_restart);
        ps.push_back(std::move(p));
      }
    } else {
      std::fprintf(stderr, "bench_speculative: unknown kind %s (text, code, edit)\n", kind.c_str());
      return 2;
    }
    if (ps.empty()) {
      std::fprintf(stderr, "bench_speculative: no %s prompts long enough\n", kind.c_str());
      return 1;
    }
    prompts[kind] = std::move(ps);
  }
  const int64_t max_len = model.config().max_seq_len;
  int64_t longest = 0;
  for (auto& [kind, ps] : prompts)
    for (auto& p : ps) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  const int kmax = *std::max_element(ks.begin(), ks.end());
  if (longest + N + kmax + 1 > max_len) {
    std::fprintf(stderr, "bench_speculative: prompt %lld + %d tokens + draft %d exceeds the model's context %lld\n",
                 static_cast<long long>(longest), N, kmax, static_cast<long long>(max_len));
    return 2;
  }
  for (const auto& kind : Split(o["--kinds"])) {
    const auto& ps = prompts[kind];
    Decode(model, fmt, ps, std::min(N, 16), DraftMode::kOff, 1);  // warm-up
    for (int k : ks) {
      std::map<DraftMode, std::vector<Pass>> res;
      for (int r = 0; r < rounds; ++r)
        for (DraftMode m : modes) res[m].push_back(Decode(model, fmt, ps, N, m, k));
      const std::vector<std::vector<int32_t>>& want = res[DraftMode::kOff][0].outputs;
      std::vector<double> off_tps;
      for (const Pass& p : res[DraftMode::kOff]) off_tps.push_back(p.tokens / p.seconds);
      const double off_med = Median(off_tps);
      for (DraftMode m : modes) {
        std::vector<double> tps, ratios;
        SpeculativeStats st;
        int64_t ng = 0, mt = 0;
        bool identical = true;
        for (int r = 0; r < rounds; ++r) {
          const Pass& p = res[m][r];
          tps.push_back(p.tokens / p.seconds);
          ratios.push_back(tps.back() / off_tps[r]);
          AddStats(p.stats, &st);
          ng += p.ngram_steps, mt += p.mtp_steps;
          identical = identical && p.outputs == want;
        }
        std::vector<double> acc;
        for (size_t i = 0; i < st.proposed.size(); ++i)
          acc.push_back(st.proposed[i] ? static_cast<double>(st.accepted[i]) / st.proposed[i] : 0.0);
        const double med = Median(tps);
        nlohmann::json line = {
            {"bench", "speculative"},
            {"config",
             {{"kind", kind}, {"mode", DraftModeName(m)}, {"draft_tokens", m == DraftMode::kOff ? 0 : k},
              {"prompts", ps.size()}, {"prompt_len", ps[0].size()}, {"tokens", N}, {"rounds", rounds},
              {"weights", WeightFormatName(fmt)}, {"ckpt", ck->dir}, {"step", ck->step},
              {"threads", ops::Active()->num_threads()}, {"backend", ops::Active()->name()}}},
            {"tokens_per_s", med},
            {"tokens_per_s_min", *std::min_element(tps.begin(), tps.end())},
            {"tokens_per_s_max", *std::max_element(tps.begin(), tps.end())},
            {"tokens_per_s_rounds", tps},
            {"off_tokens_per_s", off_med},
            {"ratio", med / off_med},
            {"ratio_rounds", ratios},
            {"acceptance_by_position", acc},
            {"acceptance", st.AcceptanceRate()},
            {"mean_accepted_length", st.MeanAcceptedLength()},
            {"verifications", st.steps},
            {"ngram_steps", ng},
            {"mtp_steps", mt},
            {"identical", identical}};
        std::printf("%s\n", line.dump().c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
