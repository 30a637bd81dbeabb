// `myriad <verb> [options]`: one file per verb under src/cli/, each thin.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/verbs.h"
#include "lab/lab.h"

namespace {

struct Verb {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

const Verb kVerbs[] = {
    {"prepare", myriad::cli::RunPrepare, "train a tokenizer and write token shards"},
    {"train", myriad::cli::RunTrain, "train a model from a TOML config"},
    {"launch", myriad::cli::RunLaunch, "run training under the supervisor: checks, restarts, hang detection"},
    {"preflight", myriad::cli::RunPreflight, "check a training job before it starts"},
    {"eval", myriad::cli::RunEval, "validation loss and perplexity of a checkpoint"},
    {"generate", myriad::cli::RunGenerate, "generate text from a prompt"},
    {"doctor", myriad::cli::RunDoctor, "report ISA, BLAS kernel, cores and memory"},
    {"inspect", myriad::cli::RunInspect, "show a checkpoint's manifest and tensors"},
    {"import", myriad::cli::RunImport, "import a Hugging Face model folder as a run directory"},
    {"export", myriad::cli::RunExport, "write a checkpoint as a Hugging Face model folder (--hf OUT)"},
    {"serve", myriad::cli::RunServe, "serve a checkpoint over an OpenAI-compatible HTTP API"},
    {"rl", myriad::cli::RunRl, "reinforcement learning with verifiable rewards (GRPO), or its SFT baseline"},
    {"distill", myriad::cli::RunDistill, "on-policy distillation from one teacher per domain (MOPD)"},
    {"tasks", myriad::cli::RunTasks, "write the built-in RL tasks as JSONL (and text for pretraining)"},
    {"route", myriad::cli::RunRoute, "edge/cloud router: prompt set, judge verdicts, training, evaluation"},
    {"tune", myriad::lab::RunTuneCli, "kernel lab: verify, time and tune kernels into a tuned table"},
    {"plan", myriad::cli::RunPlan, "cost model and parallel planner: layout, step time, MFU, time to train"},
    {"simulate", myriad::cli::RunSimulate, "failure simulator: ETTR, checkpoint interval, recovery"},
    {"redact", myriad::cli::RunRedact, "desensitise text into typed placeholders (session vault); --restore; corpus|train|eval|tag of the tagger"},
};

void Usage(FILE* f) {
  std::fprintf(f, "usage: myriad <verb> [options]   (myriad <verb> --help for its options)\n\nverbs:\n");
  for (const auto& v : kVerbs) std::fprintf(f, "  %-10s %s\n", v.name, v.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& v : kVerbs) {
    if (std::strcmp(argv[1], v.name)) continue;
    // Verbs that run the model's kernels use the kernel lab's tuned table.
    for (const char* uses : {"train", "eval", "generate", "serve", "rl", "distill"}) {
      if (std::strcmp(argv[1], uses)) continue;
      myriad::Result<std::string> tuned = myriad::lab::InstallTunedKernelsFromDefaultPath();
      if (!tuned.ok()) {
        std::fprintf(stderr, "myriad %s: %s\n", argv[1], tuned.status().message().c_str());
        return 2;
      }
      if (!tuned.value().empty()) std::fprintf(stderr, "kernels: tuned table %s\n", tuned.value().c_str());
    }
    return v.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "myriad: unknown verb '%s' (hint: one of prepare, train, launch, preflight, eval, generate, doctor, inspect, import, export, serve, rl, distill, tasks, redact, route, tune, plan, simulate)\n",
               argv[1]);
  return 2;
}
