// [rl] and [distill] of a post-training config (post_train.h).
#include <sstream>

#include "rl/post_train.h"

namespace myriad::rl {

namespace {

std::vector<std::string> SplitList(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) {
    const size_t a = cur.find_first_not_of(" \t"), b = cur.find_last_not_of(" \t");
    if (a != std::string::npos) out.push_back(cur.substr(a, b - a + 1));
  }
  return out;
}

const char* LossNormName(LossNorm n) { return n == LossNorm::kToken ? "token" : "sequence"; }
const char* DistillLossName(DistillLoss l) {
  return l == DistillLoss::kReverseKl ? "reverse_kl" : l == DistillLoss::kForwardKl ? "forward_kl" : "jsd";
}

}  // namespace

const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kGrpo: return "grpo";
    case Algorithm::kSft: return "sft";
    case Algorithm::kDistill: return "distill";
  }
  return "?";
}

PostTrainConfig PostTrainConfig::Read(ConfigDoc* doc, Algorithm default_algorithm) {
  PostTrainConfig c;
  const std::string algo = doc->GetString("rl.algorithm", AlgorithmName(default_algorithm));
  if (algo == "grpo") c.algorithm = Algorithm::kGrpo;
  else if (algo == "sft") c.algorithm = Algorithm::kSft;
  else if (algo == "distill") c.algorithm = Algorithm::kDistill;
  else doc->Fail("rl.algorithm: unknown algorithm '" + algo + "' (expected grpo, sft or distill)");
  c.domains = SplitList(doc->GetString("rl.domains", "arithmetic"), ',');
  c.tasks_file = doc->GetString("rl.tasks_file", "");
  if (c.domains.empty() && c.tasks_file.empty()) doc->Fail("rl.domains: empty (and no rl.tasks_file)");
  c.difficulty = static_cast<int>(doc->GetInt("rl.difficulty", c.difficulty, 1, 5));
  c.train_tasks = static_cast<int>(doc->GetInt("rl.train_tasks", c.train_tasks, 1, 1 << 24));
  c.eval_tasks = static_cast<int>(doc->GetInt("rl.eval_tasks", c.eval_tasks, 0, 1 << 20));
  c.prompts_per_step = static_cast<int>(doc->GetInt("rl.prompts_per_step", c.prompts_per_step, 1, 1 << 16));
  c.group_size = static_cast<int>(doc->GetInt("rl.group_size", c.group_size, 1, 1024));
  c.max_tokens = static_cast<int>(doc->GetInt("rl.max_tokens", c.max_tokens, 1, 1 << 20));
  c.temperature = doc->GetFloat("rl.temperature", c.temperature);
  if (!(c.temperature > 0 && c.temperature <= 10))
    doc->Fail("rl.temperature: " + std::to_string(c.temperature) + " is outside (0, 10] (the policy samples)");
  c.top_k = static_cast<int>(doc->GetInt("rl.top_k", c.top_k, 0, 1 << 20));
  c.top_p = doc->GetFloat("rl.top_p", c.top_p);
  if (!(c.top_p > 0 && c.top_p <= 1)) doc->Fail("rl.top_p: " + std::to_string(c.top_p) + " is outside (0, 1]");
  c.engine_max_batch = static_cast<int>(doc->GetInt("rl.engine_max_batch", c.engine_max_batch, 1, 4096));
  c.inner_steps = static_cast<int>(doc->GetInt("rl.inner_steps", c.inner_steps, 1, 64));
  if (const std::string n = doc->GetString("rl.loss_norm", "token"); !ParseLossNorm(n, &c.loss_norm))
    doc->Fail("rl.loss_norm: unknown normalisation '" + n + "' (expected token or sequence)");
  c.policy.clip_low = doc->GetFloat("rl.clip_low", c.policy.clip_low);
  c.policy.clip_high = doc->GetFloat("rl.clip_high", c.policy.clip_high);
  c.policy.kl_beta = doc->GetFloat("rl.kl_beta", c.policy.kl_beta);
  if (!(c.policy.clip_low >= 0 && c.policy.clip_low < 1)) doc->Fail("rl.clip_low: must be in [0, 1)");
  if (!(c.policy.clip_high >= 0)) doc->Fail("rl.clip_high: must be >= 0");
  if (!(c.policy.kl_beta >= 0)) doc->Fail("rl.kl_beta: must be >= 0");
  c.scale_by_std = doc->GetBool("rl.scale_by_std", c.scale_by_std);
  c.reward.max_chars = static_cast<int>(doc->GetInt("rl.max_chars", 0, 0, 1 << 20));
  c.reward.length_penalty = doc->GetFloat("rl.length_penalty", 0.0);
  c.reward.format_penalty = doc->GetFloat("rl.format_penalty", 0.0);
  c.reward_threads = static_cast<int>(doc->GetInt("rl.reward_threads", c.reward_threads, 1, 256));
  c.eval_every = static_cast<int>(doc->GetInt("rl.eval_every", c.eval_every, 0, 1 << 20));
  c.eval_samples = static_cast<int>(doc->GetInt("rl.eval_samples", c.eval_samples, 1, 256));
  c.sft_source = doc->GetString("rl.sft_source", c.sft_source);
  if (c.sft_source != "reference" && c.sft_source != "teacher")
    doc->Fail("rl.sft_source: unknown source '" + c.sft_source + "' (expected reference or teacher)");
  // [distill]: teachers = "domain=path, domain=path" ("*=path" or a bare path: any domain).
  for (const std::string& item : SplitList(doc->GetString("distill.teachers", ""), ',')) {
    TeacherConfig t;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      t.path = item;
    } else {
      t.domain = item.substr(0, eq);
      t.path = item.substr(eq + 1);
      if (t.domain == "*") t.domain.clear();
    }
    if (t.path.empty()) doc->Fail("distill.teachers: '" + item + "' names no path (expected domain=path)");
    c.teachers.push_back(t);
  }
  c.teacher_select = doc->GetString("distill.select", c.teacher_select);
  if (c.teacher_select != "domain" && c.teacher_select != "measured")
    doc->Fail("distill.select: unknown rule '" + c.teacher_select + "' (expected domain or measured)");
  if (const std::string l = doc->GetString("distill.loss", "reverse_kl"); !ParseDistillLoss(l, &c.distill_loss))
    doc->Fail("distill.loss: unknown loss '" + l + "' (expected reverse_kl, forward_kl or jsd)");
  c.reward_weight = doc->GetFloat("distill.reward_weight", c.reward_weight);
  if (!(c.reward_weight >= 0)) doc->Fail("distill.reward_weight: must be >= 0");
  // Remote teachers (http:// URLs of `myriad serve`) give top-k logprobs.
  c.teacher_top_k = static_cast<int>(doc->GetInt("distill.top_k", c.teacher_top_k, 0, 5));
  c.remote.timeout_s = doc->GetFloat("distill.timeout_s", c.remote.timeout_s);
  if (!(c.remote.timeout_s > 0)) doc->Fail("distill.timeout_s: must be > 0");
  c.remote.concurrency = static_cast<int>(doc->GetInt("distill.concurrency", c.remote.concurrency, 1, 256));
  c.api_key_env = doc->GetString("distill.api_key_env", "");
  for (const TeacherConfig& t : c.teachers) {
    if (!t.remote()) continue;
    if (c.teacher_select == "measured")
      doc->Fail("distill.select = \"measured\" samples every teacher in-process; " + t.path +
                " is remote (hint: distill.select = \"domain\" with domain=URL)");
    if (c.algorithm == Algorithm::kSft)
      doc->Fail("rl.sft_source = \"teacher\" samples the teacher in-process; " + t.path + " is remote");
  }
  const bool needs_teachers =
      c.algorithm == Algorithm::kDistill || (c.algorithm == Algorithm::kSft && c.sft_source == "teacher");
  if (needs_teachers && c.teachers.empty())
    doc->Fail(std::string("distill.teachers: ") +
              (c.algorithm == Algorithm::kDistill ? "distillation" : "rl.sft_source = \"teacher\"") +
              " needs at least one teacher (\"domain=path, ...\")");
  return c;
}

