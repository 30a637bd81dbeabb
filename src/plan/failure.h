// Failure simulator for long training runs: how much of the wall clock a job
// on N accelerators spends on useful work (ETTR, effective training time
// ratio) given failure rates, checkpointing and recovery, by Monte Carlo and
// by closed forms that check it.
//
//   auto spec = ParseFailureSpec(*doc, "failures");   // [failures] section
//   FailureResult r = SimulateFailures(*spec);         // r.ettr, r.wall_hours
//   IntervalSweep s = BestCheckpointInterval(*spec);   // s.best_interval_s
//
// The model. Failures of each component arrive as a Poisson process while the
// job holds the cluster (computing, checkpointing, restarting, loading); their
// rates add up. A failure costs: detection (detect_seconds) + the operator's
// response (manual_response_seconds, only without auto_recovery) + a wait for
// a repaired node (only when the component needs a node replaced,
// repair_seconds > 0, and no spare node is free) + restart (re-launch) + load
// (read the last checkpoint, if one exists), and the work and checkpoint
// blocking time since the last complete checkpoint is lost. A failure during
// restart or load starts the recovery over. Down time (detection, response,
// repair wait) is not exposed to failures: the job is not running then.
// Spares: a failed node goes to repair for repair_seconds and then becomes a
// spare again; with all spares out, the job waits for the first node back.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/status.h"

namespace myriad::plan {

struct FailureComponent {
  std::string name;
  double rate_per_hour = 0;    // failures per device-hour (per node-hour if per_node)
  bool per_node = false;
  double detect_seconds = 0;   // failure -> noticed (hang watchdog for hangs, ~0 for crashes)
  double repair_seconds = 0;   // node out for repair (0: no node is replaced, e.g. software)
};

// Defaults for a large accelerator cluster: device, host, network, software.
// Loosely based on Meta's Llama 3 405B report (Table 5): 419 unexpected
// interruptions in 54 days on 16,384 GPUs (0.47 per 1000 GPU-days), 58.7%
// GPU-related (GPU, HBM, SRAM, GSP, SDC, thermal), ~12% network (switch,
// cable, NIC, NCCL watchdog), ~13% software, ~12% host (maintenance, SSD,
// power, chassis, CPU, DRAM). These four components reproduce ~417 failures
// for that cluster and span.
std::vector<FailureComponent> DefaultFailureComponents();

struct FailureSpec {
  int64_t devices = 10000;
  int64_t devices_per_node = 8;
  std::vector<FailureComponent> components = DefaultFailureComponents();
  double work_hours = 2000;              // useful training at full speed the job needs
  double ckpt_interval_seconds = 1800;   // compute between checkpoints (0: never checkpoint)
  double ckpt_blocking_seconds = 10;     // stall per checkpoint (async: the snapshot copy)
  double restart_seconds = 600;          // re-launch, init, collective setup
  double load_seconds = 300;             // read a checkpoint
  bool auto_recovery = true;             // detect -> exclude node -> restart, no person
  double manual_response_seconds = 3600; // without auto_recovery: until a person restarts it
  int64_t spare_nodes = 16;              // hot spares (0: wait for each repair)
  int64_t trials = 200;                  // Monte Carlo runs of the whole job
  uint64_t seed = 1;
  int64_t max_failures_per_trial = 100000;  // a run past this stops (see truncated_trials)

