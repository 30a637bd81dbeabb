// Calibration: this machine's kernels (Myriad's own GEMM, attention and
// element-wise ops, on the shapes a job runs) and collectives, measured and
// fitted to the cost model's parameters, so that the model predicts
// Myriad's own multi-rank step times (`myriad plan --calibrate`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/cost.h"

namespace myriad::plan {

// Least squares for t = x1 * p1 + x2 * p2 (no constant), weighted by 1/t^2
// (so it minimises relative error); max_rel_err is the worst sample's.
std::pair<double, double> FitTwo(const std::vector<double>& x1, const std::vector<double>& x2,
                                 const std::vector<double>& t, double* max_rel_err = nullptr);

struct Calibration {
  int threads = 1;               // per rank (device) while measuring
  double gemm_flops = 0;         // sustained FLOP/s of the GEMMs ...
  double gemm_overhead_s = 0;    // ... plus this per call
  double gemm_fit_err = 0;       // worst relative error of roofline + overhead over the shapes timed
  double attention_flops = 0;    // fused causal attention, forward + backward, in the cost model's count
  double memory_bw = 0;          // element-wise kernels, bytes/s
  double page_touch_bw = 0;      // first touch of freshly mapped memory, bytes/s
  double comm_bandwidth = 0;     // per rank, bytes/s (MPI on this machine: send/recv)
  double allreduce_eff = 1, allgather_eff = 1, alltoall_eff = 1;  // each collective's fitted bandwidth / comm_bandwidth
  double comm_latency = 0;       // seconds per message
  double comm_fit_err = 0;
  int comm_ranks = 0;
  nlohmann::json ToJson() const;
};

// Times Myriad's GEMM on the shapes `job` runs (each layer's projections,
// FFN, experts and the head, at the token counts of the layouts in play),
// its attention forward and backward, and an element-wise kernel, with the
// current thread count; fills the kernel fields.
void MeasureKernels(const JobDesc& job, int64_t tokens, Calibration* cal);

// One rank's part of the collective benchmark (all ranks call it with the
// same communicator-like callbacks); see cli/plan_calibrate.cc. Samples:
// (collective, bytes, seconds) -> fitted into comm_* by FitComm.
struct CommSample {
  std::string op;  // "allreduce", "allgather", "alltoall", "sendrecv"
  double bytes = 0, seconds = 0;
};
void FitComm(const std::vector<CommSample>& samples, int ranks, Calibration* cal);

// The MoE load factor of expert parallelism over `ep` ranks for a router's
// load (per MoE layer, tokens per expert; experts in contiguous ranges per
// rank): each layer waits for its busiest rank, so the mean over layers of
// max(rank's tokens) / mean. 1 for ep <= 1 or no load.
double EpImbalance(const std::vector<std::vector<double>>& load, int64_t ep);

// The cluster the calibration describes: `devices` ranks on one node.
ClusterDesc CalibratedCluster(const Calibration& cal, int64_t devices);

}  // namespace myriad::plan