nlohmann::json PostTrainConfig::ToJson() const {
  nlohmann::json tj = nlohmann::json::array();
  for (const auto& t : teachers) tj.push_back({{"path", t.path}, {"domain", t.domain}});
  return {{"algorithm", AlgorithmName(algorithm)},
          {"domains", domains},
          {"tasks_file", tasks_file},
          {"difficulty", difficulty},
          {"train_tasks", train_tasks},
          {"eval_tasks", eval_tasks},
          {"prompts_per_step", prompts_per_step},
          {"group_size", group_size},
          {"max_tokens", max_tokens},
          {"temperature", temperature},
          {"top_k", top_k},
          {"top_p", top_p},
          {"engine_max_batch", engine_max_batch},
          {"inner_steps", inner_steps},
          {"loss_norm", LossNormName(loss_norm)},
          {"clip_low", policy.clip_low},
          {"clip_high", policy.clip_high},
          {"kl_beta", policy.kl_beta},
          {"scale_by_std", scale_by_std},
          {"max_chars", reward.max_chars},
          {"length_penalty", reward.length_penalty},
          {"format_penalty", reward.format_penalty},
          {"eval_every", eval_every},
          {"eval_samples", eval_samples},
          {"teachers", tj},
          {"teacher_select", teacher_select},
          {"distill_loss", DistillLossName(distill_loss)},
          {"reward_weight", reward_weight},
          {"teacher_top_k", teacher_top_k},
          {"teacher_timeout_s", remote.timeout_s},
          {"teacher_concurrency", remote.concurrency},
          {"api_key_env", api_key_env},
          {"sft_source", sft_source}};
}

}  // namespace myriad::rl
