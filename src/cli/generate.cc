// myriad generate (--ckpt DIR | --hf HF_DIR) --prompt TEXT: streams a continuation to stdout.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "cli/ckpt_util.h"
#include "cli/verbs.h"
#include "data/text_conventions.h"
#include "data/tokenizer.h"
#include "model/inference.h"
#include "model/sampler.h"
#include "model/speculative.h"

namespace myriad::cli {

int RunGenerate(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt with a KV cache, streaming to stdout", "myriad generate"};
  std::string ckpt, hf, prompt, tokenizer_path, weights = "fp32";
  int max_tokens = 200;
  uint64_t seed = 1;
  SamplingParams sp;
  bool stats = false;
  std::string speculative = "off";
  int draft_tokens = 4;
  app.add_option("--ckpt", ckpt, "run directory or step directory (ours, or written by `myriad import`)");
  app.add_option("--hf", hf, "a Hugging Face model folder (config.json, safetensors, tokenizer)");
  app.add_option("--prompt,-p", prompt, "the prompt text")->required();
  app.add_option("--max-tokens,-n", max_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  app.add_option("--temperature,-t", sp.temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", sp.top_k, "keep the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", sp.top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", seed, "sampling seed");
  app.add_option("--weights", weights, "decode weight format: fp32, fp16 or int8");
  app.add_option("--tokenizer", tokenizer_path, "tokenizer model (default: the run's)");
  app.add_flag("--stats", stats, "print tokens/s to stderr at the end");
  app.add_option("--speculative", speculative,
                 "mtp: the model's MTP modules draft; ngram: drafts from the context's own n-gram matches "
                 "(prompt lookup); auto: n-gram where the context repeats, MTP elsewhere; off. Drafts are "
                 "verified in one forward: the output's distribution is the same either way, greedy output identical")
      ->check(CLI::IsMember({"off", "ngram", "mtp", "auto"}));
  app.add_option("--draft-tokens", draft_tokens, "tokens per draft")->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);

  WeightFormat fmt;
  if (!ParseWeightFormat(weights, &fmt)) {
    std::fprintf(stderr, "myriad generate: --weights %s is not known (hint: fp32, fp16 or int8)\n", weights.c_str());
    return 2;
  }
  auto lm = LoadModelFor(ckpt, hf);
  if (!lm.ok()) {
    std::fprintf(stderr, "myriad generate: %s\n", lm.status().message().c_str());
    return 1;
  }
  if (tokenizer_path.empty()) tokenizer_path = lm->tokenizer_path;
  auto tok = Tokenizer::Load(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "myriad generate: %s\n", tok.status().message().c_str());
    return 1;
  }
  const TextConventions text = TextConventions::For(*tok, lm->eos_token_ids);
  std::vector<int32_t> ids = text.prompt_prefix;
  tok->EncodeTo(prompt, &ids);
  const Model& model = *lm->model;
  const int64_t max_len = model.config().max_seq_len;
  if (static_cast<int64_t>(ids.size()) >= max_len) {
    std::fprintf(stderr, "myriad generate: the prompt is %zu tokens, the model's context is %lld (hint: shorten it)\n",
                 ids.size(), static_cast<long long>(max_len));
    return 1;
  }
  DraftMode mode = DraftMode::kOff;
  ParseDraftMode(speculative, &mode);
  if (mode == DraftMode::kMtp && !SpeculativeDecoder::HasMtp(model.config())) {
    std::fprintf(stderr,
                 "myriad generate: --speculative mtp needs a model with MTP modules; this one has %s (hint: "
                 "--speculative ngram, or train with model.mtp_depth >= 1)\n",
                 model.config().dsa() ? "DSA attention, which MTP drafts do not support" : "model.mtp_depth = 0");
    return 2;
  }
  InferenceSession session(model, max_len, fmt);
  std::unique_ptr<SpeculativeDecoder> spec_dec;
  if (mode != DraftMode::kOff) spec_dec = std::make_unique<SpeculativeDecoder>(&session, mode, draft_tokens);
  Rng rng(seed);
  TokenStreamDecoder dec(&*tok);
  std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  auto t0 = std::chrono::steady_clock::now();
  const float* logits = spec_dec ? spec_dec->Prefill(ids) : session.Forward(ids.data(), static_cast<int64_t>(ids.size()));
  auto t1 = std::chrono::steady_clock::now();
  int produced = 0;
  if (mode == DraftMode::kOff) {
    for (; produced < max_tokens && session.len() < max_len; ++produced) {
      int32_t next = SampleToken(logits, model.config().vocab_size, sp, &rng);
      if (text.IsStop(next)) break;
      std::string piece = dec.Push(next);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      if (session.len() >= max_len) break;
      logits = session.Forward(&next, 1);
    }
  } else {
    // The pending token is chosen, emitted, and fed by the next verification.
    std::vector<int32_t> context = ids;
    std::vector<int32_t> emit = {SampleToken(logits, model.config().vocab_size, sp, &rng)};
    bool done = false;
    while (!done) {
      for (int32_t t : emit) {
        if (produced >= max_tokens || text.IsStop(t)) {
          done = true;
          break;
        }
        std::string piece = dec.Push(t);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        context.push_back(t);
        ++produced;
      }
      std::fflush(stdout);
      // Room for the pending token (plain decoding stops there too).
      if (done || produced >= max_tokens || session.len() + 1 >= max_len) break;
      emit = spec_dec->Step(context, max_tokens - produced, sp, &rng);
    }
  }
  std::string rest = dec.Finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  auto t2 = std::chrono::steady_clock::now();
  if (stats) {
    double pre = std::chrono::duration<double>(t1 - t0).count();
    double gen = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "[prompt %zu tokens in %.3fs; generated %d tokens at %.1f tok/s, weights %s", ids.size(),
                 pre, produced, produced / std::max(gen, 1e-9), WeightFormatName(fmt));
    if (spec_dec) {
      const SpeculativeStats& spec = spec_dec->stats();
      std::fprintf(stderr, "; speculative %s: %lld verifications, mean accepted length %.2f, acceptance", speculative.c_str(),
                   static_cast<long long>(spec.steps), spec.MeanAcceptedLength());
      for (size_t i = 0; i < spec.proposed.size(); ++i)
        std::fprintf(stderr, " %s%.2f", i ? "" : "by position ", spec.proposed[i] ? double(spec.accepted[i]) / spec.proposed[i] : 0.0);
      if (mode == DraftMode::kAuto)
        std::fprintf(stderr, "; drafts: %lld n-gram, %lld MTP", static_cast<long long>(spec_dec->ngram_steps()),
                     static_cast<long long>(spec_dec->mtp_steps()));
    }
    std::fprintf(stderr, "]\n");
  }
  return 0;
}

}  // namespace myriad::cli
