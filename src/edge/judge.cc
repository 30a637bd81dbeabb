#include "edge/judge.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>

#include "rl/post_train.h"
#include "rl/reward.h"
#include "rl/rollout.h"
#include "serve/engine.h"

namespace myriad::edge {

PiiFn PiiThrough(const Redactor* redactor) {
  if (!redactor) return nullptr;
  return [redactor](const std::string& prompt) { return !redactor->Detect(prompt).empty(); };
}

CollaborativeFn CollaborativeThrough(const Redactor* redactor) {
  if (!redactor) return nullptr;
  return [redactor](const std::string& prompt, const AskCloudFn& ask) -> Result<std::string> {
    Vault vault;
    const Redaction r = redactor->Redact(prompt, &vault);
    ASSIGN_OR_RETURN(std::string answer, ask(r.text));
    return Restore(answer, vault).text;
  };
}

std::string Verdict(double q_edge, double q_remote, bool pii, double margin) {
  if (q_edge >= q_remote - margin) return "edge";
  return pii ? "collaborative" : "cloud";
}

double RubricQuality(const std::vector<float>& lp) {
  if (lp.empty()) return 0;
  double s = 0;
  for (float x : lp) s += x;
  return std::exp(s / lp.size());
}

namespace {

Result<std::unique_ptr<serve::Engine>> MakeEngine(const Model* model, int batch) {
  serve::EngineConfig ec;
  ec.max_batch = std::max(1, batch);
  ec.max_queue = 1 << 20;  // every request is queued at once; the engine batches them
  ec.prefix_cache = false;
  return serve::Engine::Create(model, ec);
}

// Keeps the last `keep` of ids after the prefix (the prefix itself stays).
void KeepTail(std::vector<int32_t>* ids, size_t prefix, int64_t limit) {
  if (static_cast<int64_t>(ids->size()) <= limit) return;
  const int64_t drop = static_cast<int64_t>(ids->size()) - std::max<int64_t>(limit, prefix + 1);
  ids->erase(ids->begin() + prefix, ids->begin() + prefix + drop);
}

}  // namespace

Result<std::vector<std::string>> AnswerAll(const JudgeModel& m, const std::vector<std::string>& prompts,
                                           int max_tokens, int engine_batch) {
  ASSIGN_OR_RETURN(std::unique_ptr<serve::Engine> engine, MakeEngine(m.model, engine_batch));
  rl::TaskSampler s;
  s.engine = engine.get(), s.tok = m.tok, s.text = &m.text;
  const int64_t ctx = m.model->config().max_seq_len;
  const int mt = std::max<int>(1, std::min<int64_t>(max_tokens, ctx / 2));
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& p : prompts) {
    std::vector<int32_t> x = m.text.prompt_prefix;
    m.tok->EncodeTo(p, &x);
    KeepTail(&x, m.text.prompt_prefix.size(), ctx - mt);
    if (x.empty()) x.push_back(0);
    ids.push_back(std::move(x));
  }
  serve::GenerationParams gp;
  gp.max_tokens = mt;
  gp.stop_token_seqs = s.StopSeqs();
  gp.sampling = SamplingParams{0.f, 0, 1.f};
  Result<std::vector<rl::Sample>> r = rl::Rollout(*engine, ids, 1, gp, 1);
  engine->Shutdown();
  if (!r.ok()) return r.status();
  std::vector<std::string> out(prompts.size());
  for (const rl::Sample& x : r.value()) out[x.prompt_index] = s.CompletionText(x.completion);
  return out;
}