  int64_t nodes() const { return devices / devices_per_node; }
};

// Checks ranges; messages name the TOML key under `prefix` and give a hint.
Status ValidateFailureSpec(const FailureSpec& spec, const std::string& prefix = "failures");

// Reads the section `prefix` (e.g. "failures"):
//   devices, devices_per_node, work_hours, ckpt_interval_minutes (0: none),
//   ckpt_blocking_seconds, restart_seconds, load_seconds, auto_recovery,
//   manual_response_minutes, spare_nodes, trials, seed, max_failures_per_trial
// and the sub-tables device, host, network, software:
//   rate_per_1000_device_days (per_node = false) or rate_per_1000_node_days
//   (per_node = true), per_node, detect_seconds, repair_hours.
// Range errors come back here; wrong types and unknown keys are reported by
// doc.Finish() as for every other section.
Result<FailureSpec> ParseFailureSpec(ConfigDoc& doc, const std::string& prefix = "failures");

// Averages over trials; hours are per run of the whole job.
struct FailureResult {
  double ettr = 0;               // work_hours / mean wall_hours
  double ettr_stderr = 0;        // delta method from wall_hours_stderr
  double wall_hours = 0;         // mean wall time to finish the job
  double wall_hours_stderr = 0;
  double wall_hours_p50 = 0, wall_hours_p90 = 0;  // schedule risk
  double failures = 0;           // mean failures per run
  std::vector<double> failures_by_component;  // in spec.components order
  // Where the wall time goes: work_hours + the six below = wall_hours.
  double lost_work_hours = 0;    // compute and checkpoint stalls thrown away by failures
  double checkpoint_hours = 0;   // blocking time of completed checkpoints
  double restart_hours = 0;      // restart + load, attempts cut short included
  double detect_hours = 0;
  double response_hours = 0;     // manual response
  double repair_wait_hours = 0;  // waiting for a repaired node (no spare free)
  double spare_shortages = 0;    // failures per run that found no spare node
  int64_t truncated_trials = 0;  // runs stopped at max_failures_per_trial: ettr is an upper bound
};

FailureResult SimulateFailures(const FailureSpec& spec);

// ---- Closed forms ----

// Total failure rate of the job (per second) and its MTBF (inf if no failures).
double JobFailureRate(const FailureSpec& spec);
double JobMtbfSeconds(const FailureSpec& spec);

// Young's first-order optimal compute between checkpoints: sqrt(2 C M).
double YoungDalyInterval(double ckpt_cost_s, double mtbf_s);
// Daly's higher-order estimate (2006): sqrt(2CM)[1 + sqrt(C/2M)/3 + C/18M] - C
// for C < 2M, else M.
double DalyInterval(double ckpt_cost_s, double mtbf_s);

// Expected time to get through a stretch of `a` exposed seconds that a
// failure (rate lambda) sends back to its start, each failure costing
// `down_s` unexposed seconds and then a recovery of `recover_s` exposed
// seconds (a failure during recovery repeats the down time and recovery):
//   E[T] = e^{lambda R} (1/lambda + D) (e^{lambda a} - 1)      (a for lambda = 0)
// Derivation: per attempt, E[min(X, a)] = (1 - e^{-lambda a})/lambda, and a
// failure (prob. 1 - e^{-lambda a}) adds D + Y + T, where Y, the expected
// recovery, solves the same equation: Y = (e^{lambda R} - 1)(1/lambda + D).
double ExpectedSegmentSeconds(double a, double lambda, double down_s, double recover_s);

// Expected wall time of the whole job by summing ExpectedSegmentSeconds over
// its checkpoint segments, with D the rate-weighted mean down time. Exact for
// the simulator's model when spare_nodes == 0 or spares never run out (then
// the repair wait is taken as 0); an approximation otherwise.
double AnalyticWallSeconds(const FailureSpec& spec);
double AnalyticEttr(const FailureSpec& spec);

// ---- Choosing the checkpoint interval ----

struct IntervalSweep {
  double best_interval_s = 0;   // argmax, refined by a parabola in log(interval)
  double best_ettr = 0;
  double young_daly_s = 0;      // the sweep's centre
  std::vector<std::pair<double, double>> curve;  // (interval_s, simulated ettr)
};

// Simulates `points` intervals log-spaced from young_daly/span to
// young_daly*span (none below the checkpoint blocking time). Without failures
// checkpoints only cost time: best_interval_s = 0 (never), curve empty.
IntervalSweep BestCheckpointInterval(const FailureSpec& spec, int points = 25, double span = 8.0);

}  // namespace myriad::plan
