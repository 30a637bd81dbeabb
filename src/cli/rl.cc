// myriad rl -c CONFIG        GRPO with verifiable rewards (or rl.algorithm = "sft": the baseline)
// myriad distill -c CONFIG   on-policy distillation from one teacher per domain (MOPD)
// myriad tasks ...           the built-in tasks as JSONL (and as text for pretraining)
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "cli/ckpt_util.h"
#include "cli/verbs.h"
#include "core/env.h"
#include "rl/post_train.h"
#include "rl/tasks.h"
#include "train/comm/world.h"

namespace myriad::cli {

namespace {

Result<rl::LoadedPolicy> LoadPolicy(const std::string& path) {
  const bool hf = Env::Default()->FileExists(path + "/config.json");
  ASSIGN_OR_RETURN(LoadedModel m, LoadModelFor(hf ? "" : path, hf ? path : ""));
  rl::LoadedPolicy p;
  p.model = std::move(m.model);
  p.tokenizer_path = m.tokenizer_path;
  p.dir = m.dir;
  p.eos_token_ids = m.eos_token_ids;
  return p;
}

int RunPostTrainVerb(const char* verb, int argc, char** argv) {
  const std::string v = verb;
  CLI::App app{v == "rl" ? "Reinforcement learning with verifiable rewards (GRPO) on built-in or JSONL tasks; "
                           "resumes from train.out_dir"
                         : "On-policy distillation of a student from one teacher per domain (MOPD); resumes from "
                           "train.out_dir",
               "myriad " + v};
  rl::PostTrainSpec spec;
  spec.verb = v;
  app.add_option("--config,-c", spec.config_path, "TOML config ([train] with train.init_from, [rl], [distill])")
      ->required();
  app.add_option("--set", spec.overrides, "override a config key: --set rl.group_size=16 (repeatable)");
  app.add_flag("--fresh", spec.fresh, "start from train.init_from even if out_dir has checkpoints");
  app.add_option("--stop-after", spec.stop_after, "stop after N iterations of this run, saving a checkpoint");
  app.add_flag("--quiet,-q", spec.quiet, "no progress lines");
  CLI11_PARSE(app, argc, argv);
  // `myriad distill` distils whatever rl.algorithm the config (one shared
  // with `myriad rl`) or a --set names: applied last, so it wins.
  if (v == "distill") spec.overrides.push_back("rl.algorithm=distill");
  std::unique_ptr<comm::Comm> world = comm::InitWorld(nullptr, nullptr);
  spec.world = world.get();
  int exit_code = 1;
  spec.exit_code = &exit_code;
  spec.load_model = LoadPolicy;
  Status s = rl::RunPostTraining(spec);
  if (!s.ok()) {
    if (world->size() > 1)
      std::fprintf(stderr, "myriad %s [rank %d/%d]: %s\n", verb, world->rank(), world->size(), s.message().c_str());
    else
      std::fprintf(stderr, "myriad %s: %s\n", verb, s.message().c_str());
    std::fflush(stderr);
    std::_Exit(exit_code);  // never leave other ranks in a collective
  }
  world.reset();
  comm::FinalizeWorld();
  return 0;
}

}  // namespace

int RunRl(int argc, char** argv) { return RunPostTrainVerb("rl", argc, argv); }
int RunDistill(int argc, char** argv) { return RunPostTrainVerb("distill", argc, argv); }

int RunTasks(int argc, char** argv) {
  CLI::App app{"Write built-in RL tasks as JSONL (and prompt + reference lines as text, a pretraining corpus)",
               "myriad tasks"};
  std::vector<std::string> domains{"arithmetic"};
  int count = 100, difficulty = 1;
  uint64_t seed = 1;
  std::string split = "train", out, text;
  app.add_option("--domain", domains, "arithmetic, countdown, python, tool_call (repeatable)");
  app.add_option("--count", count, "tasks per domain")->check(CLI::Range(1, 1 << 24));
  app.add_option("--difficulty", difficulty, "1..5")->check(CLI::Range(1, 5));
  app.add_option("--seed", seed, "generator seed");
  app.add_option("--split", split, "train or held_out")->check(CLI::IsMember({"train", "held_out"}));
  app.add_option("--out,-o", out, "JSONL file to write");
  app.add_option("--text", text, "also write prompt+reference, one task per line, to this text file");
  CLI11_PARSE(app, argc, argv);
  if (out.empty() && text.empty()) {
    std::fprintf(stderr, "myriad tasks: nothing to write (hint: --out FILE.jsonl and/or --text FILE.txt)\n");
    return 2;
  }
  std::vector<rl::Task> all;
  for (const std::string& d : domains) {
    auto t = rl::GenerateTasks(d, count, difficulty, seed, split == "train" ? rl::Split::kTrain : rl::Split::kHeldOut);
    if (!t.ok()) {
      std::fprintf(stderr, "myriad tasks: %s\n", t.status().message().c_str());
      return 2;
    }
    for (auto& x : *t) all.push_back(std::move(x));
  }
  if (!out.empty()) {
    if (Status s = rl::WriteTasksJsonl(out, all); !s.ok()) {
      std::fprintf(stderr, "myriad tasks: %s\n", s.message().c_str());
      return 1;
    }
  }
  if (!text.empty()) {
    std::ofstream f(text, std::ios::trunc);
    for (const rl::Task& t : all) f << t.prompt << t.reference;
    f.close();
    if (!f) {
      std::fprintf(stderr, "myriad tasks: %s: cannot write\n", text.c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "wrote %zu tasks%s%s%s%s\n", all.size(), out.empty() ? "" : " to ", out.c_str(),
               text.empty() ? "" : ", text to ", text.c_str());
  return 0;
}

}  // namespace myriad::cli