Result<std::vector<double>> RubricScores(const JudgeModel& judge, const std::vector<std::string>& prompts,
                                         const std::vector<std::string>& answers, int engine_batch) {
  ASSIGN_OR_RETURN(std::unique_ptr<serve::Engine> engine, MakeEngine(judge.model, engine_batch));
  const int64_t ctx = judge.model->config().max_seq_len;
  const std::vector<int32_t> head = judge.tok->Encode("Question: ");
  const std::vector<int32_t> mid = judge.tok->Encode("\nAnswer:");
  std::vector<double> out(prompts.size(), 0.0);
  std::mutex mu;
  std::condition_variable cv;
  size_t pending = 0;
  std::string error;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ans = judge.tok->Encode(" " + answers[i]);
    if (answers[i].empty() || ans.empty()) continue;  // quality 0
    if (static_cast<int64_t>(ans.size()) > ctx / 2) ans.resize(ctx / 2);
    std::vector<int32_t> q = judge.tok->Encode(prompts[i]);
    const int64_t room = ctx - static_cast<int64_t>(judge.text.prompt_prefix.size() + head.size() + mid.size() +
                                                    ans.size()) - 1;
    if (room < static_cast<int64_t>(q.size())) q.erase(q.begin(), q.begin() + (q.size() - std::max<int64_t>(0, room)));
    std::vector<int32_t> ids = judge.text.prompt_prefix;
    ids.insert(ids.end(), head.begin(), head.end());
    ids.insert(ids.end(), q.begin(), q.end());
    ids.insert(ids.end(), mid.begin(), mid.end());
    const size_t answer_at = ids.size();
    ids.insert(ids.end(), ans.begin(), ans.end());
    serve::GenerationParams gp;
    gp.max_tokens = 0;
    gp.prompt_logprobs = 0;
    {
      std::lock_guard<std::mutex> l(mu);
      ++pending;
    }
    const size_t total = ids.size();
    Result<uint64_t> id = engine->Submit(ids, gp, [&, i, answer_at, total](const serve::TokenEvent& ev) {
      if (!ev.done) return;
      std::vector<float> lp;
      // prompt_logprobs[j - 1] scores prompt token j (given the ones before it).
      for (size_t j = answer_at; j < total; ++j)
        if (j - 1 < ev.prompt_logprobs.size()) lp.push_back(ev.prompt_logprobs[j - 1].logprob);
      std::lock_guard<std::mutex> l(mu);
      if (ev.finish_reason == "error" && error.empty()) error = ev.error;
      out[i] = RubricQuality(lp);
      --pending;
      cv.notify_all();
    });
    if (!id.ok()) {
      std::unique_lock<std::mutex> l(mu);
      --pending;
      cv.wait(l, [&] { return pending == 0; });
      l.unlock();
      engine->Shutdown();
      return id.status().With("judge rubric");
    }
  }
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return pending == 0; });
  }
  engine->Shutdown();
  if (!error.empty()) return Status::Error("judge rubric: " + error);
  return out;
}

Result<std::vector<double>> ScoreAnswers(const JudgeModel& judge, const std::vector<RoutePrompt>& prompts,
                                         const std::vector<std::string>& answers, int engine_batch,
                                         int reward_threads) {
  if (answers.size() != prompts.size())
    return Status::Error("ScoreAnswers: " + std::to_string(answers.size()) + " answers for " +
                         std::to_string(prompts.size()) + " prompts");
  std::vector<double> q(prompts.size(), 0.0);
  std::vector<rl::Task> tasks(prompts.size());
  std::vector<const rl::Task*> which;
  std::vector<std::string> comps;
  std::vector<size_t> verified, rubric;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!prompts[i].verifier) {
      rubric.push_back(i);
      continue;
    }
    tasks[i].reward = *prompts[i].verifier;
    which.push_back(&tasks[i]);
    comps.push_back(answers[i]);
    verified.push_back(i);
  }
  const std::vector<rl::RewardResult> rr = rl::ScoreAll(which, comps, {}, reward_threads);
  for (size_t k = 0; k < verified.size(); ++k) q[verified[k]] = std::clamp(rr[k].reward, 0.0, 1.0);
  std::vector<std::string> rp, ra;
  for (size_t i : rubric) rp.push_back(prompts[i].prompt), ra.push_back(answers[i]);
  if (!rubric.empty()) {
    ASSIGN_OR_RETURN(std::vector<double> rs, RubricScores(judge, rp, ra, engine_batch));
    for (size_t k = 0; k < rubric.size(); ++k) q[rubric[k]] = rs[k];
  }
  return q;
}

