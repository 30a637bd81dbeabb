// Cluster and job descriptions: TOML reading, presets.
#include "plan/desc.h"

#include <cmath>
#include <map>

namespace myriad::plan {
namespace {

// Presets. Figures are vendors' peak numbers and typical achieved
// fractions (docs/planning.md gives the sources); bandwidths are per device
// and direction, after protocol overhead.
const std::map<std::string, std::string>& Presets() {
  static const std::map<std::string, std::string> kPresets = {
      {"910b", R"(# Ascend 910B-class cluster: 8 devices per node on HCCS, RoCE between nodes.
[cluster]
name = "ascend-910b"
devices = 10000
[cluster.device]
name = "Ascend 910B"
peak_tflops = 313        # fp16/bf16 dense
memory_gb = 64           # HBM2e
memory_bw_gbs = 1600
gemm_efficiency = 0.62
attention_efficiency = 0.45
memory_efficiency = 0.75
[cluster.node]
size = 8
bandwidth_gbs = 150      # HCCS, per device
latency_us = 5
[cluster.scaleout]
bandwidth_gbs = 23       # one 200 Gb/s RoCE port per device
latency_us = 15
)"},
      {"a100", R"(# DGX A100-class cluster: 8 GPUs per node on NVLink 3, 8x HDR InfiniBand per node.
[cluster]
name = "a100"
devices = 3072
[cluster.device]
name = "A100 80GB SXM"
peak_tflops = 312        # bf16 dense tensor core
peak_tflops_fp32 = 19.5  # fp32 without TF32
memory_gb = 80
memory_bw_gbs = 2039
gemm_efficiency = 0.75
attention_efficiency = 0.55
memory_efficiency = 0.8
[cluster.node]
size = 8
bandwidth_gbs = 240      # NVLink 3: 300 GB/s per direction, ~80% achieved
latency_us = 5
[cluster.scaleout]
bandwidth_gbs = 23       # one 200 Gb/s HDR port per GPU
latency_us = 12
)"},
      {"h100", R"(# DGX H100-class cluster: 8 GPUs per node on NVLink 4, 8x NDR InfiniBand per node.
[cluster]
name = "h100"
devices = 16384
[cluster.device]
name = "H100 80GB SXM"
peak_tflops = 989        # bf16 dense tensor core
peak_tflops_fp32 = 67    # fp32 without TF32
peak_tflops_fp8 = 1979   # fp8 dense tensor core
memory_gb = 80
memory_bw_gbs = 3350
gemm_efficiency = 0.7
attention_efficiency = 0.5
memory_efficiency = 0.8
[cluster.node]
size = 8
bandwidth_gbs = 370      # NVLink 4: 450 GB/s per direction, ~80% achieved
latency_us = 5
[cluster.scaleout]
bandwidth_gbs = 45       # one 400 Gb/s NDR port per GPU
latency_us = 12
)"},
      {"cpu", R"(# This machine's class: one rank per core as a "device", MPI over shared memory.
# Uncalibrated guesses: run `myriad plan --calibrate` to measure them.
[cluster]
name = "cpu"
devices = 2
[cluster.device]
name = "CPU core"
peak_tflops = 0.19       # fp32 FMA per core (no faster bf16 GEMM here)
peak_tflops_fp32 = 0.19
memory_gb = 12
memory_bw_gbs = 27
gemm_efficiency = 0.7
attention_efficiency = 0.4
memory_efficiency = 0.5
[cluster.node]
size = 2
bandwidth_gbs = 5
latency_us = 2
)"},
  };
  return kPresets;
}

std::string Fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Reads one tier table `key` (size, bandwidth_gbs, latency_us) over `base`.
TierDesc ReadTier(ConfigDoc* doc, const std::string& key, const std::string& name, const TierDesc& base) {
  TierDesc t = base;
  t.name = name;
  t.size = doc->GetInt(key + ".size", base.size);
  t.bandwidth = doc->GetFloat(key + ".bandwidth_gbs", base.bandwidth / 1e9) * 1e9;
  t.latency = doc->GetFloat(key + ".latency_us", base.latency * 1e6) * 1e-6;
  return t;
}

bool HasTier(ConfigDoc* doc, const std::string& key) {
  for (const char* f : {".size", ".bandwidth_gbs", ".latency_us"})
    if (doc->Has(key + f)) return true;
  return false;
}

// [cluster] over `base`: tiers named node, scaleup (optional) and scaleout
// (optional; spans the cluster).
Result<ClusterDesc> ReadClusterOver(ConfigDoc* doc, const ClusterDesc& base) {
  ClusterDesc c = base;
  c.name = doc->GetString("cluster.name", base.name);
  c.devices = doc->GetInt("cluster.devices", base.devices);
  DeviceDesc& d = c.device;
  d.name = doc->GetString("cluster.device.name", base.device.name);
  d.peak_flops = doc->GetFloat("cluster.device.peak_tflops", base.device.peak_flops / 1e12) * 1e12;
  d.peak_flops_fp32 = doc->GetFloat("cluster.device.peak_tflops_fp32", base.device.peak_flops_fp32 / 1e12) * 1e12;
  d.peak_flops_fp8 = doc->GetFloat("cluster.device.peak_tflops_fp8", base.device.peak_flops_fp8 / 1e12) * 1e12;
  d.memory_bytes = doc->GetFloat("cluster.device.memory_gb", base.device.memory_bytes / 1e9) * 1e9;
  d.memory_bw = doc->GetFloat("cluster.device.memory_bw_gbs", base.device.memory_bw / 1e9) * 1e9;
  d.gemm_efficiency = doc->GetFloat("cluster.device.gemm_efficiency", base.device.gemm_efficiency);
  d.attention_efficiency = doc->GetFloat("cluster.device.attention_efficiency", base.device.attention_efficiency);
  d.memory_efficiency = doc->GetFloat("cluster.device.memory_efficiency", base.device.memory_efficiency);
  d.usable_memory = doc->GetFloat("cluster.device.usable_memory", base.device.usable_memory);
  d.kernel_overhead_s = doc->GetFloat("cluster.device.kernel_overhead_us", base.device.kernel_overhead_s * 1e6) * 1e-6;
  d.gemm_overhead_s = doc->GetFloat("cluster.device.gemm_overhead_us", base.device.gemm_overhead_s * 1e6) * 1e-6;
  d.reduce_bw = doc->GetFloat("cluster.device.reduce_gbs", base.device.reduce_bw / 1e9) * 1e9;
  d.page_touch_bw = doc->GetFloat("cluster.device.page_touch_gbs", base.device.page_touch_bw / 1e9) * 1e9;

  auto find = [&](const std::string& name) -> const TierDesc* {
    for (const auto& t : base.tiers)
      if (t.name == name) return &t;
    return nullptr;
  };
  std::vector<TierDesc> tiers;
  for (const char* name : {"node", "scaleup", "scaleout"}) {
    const std::string key = std::string("cluster.") + name;
    const TierDesc* b = find(name);
    if (!b && !HasTier(doc, key)) continue;
    TierDesc def;
    if (b) def = *b;
    tiers.push_back(ReadTier(doc, key, name, def));
  }
  if (tiers.empty()) tiers.push_back(TierDesc{"node", 1, 1e12, 1e-6});
  if (tiers.size() == 1 && tiers[0].size > c.devices) tiers[0].size = c.devices;  // part of one node
  // The outermost tier spans the cluster (a scale-out tier's size is implied).
  TierDesc& last = tiers.back();
  if (last.name == "scaleout") {
    last.size = c.devices;
  } else if (last.size < c.devices) {
    return Status::Error("cluster: " + std::to_string(c.devices) + " devices but the largest tier, cluster." +
                         last.name + ", has " + std::to_string(last.size) +
                         " (hint: add [cluster.scaleout] with bandwidth_gbs and latency_us)");
  }
  c.tiers = std::move(tiers);
  return c;
}

}  // namespace

Status ClusterDesc::Validate() const {
  auto bad = [&](const std::string& m) { return Status::Error("cluster " + name + ": " + m); };
  if (devices < 1) return bad("devices=" + std::to_string(devices) + " must be positive");
  const DeviceDesc& d = device;
  if (!(d.peak_flops > 0)) return bad("device.peak_tflops must be positive");
  if (!(d.memory_bytes > 0)) return bad("device.memory_gb must be positive");
  if (!(d.memory_bw > 0)) return bad("device.memory_bw_gbs must be positive");
  for (double e : {d.gemm_efficiency, d.attention_efficiency, d.memory_efficiency, d.usable_memory})
    if (!(e > 0 && e <= 1))
      return bad("device efficiencies and usable_memory must be in (0, 1], got " + Fmt(e));
  if (tiers.empty()) return bad("no network tiers");
  int64_t prev = 1;
  for (const auto& t : tiers) {
    if (t.size < 1 || t.size % prev)
      return bad("tier " + t.name + ": size " + std::to_string(t.size) + " is not a multiple of the tier inside it (" +
                 std::to_string(prev) + ")");
    if (!(t.bandwidth > 0) || !(t.latency >= 0))
      return bad("tier " + t.name + ": bandwidth_gbs must be positive and latency_us non-negative");
    prev = t.size;
  }
  if (devices % devices_per_node())
    return bad("devices=" + std::to_string(devices) + " is not a multiple of cluster.node.size=" +
               std::to_string(devices_per_node()));
  for (size_t i = 0; i + 1 < tiers.size(); ++i)
    if (devices % tiers[i].size)
      return bad("devices=" + std::to_string(devices) + " is not a multiple of cluster." + tiers[i].name +
                 ".size=" + std::to_string(tiers[i].size));
  return Status::Ok();
}

Status JobDesc::Validate() const {
  auto bad = [&](const std::string& m) { return Status::Error("job: " + m); };
  RETURN_IF_ERROR(model.Validate().With("model"));
  if (seq_len < 1) return bad("seq_len=" + std::to_string(seq_len) + " must be positive");
  if (global_batch_tokens < seq_len)
    return bad("global_batch_tokens=" + std::to_string(global_batch_tokens) + " is less than one sequence of " +
               std::to_string(seq_len) + " tokens");
  if (!(train_tokens > 0)) return bad("train_tokens must be positive");
  if (!(moe_imbalance >= 1)) return bad("moe_imbalance=" + Fmt(moe_imbalance) + " must be >= 1 (busiest rank / mean)");
  return Status::Ok();
}

std::vector<std::string> ClusterPresetNames() {
  std::vector<std::string> names;
  for (const auto& [k, v] : Presets()) names.push_back(k);
  return names;
}

std::string ClusterPresetToml(const std::string& name) {
  auto it = Presets().find(name);
  return it == Presets().end() ? std::string() : it->second;
}

Result<ClusterDesc> ClusterPreset(const std::string& name, int64_t devices) {
  const std::string text = ClusterPresetToml(name);
  if (text.empty()) {
    std::string names;
    for (const auto& n : ClusterPresetNames()) names += (names.empty() ? "" : ", ") + n;
    return Status::Error("unknown cluster preset '" + name + "' (hint: one of " + names + ")");
  }
  std::vector<std::string> over;
  if (devices > 0) over.push_back("cluster.devices=" + std::to_string(devices));
  ASSIGN_OR_RETURN(auto doc, ConfigDoc::Parse(text, "preset " + name, over));
  ClusterDesc base;
  base.tiers.clear();
  ASSIGN_OR_RETURN(ClusterDesc c, ReadClusterOver(doc.get(), base));
  RETURN_IF_ERROR(doc->Finish());
  RETURN_IF_ERROR(c.Validate());
  return c;
}

Result<ClusterDesc> ReadCluster(ConfigDoc* doc) {
  ClusterDesc base;
  const std::string preset = doc->GetString("cluster.preset", "");
  if (!preset.empty()) {
    ASSIGN_OR_RETURN(base, ClusterPreset(preset));
  }
  ASSIGN_OR_RETURN(ClusterDesc c, ReadClusterOver(doc, base));
  RETURN_IF_ERROR(c.Validate().With(doc->source()));
  return c;
}

Result<JobDesc> ReadJob(ConfigDoc* doc) {
  JobDesc j;
  j.model = ModelConfig::Read(doc);
  j.model_name = doc->GetString("job.name", j.model_name);
  j.seq_len = doc->GetInt("job.seq_len", j.seq_len);
  j.global_batch_tokens = doc->GetInt("job.global_batch_tokens", j.global_batch_tokens);
  j.train_tokens = doc->GetFloat("job.train_tokens", j.train_tokens);
  j.moe_imbalance = doc->GetFloat("job.moe_imbalance", j.moe_imbalance);
  j.overlap_grad_reduce = doc->GetBool("job.overlap_grad_reduce", j.overlap_grad_reduce);
  j.balance_stages = doc->GetBool("job.balance_stages", j.balance_stages);
  j.overlap_tp_comm = doc->GetBool("job.overlap_tp_comm", j.overlap_tp_comm);
  j.overlap_ep_comm = doc->GetBool("job.overlap_ep_comm", j.overlap_ep_comm);
  j.zero3_prefetch = doc->GetBool("job.zero3_prefetch", j.zero3_prefetch);
  j.zero3_release_pages = doc->GetBool("job.zero3_release_pages", j.zero3_release_pages);
  j.mtp_whole_sequences = doc->GetBool("job.mtp_whole_sequences", j.mtp_whole_sequences);
  j.precision = doc->GetString("job.precision", "bf16");
  if (j.precision == "bf16") {
    j.weight_bytes = 2, j.grad_bytes = 4, j.optimizer_bytes = 12, j.activation_bytes = 2;
  } else if (j.precision == "fp32") {
    j.weight_bytes = 4, j.grad_bytes = 4, j.optimizer_bytes = 8, j.activation_bytes = 4;
  } else if (j.precision == "fp8") {  // fp8 GEMM copies of the weights; bf16 activations; fp32 master and moments
    j.weight_bytes = 1, j.grad_bytes = 4, j.optimizer_bytes = 12, j.activation_bytes = 2;
  } else {
    doc->Fail("job.precision='" + j.precision + "' (hint: \"bf16\", \"fp32\" or \"fp8\")");
  }
  // Planning reaches lengths far beyond what the model was configured to
  // train at: the model's limit follows the job.
  j.model.max_seq_len = std::max(j.model.max_seq_len, j.seq_len);
  RETURN_IF_ERROR(j.Validate().With(doc->source()));
  return j;
}

double PeakFlops(const DeviceDesc& d, const JobDesc& job) {
  if (job.precision == "fp32") return d.peak_flops_fp32;
  if (job.precision == "fp8") return d.peak_flops_fp8;
  return d.peak_flops;
}


}  // namespace myriad::plan
