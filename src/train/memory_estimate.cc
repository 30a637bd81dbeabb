#include "train/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "model/params.h"

namespace myriad {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return b <= 0 ? a : (a + b - 1) / b; }

ParallelDims DimsOf(const TrainConfig& t, int ranks) {
  ParallelDims d = t.parallel;
  if (d.trivial() && ranks > 1) d.dp = ranks;
  return d;
}

// Bytes of `floats` fp32 values, saturated (never wraps, even for absurd figures).
int64_t Bytes(double floats) {
  const double b = std::ceil(4 * floats);
  return b >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(b);
}

int64_t SaturatedSum(std::initializer_list<int64_t> parts) {
  int64_t s = 0;
  for (int64_t p : parts)
    if (__builtin_add_overflow(s, p, &s)) return std::numeric_limits<int64_t>::max();
  return s;
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) { v /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

int64_t MemoryEstimate::HostBytes(int64_t ranks_here) const {
  const int64_t others = std::max<int64_t>(0, ranks_here - 1);
  int64_t rest = 0;
  if (__builtin_mul_overflow(others, total - root_only, &rest)) return std::numeric_limits<int64_t>::max();
  return SaturatedSum({total, rest});
}

std::string MemoryEstimate::ToString() const {
  return "params " + FormatBytes(params) + " + grads " + FormatBytes(grads) + " + optimizer " +
         FormatBytes(optimizer) + " + activations " + FormatBytes(activations) + " + checkpoint " +
         FormatBytes(checkpoint) + " + buffers " + FormatBytes(buffers) + " = total " + FormatBytes(total);
}

nlohmann::json MemoryEstimate::ToJson() const {
  return {{"params", params},         {"grads", grads},         {"optimizer", optimizer},
          {"activations", activations}, {"checkpoint", checkpoint}, {"buffers", buffers},
          {"total", total},           {"root_only", root_only}};
}

BatchPlan PlanBatches(const TrainConfig& t, const ParallelDims& d, int64_t microbatches) {
  BatchPlan p;
  const int64_t D = std::max<int64_t>(1, static_cast<int64_t>(d.dp) * d.ep);
  p.per_rank = std::max<int64_t>(1, t.batch_size * t.grad_accum / D);
  if (d.pp > 1) {
    p.micro = microbatches > 0 ? microbatches : 2 * d.pp;
  } else {
    p.micro = std::max<int64_t>(1, t.grad_accum / D);
  }
  p.per_micro = std::max<int64_t>(1, CeilDiv(p.per_rank, p.micro));
  p.in_flight = d.pp > 1 ? std::min<int64_t>(d.pp, p.micro) : 1;
  return p;
}

MemoryEstimate EstimateRankMemory(const ModelConfig& m, const TrainConfig& t, int ranks) {
  const ParallelDims d = DimsOf(t, ranks);
  const int64_t tp = std::max(1, d.tp), pp = std::max(1, d.pp), ep = std::max(1, d.ep);
  const int64_t dp = std::max(1, d.dp), cp = std::max(1, d.cp);
  const int zero = t.parallel.zero;

  // The layout of tp rank 0 when tp divides the model (the same rules as
  // ParamLayout's own checks); otherwise the whole model, divided below.
  ParallelDims tp_only;
  tp_only.tp = static_cast<int>(tp);
  ModelConfig dense = m;  // the shapes only: DSA's own rule is the layout check's
  dense.attention = "dense";
  LayoutBatch one_sequence;
  one_sequence.seq_len = t.seq_len;
  const bool tp_exact = tp == 1 || tp_only.Validate(static_cast<int>(tp), dense, one_sequence).ok();
  ShardPlan plan;
  if (tp_exact) plan.tp = static_cast<int>(tp);
  const ParamLayout layout(m, plan);

  const double R_dense = static_cast<double>(dp * ep * cp), R_expert = static_cast<double>(dp * cp);
  double params = 0, grads = 0, moments = 0, local = 0;
  double embed_head = 0, experts = 0;  // groups of tensors, for the hint
  std::map<int, double> block_local;   // block -> floats here (before ZeRO)
  for (const ParamInfo& p : layout.params()) {
    double n = static_cast<double>(p.numel);
    if (!tp_exact && p.block >= 0) n /= static_cast<double>(tp);
    if (p.expert) n /= static_cast<double>(ep);
    if (p.block >= 0 && p.block < m.n_layers) n /= static_cast<double>(pp);
    block_local[p.block] += n;
    local += n;
    if (p.block < 0) embed_head += n;
    if (p.expert) experts += n;
    const double R = p.expert ? R_expert : R_dense;
    params += zero >= 3 ? n / R : n;
    // The model's whole gradient (accumulated over the micro-batches; the
    // reduction runs once, on the last), and from stage 2 the owned shard it
    // is reduce-scattered into and the padded send copy of the reduction.
    grads += n + (zero >= 2 ? n / R + n : 0);
    moments += 2 * (zero >= 1 ? n / R : n);
  }
  double largest = 0;  // the largest block here, whole (segments are at most a block)
  for (auto [block, n] : block_local)
    if (block >= 0) largest = std::max(largest, n * (block < m.n_layers ? static_cast<double>(pp) : 1.0));
  // ZeRO-3 gathers one block's parameters whole before its forward/backward;
  // the all-gathers of stages 1-3 stage one segment at a time (a buffer).
  if (zero >= 3 && R_dense > 1) params += largest;
  const double staging = zero >= 1 ? largest : 0;

  // Activations (formula in the header).
  const BatchPlan bp = PlanBatches(t, d, t.parallel.pipeline_microbatches());
  const double N = static_cast<double>(bp.per_micro) * static_cast<double>(t.seq_len) / static_cast<double>(cp);
  const double C = static_cast<double>(m.d_model);
  // MLA (no tp): the padded q, k, v and attention output, kv_b's output, the
  // v part, the latent row, c_kv before and after its norm, q's compression.
  const double a_mla = m.mla() ? 4.0 * static_cast<double>(m.n_heads * std::max(m.qk_head_dim(), m.v_head_dim)) +
                                     static_cast<double>(m.n_heads * (m.qk_nope_head_dim + 2 * m.v_head_dim)) +
                                     static_cast<double>(3 * m.kv_lora_rank + m.qk_rope_head_dim + 2 * m.q_lora_rank)
                               : 0.0;
  const double a_dense = 16 * C + a_mla + 4.0 * static_cast<double>(m.d_ff) / static_cast<double>(tp);
  const double a_moe = 16 * C + a_mla + 2.0 * static_cast<double>(m.n_routed_experts) +
                       static_cast<double>(m.top_k) * (2 * C + 4.0 * static_cast<double>(m.d_expert) / tp) +
                       4.0 * static_cast<double>(m.n_shared_experts * m.d_expert) / static_cast<double>(tp);
  const int64_t n_layers = std::max<int64_t>(1, m.n_layers);
  int64_t n_moe = 0;
  for (int64_t l = 0; l < m.n_layers; ++l) n_moe += m.is_moe_layer(l) ? 1 : 0;
  const double a_mean =
      (a_moe * static_cast<double>(n_moe) + a_dense * static_cast<double>(m.n_layers - n_moe)) /
      static_cast<double>(n_layers);
  const double L = static_cast<double>(CeilDiv(n_layers, pp) + m.mtp_depth);
  const double head = 2.0 * static_cast<double>(m.vocab_size) * static_cast<double>(1 + m.mtp_depth);
  const double act_floats = static_cast<double>(bp.in_flight) * N * (L * a_mean + head);

  // Checkpoints (formula in the header): whole-model copies on rank 0.
  const double whole = static_cast<double>(ParamLayout(m).total());
  const bool shm = t.snapshot_dir != "none" && !t.snapshot_dir.empty();
  const double root_floats = 3 * whole * (2 + (d.world() > 1 ? 1 : 0) + (shm ? 3 : 0));

  // Buffers: token batches (int32, as many bytes as floats), RoPE tables, the
  // runtime, ZeRO's all-gather staging.
  const double T1 = static_cast<double>(t.seq_len + 1);
  const double tokens = (static_cast<double>(t.grad_accum) + 1) * static_cast<double>(t.batch_size) * T1;
  const double rope = static_cast<double>(m.max_seq_len) *
                      static_cast<double>(m.rope_dim() + (m.dsa() ? m.dsa_index_rope_dim : 0));
  const double runtime = 16.0 * (1 << 20);  // 64 MiB

  MemoryEstimate e;
  e.params = Bytes(params);
  e.grads = Bytes(grads);
  e.optimizer = Bytes(moments);
  e.activations = Bytes(act_floats);
  e.root_only = Bytes(root_floats);
  e.checkpoint = SaturatedSum({Bytes(3 * local), e.root_only});
  e.buffers = Bytes(tokens + rope + runtime + staging);
  e.total = SaturatedSum({e.params, e.grads, e.optimizer, e.activations, e.checkpoint, e.buffers});
  const double blocks = local - embed_head - experts;
  if (embed_head >= blocks && embed_head >= experts) e.param_keys = "model.vocab_size or model.d_model";
  else if (experts >= blocks) e.param_keys = "model.n_routed_experts, model.d_expert or model.n_layers";
  else e.param_keys = "model.n_layers, model.d_model or model.d_ff";
  e.activation_keys = L * a_mean >= head ? "train.batch_size, train.seq_len or model.n_layers"
                                         : "model.vocab_size, train.batch_size or train.seq_len";
  return e;
}

int64_t MemAvailableBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

Status CheckMemoryFits(const MemoryEstimate& e, int64_t ranks_here, int64_t available) {
  const int64_t here = std::max<int64_t>(1, ranks_here);
  const int64_t need = e.HostBytes(here);
  if (available < 0 || need <= available) return Status::Ok();
  // The two parts that need the most, each with the keys that lower it.
  const std::string split = "raise parallel.zero or split the model with parallel.tp/pp/ep";
  const std::string weights = "lower " + e.param_keys + ", or " + split;
  std::vector<std::pair<int64_t, std::string>> parts = {
      {e.params, "params (hint: " + weights + ")"},
      {e.grads, "grads (hint: " + weights + ")"},
      {e.optimizer, "optimizer (hint: " + weights + ")"},
      {e.activations, "activations (hint: lower " + e.activation_keys + "; raising train.grad_accum keeps the batch)"},
      {e.checkpoint, "checkpoint (hint: lower " + e.param_keys + ", or set train.snapshot_dir=\"none\")"},
      {e.buffers, "buffers (hint: lower train.batch_size, train.grad_accum or train.seq_len)"}};
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return Status::Error("needs " + FormatBytes(e.total) + " per rank x " + std::to_string(here) +
                       (here == 1 ? " rank" : " ranks") + " = " + FormatBytes(need) + ", " +
                       FormatBytes(available) + " available (" + e.ToString() + "); largest: " +
                       FormatBytes(parts[0].first) + " " + parts[0].second + ", " + FormatBytes(parts[1].first) +
                       " " + parts[1].second);
}

Status CheckRunMemory(const ModelConfig& m, const TrainConfig& t, comm::Comm* world) {
  const int size = world ? world->size() : 1;
  int here = 1;
  if (size > 1) here = world->SplitShared()->size();
  return CheckMemoryFits(EstimateRankMemory(m, t, size), here, MemAvailableBytes()).With("memory");
}

}  // namespace myriad
