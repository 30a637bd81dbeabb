// What the planner plans for: a cluster (devices and the network between
// them) and a training job (the model -- Myriad's own [model] section -- the
// sequence length, batch and token budget). Read from TOML; presets for an
// Ascend 910B cluster, A100 and H100 clusters and this CPU are built in
// (`myriad plan --show-preset NAME` prints one to copy and edit).
//
//   [cluster]                      [job]
//   preset = "a100"  (optional)    seq_len = 4096
//   devices = 3072                 global_batch_tokens = 4194304
//   [cluster.device] ...           train_tokens = 2e12
//   [cluster.node] / .scaleup / .scaleout   (one tier each)
//
// docs/planning.md documents every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"
#include "model/config.h"
#include "model/flops.h"

namespace myriad::plan {

struct DeviceDesc {
  std::string name = "device";
  double peak_flops = 312e12;       // dense bf16/fp16 FLOP/s (the default training precision)
  double peak_flops_fp32 = 0;       // dense fp32 FLOP/s (0: not given)
  double peak_flops_fp8 = 0;        // dense fp8 FLOP/s (0: not given)
  double memory_bytes = 80e9;       // device memory
  double memory_bw = 2.0e12;        // bytes/s
  // Achieved fractions of peak, for the cost model (calibrated on this CPU
  // by `myriad plan --calibrate`; the presets' are typical measured values).
  double gemm_efficiency = 0.75;    // large GEMMs
  double attention_efficiency = 0.55;  // fused (flash) attention
  double memory_efficiency = 0.8;   // streaming element-wise kernels
  double usable_memory = 0.9;       // the rest: allocator slack, runtime, workspace
  double kernel_overhead_s = 0;     // fixed cost per layer pass (launches, syncs)
  double gemm_overhead_s = 0;       // fixed cost per GEMM call (calibrated)
  double reduce_bw = 0;             // bytes/s at which collectives sum (0: free; CPUs sum in memory)
  double page_touch_bw = 0;         // bytes/s of first-touching fresh pages (0: free; a VM's page faults are slow)
  bool comm_on_cores = false;       // collectives run on the compute cores (CPU ranks): overlap hides nothing
};

// One level of the network: `size` devices share it (a node, a scale-up
// domain, the whole cluster); `bandwidth` is per device and direction.
struct TierDesc {
  std::string name;
  int64_t size = 1;
  double bandwidth = 1e9;  // bytes/s per device
  double latency = 1e-5;   // seconds per message (alpha)
  // Achieved fraction of `bandwidth` per collective (calibrated: MPI's
  // all-reduce on a CPU also sums, its all-to-all has more messages).
  double allreduce_eff = 1, allgather_eff = 1, alltoall_eff = 1;
};

struct ClusterDesc {
  std::string name = "cluster";
  int64_t devices = 8;
  DeviceDesc device;
  // Innermost first; sizes strictly increasing and each dividing the next;
  // the last spans the cluster.
  std::vector<TierDesc> tiers;
  int64_t devices_per_node() const { return tiers.empty() ? 1 : tiers.front().size; }
  Status Validate() const;
};

struct JobDesc {
  ModelConfig model;
  std::string model_name = "model";
  int64_t seq_len = 4096;
  int64_t global_batch_tokens = 4 << 20;  // tokens per optimizer step
  double train_tokens = 1e12;              // for time-to-train
  // Bytes per parameter: weights (compute copy), gradients, optimizer state
  // (Adam: fp32 master + two moments when weights are bf16).
  std::string precision = "bf16";          // GEMM precision: "bf16", "fp32" or "fp8" (picks the device's peak)
  double weight_bytes = 2, grad_bytes = 4, optimizer_bytes = 12;
  double activation_bytes = 2;             // per activation element
  double moe_imbalance = 1.1;              // busiest expert rank / mean
  bool overlap_grad_reduce = true;         // gradient reduction hides behind the backward
  bool overlap_tp_comm = false;            // TP collectives overlapped with the GEMMs around them
  bool overlap_ep_comm = false;            // expert all-to-alls overlapped with other micro-batches' compute
  bool zero3_prefetch = true;              // ZeRO-3 gathers the next layer's weights behind this one's compute
  bool zero3_release_pages = false;        // ZeRO-3 returns gathered weights' pages to the OS (refaulted each gather)
  bool mtp_whole_sequences = false;        // with cp > 1 every cp rank runs the MTP modules on whole sequences
  bool balance_stages = true;              // pipeline stages get layers by time (false: as even as possible)
  int64_t sequences() const { return global_batch_tokens / seq_len; }
  Status Validate() const;
};

// Reads [cluster] from `doc` (starting from [cluster].preset when given).
Result<ClusterDesc> ReadCluster(ConfigDoc* doc);
// Reads [job] and [model] from `doc`.
Result<JobDesc> ReadJob(ConfigDoc* doc);

// Built-in presets: "910b", "a100", "h100", "cpu" (this machine's class:
// 2 cores as 2 "devices"; calibrate before trusting it).
std::vector<std::string> ClusterPresetNames();
// The TOML text of a preset (for --show-preset and as the base of a file
// that names it); empty if unknown.
std::string ClusterPresetToml(const std::string& name);
Result<ClusterDesc> ClusterPreset(const std::string& name, int64_t devices = 0);

// The device's peak for the job's precision (0 when the cluster does not give it).
double PeakFlops(const DeviceDesc& d, const JobDesc& job);

// Parameter counts live with the model (model/flops.h).
using ::myriad::CountParams;
using ::myriad::ParamCounts;

}  // namespace myriad::plan