Result<std::vector<RouteRecord>> JudgePrompts(const JudgeModel& edge, const JudgeModel& cloud,
                                              const std::vector<RoutePrompt>& prompts, const JudgeOptions& opt,
                                              const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  std::vector<std::string> texts;
  for (const RoutePrompt& p : prompts) texts.push_back(p.prompt);
  ASSIGN_OR_RETURN(std::vector<std::string> edge_ans, AnswerAll(edge, texts, opt.max_tokens, opt.engine_batch));
  say("edge answered " + std::to_string(texts.size()) + " prompts");
  ASSIGN_OR_RETURN(std::vector<std::string> cloud_ans, AnswerAll(cloud, texts, opt.max_tokens, opt.engine_batch));
  say("cloud answered " + std::to_string(texts.size()) + " prompts");
  // Collaborative answers where the detector finds private values.
  std::vector<bool> pii(prompts.size(), false);
  std::vector<std::string> remote = cloud_ans;
  int n_pii = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    pii[i] = opt.pii ? opt.pii(texts[i]) : false;
    if (!pii[i]) continue;
    ++n_pii;
    if (!opt.collaborative) continue;
    AskCloudFn ask = [&](const std::string& p) -> Result<std::string> {
      ASSIGN_OR_RETURN(std::vector<std::string> a, AnswerAll(cloud, {p}, opt.max_tokens, 1));
      return a[0];
    };
    Result<std::string> c = opt.collaborative(texts[i], ask);
    if (!c.ok()) return c.status().With(prompts[i].id + ": collaborative answer");
    remote[i] = c.value();
  }
  say(std::to_string(n_pii) + " prompts with private values (collaborative)");
  // Qualities: both placements in one call (the rubric batches them).
  std::vector<RoutePrompt> twice(prompts);
  twice.insert(twice.end(), prompts.begin(), prompts.end());
  std::vector<std::string> answers(edge_ans);
  answers.insert(answers.end(), remote.begin(), remote.end());
  ASSIGN_OR_RETURN(std::vector<double> q, ScoreAnswers(cloud, twice, answers, opt.engine_batch, opt.reward_threads));
  std::vector<double> qe(q.begin(), q.begin() + prompts.size()), qr(q.begin() + prompts.size(), q.end());
  say("judged " + std::to_string(answers.size()) + " answers");
  // The device's features.
  FeatureExtractor fx(*edge.model, *edge.tok, opt.features);
  const ModelConfig& ec = edge.model->config();
  const nlohmann::json edge_model = {{"vocab_size", ec.vocab_size}, {"d_model", ec.d_model},
                                     {"n_layers", ec.n_layers}, {"path", opt.edge_path},
                                     {"max_prompt_tokens", opt.features.max_prompt_tokens},
                                     {"probe_tokens", opt.features.probe_tokens}};
  std::vector<RouteRecord> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RouteRecord r;
    r.prompt = prompts[i];
    r.edge_answer = edge_ans[i], r.remote_answer = remote[i];
    r.q_edge = qe[i], r.q_remote = qr[i];
    r.judged_by = prompts[i].verifier ? "verifier" : "rubric";
    r.pii = pii[i];
    r.verdict = Verdict(qe[i], qr[i], pii[i], opt.margin);
    r.features = fx.Extract(texts[i], pii[i]);
    r.edge_model = edge_model;
    out.push_back(std::move(r));
  }
  say("features of " + std::to_string(out.size()) + " prompts");
  return out;
}

}  // namespace myriad::edge
