// Sampling tasks through an engine and scoring them: the held-out
// evaluation, teacher selection and the post-training loop share it
// (post_train.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "core/check.h"
#include "rl/post_train.h"
#include "rl/rollout.h"

namespace myriad::rl {

nlohmann::json HeldOutScores::ToJson() const {
  auto one = [](const DomainScore& d) {
    return nlohmann::json{{"problems", d.problems}, {"pass1", d.pass1}, {"passk", d.passk},
                          {"greedy", d.greedy}, {"reward", d.reward}};
  };
  nlohmann::json j = {{"all", one(all)}, {"seconds", seconds}};
  for (const auto& [name, d] : domains) j["domains"][name] = one(d);
  return j;
}

std::vector<int32_t> TaskSampler::PromptIds(const Task& t) const {
  std::vector<int32_t> ids = text->prompt_prefix;
  tok->EncodeTo(t.prompt, &ids);
  return ids;
}

std::vector<std::vector<int32_t>> TaskSampler::StopSeqs() const {
  std::vector<std::vector<int32_t>> s;
  for (int32_t id : text->stop_ids) s.push_back({id});
  if (std::vector<int32_t> nl = tok->Encode("\n"); !nl.empty()) s.push_back(nl);
  return s;
}

std::string TaskSampler::CompletionText(const std::vector<int32_t>& completion) const {
  std::string s = tok->Decode(completion);
  if (const size_t nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

std::vector<RewardResult> ScoreAll(const std::vector<const Task*>& tasks, const std::vector<std::string>& completions,
                                   const RewardOptions& options, int threads) {
  CHECK_MSG(tasks.size() == completions.size(), "ScoreAll: %zu tasks for %zu completions", tasks.size(),
            completions.size());
  // Equal (task, completion) pairs are scored once.
  std::map<std::pair<const Task*, std::string>, size_t> unique_of;
  std::vector<size_t> slot(tasks.size());
  std::vector<size_t> first;  // an index of each unique pair
  for (size_t i = 0; i < tasks.size(); ++i) {
    auto [it, fresh] = unique_of.emplace(std::make_pair(tasks[i], completions[i]), first.size());
    if (fresh) first.push_back(i);
    slot[i] = it->second;
  }
  std::vector<RewardResult> unique(first.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < first.size();)
      unique[k] = Score(tasks[first[k]]->reward, completions[first[k]], options);
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(first.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  std::vector<RewardResult> out(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) out[i] = unique[slot[i]];
  return out;
}

Result<HeldOutScores> EvaluateHeldOut(const TaskSampler& s, const std::vector<Task>& tasks, int samples,
                                      double temperature, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  HeldOutScores out;
  if (tasks.empty()) return out;
  std::vector<std::vector<int32_t>> prompts;
  for (const Task& t : tasks) prompts.push_back(s.PromptIds(t));
  serve::GenerationParams p;
  p.max_tokens = s.max_tokens;
  p.stop_token_seqs = s.StopSeqs();
  p.sampling = SamplingParams{static_cast<float>(temperature), 0, 1.f};
  ASSIGN_OR_RETURN(std::vector<Sample> sampled, Rollout(*s.engine, prompts, samples, p, seed));
  p.sampling = SamplingParams{0.f, 0, 1.f};
  ASSIGN_OR_RETURN(std::vector<Sample> greedy, Rollout(*s.engine, prompts, 1, p, seed));
  std::vector<const Task*> which;
  std::vector<std::string> texts;
  for (const Sample& x : sampled) which.push_back(&tasks[x.prompt_index]), texts.push_back(s.CompletionText(x.completion));
  for (const Sample& x : greedy) which.push_back(&tasks[x.prompt_index]), texts.push_back(s.CompletionText(x.completion));
  const std::vector<RewardResult> r = ScoreAll(which, texts, s.reward, s.reward_threads);
  const size_t ns = sampled.size();
  auto add = [](DomainScore* d, double pass1, double passk, double greedy_ok, double reward) {
    ++d->problems;
    d->pass1 += pass1, d->passk += passk, d->greedy += greedy_ok, d->reward += reward;
  };
  for (size_t i = 0; i < tasks.size(); ++i) {
    double ok = 0, rew = 0;
    for (int j = 0; j < samples; ++j) {
      const RewardResult& x = r[i * samples + j];
      ok += x.correct, rew += x.reward;
    }
    const double greedy_ok = r[ns + i].correct;
    add(&out.domains[tasks[i].domain], ok / samples, ok > 0, greedy_ok, rew / samples);
    add(&out.all, ok / samples, ok > 0, greedy_ok, rew / samples);
  }
  auto finish = [](DomainScore* d) {
    if (d->problems == 0) return;
    d->pass1 /= d->problems, d->passk /= d->problems, d->greedy /= d->problems, d->reward /= d->problems;
  };
  for (auto& [name, d] : out.domains) finish(&d);
  finish(&out.all);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace myriad::rl
