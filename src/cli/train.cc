// myriad train --config FILE [--set key=value ...] [--fresh] [--stop-after N] [--ranks-per-node N] [--hf DIR]
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/verbs.h"
#include "train/comm/world.h"
#include "train/supervise/attempt_runner.h"
#include "train/supervise/heartbeat.h"
#include "train/supervise/lifeline.h"
#include "train/trainer.h"

namespace myriad::cli {

int RunTrain(int argc, char** argv) {
  CLI::App app{"Train a model from a TOML config; resumes from the newest checkpoint in train.out_dir",
               "myriad train"};
  RunSpec spec;
  app.add_option("--config,-c", spec.config_path, "TOML config (e.g. configs/demo-moe.toml)")->required();
  app.add_option("--set", spec.overrides, "override a config key: --set train.lr=3e-4 (repeatable)");
  app.add_flag("--fresh", spec.fresh, "start from scratch even if out_dir has checkpoints");
  app.add_option("--stop-after", spec.stop_after, "stop after N steps of this run, saving a checkpoint");
  app.add_flag("--quiet,-q", spec.quiet, "no progress line");
  std::string init_from;
  app.add_option("--init-from,--hf", init_from,
                 "start from this model's weights (a Hugging Face folder, or a run or step directory) with a fresh "
                 "optimizer at step 0: fine-tuning (same as --set train.init_from=PATH; [model] may then be left out)");
  int ranks_per_node = -1;
  app.add_option("--ranks-per-node", ranks_per_node,
                 "group ranks into nodes of N for the hierarchical all-reduce (emulates nodes on one machine; "
                 "same as --set parallel.ranks_per_node=N)");
  CLI11_PARSE(app, argc, argv);
  if (ranks_per_node >= 0) spec.overrides.push_back("parallel.ranks_per_node=" + std::to_string(ranks_per_node));
  if (!init_from.empty()) spec.overrides.push_back("train.init_from=" + init_from);
  if (supervise::SupervisorPid() > 0) {
    // Under `myriad launch`: never outlive it (lifeline.h); its stop signal
    // counts only while training runs (RunTraining's handler), not before
    // or after (the supervisor sends it once this rank has reported).
    supervise::WatchSupervisor();
    std::signal(supervise::kJobStopSignal, SIG_IGN);
  }
  // Under mpirun every rank runs this; the layout comes from [parallel]
  // (or --set parallel.dp=2 ...), and must multiply to the rank count.
  std::unique_ptr<comm::Comm> world = comm::InitWorld(nullptr, nullptr);
  spec.world = world.get();
  int exit_code = 1;
  spec.exit_code = &exit_code;
  Status s = RunTraining(spec);
  if (!s.ok()) {
    // The supervisor (if any) learns why; the exit code says what kind of failure it was.
    supervise::Heartbeat::Global().Event("exit", {{"ok", false}, {"code", exit_code}, {"message", s.message()}});
    if (world->size() > 1)
      std::fprintf(stderr, "myriad train [rank %d/%d]: %s\n", world->rank(), world->size(), s.message().c_str());
    else
      std::fprintf(stderr, "myriad train: %s\n", s.message().c_str());
    // A failed rank must not leave the others waiting in a collective:
    // exiting without MPI_Finalize makes mpirun stop the whole job.
    std::fflush(stderr);
    std::_Exit(exit_code);
  }
  world.reset();
  comm::FinalizeWorld();
  return 0;
}

}  // namespace myriad::cli
