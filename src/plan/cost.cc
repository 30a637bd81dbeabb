// The cost model's terms; docs/planning.md has the derivations.
#include "plan/cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/check.h"

namespace myriad::plan {

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

const char* AlgoName(Algo a) {
  switch (a) {
    case Algo::kNone: return "-";
    case Algo::kRing: return "ring";
    case Algo::kTree: return "tree";
    case Algo::kHierarchical: return "hierarchical";
  }
  return "?";
}

std::string Layout::ToString() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "dp%lld tp%lld pp%lld ep%lld cp%lld mb%lld zero%d rc=%s v%lld", (long long)dp,
                (long long)tp, (long long)pp, (long long)ep, (long long)cp, (long long)micro_batch, zero,
                RecomputeName(recompute), (long long)interleave);
  return buf;
}

Result<Layout> ParseLayout(const std::string& spec) {
  Layout l;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find_first_of(", ", pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    // "key=value", or "key<digits>" as ToString prints it ("dp8", "zero1").
    size_t eq = item.find('=');
    size_t vstart = eq == std::string::npos ? std::string::npos : eq + 1;
    if (eq == std::string::npos) {
      eq = item.find_first_of("0123456789");
      vstart = eq;
    }
    const std::string key = item.substr(0, eq), val = eq == std::string::npos ? "" : item.substr(vstart);
    auto bad = [&](const std::string& why) {
      return Status::Error("layout '" + spec + "': " + item + ": " + why +
                           " (hint: e.g. dp=6,tp=8,pp=64,ep=1,cp=1,mb=1,zero=1,rc=full,v=2)");
    };
    if (eq == std::string::npos || val.empty()) return bad("expected key=value");
    if (key == "rc") {
      if (val == "none") l.recompute = Recompute::kNone;
      else if (val == "selective") l.recompute = Recompute::kSelective;
      else if (val == "full") l.recompute = Recompute::kFull;
      else return bad("rc is none, selective or full");
      continue;
    }
    int64_t v = 0;
    try {
      size_t used = 0;
      v = std::stoll(val, &used);
      if (used != val.size()) throw std::invalid_argument(val);
    } catch (const std::exception&) {
      return bad("not an integer");
    }
    const bool degree = key == "dp" || key == "tp" || key == "pp" || key == "ep" || key == "cp";
    if (degree && (v < 1 || v > (int64_t{1} << 30))) return bad("a degree is an integer from 1 to 2^30");
    if (key == "dp") l.dp = static_cast<int>(v);
    else if (key == "tp") l.tp = static_cast<int>(v);
    else if (key == "pp") l.pp = static_cast<int>(v);
    else if (key == "ep") l.ep = static_cast<int>(v);
    else if (key == "cp") l.cp = static_cast<int>(v);
    else if (key == "mb") l.micro_batch = v;
    else if (key == "zero") l.zero = static_cast<int>(v);
    else if (key == "v") l.interleave = v;
    else return bad("unknown key");
  }
  return l;
}

// ---------------------------------------------------------------- collectives

int64_t GroupSpan::size() const {
  int64_t n = 1;
  for (int64_t l : per_level) n *= l;
  return n;
}

int GroupSpan::outermost() const {
  for (int k = static_cast<int>(per_level.size()) - 1; k >= 0; --k)
    if (per_level[k] > 1) return k;
  return -1;
}

GroupSpan SpanOf(const ClusterDesc& c, const std::vector<std::pair<int64_t, int64_t>>& dims) {
  // Members inside one tier-k block: for each dimension, those of its
  // members whose strides fit in the block (nested dims multiply).
  GroupSpan g;
  int64_t inner = 1;  // members in one block of the level below
  for (const TierDesc& t : c.tiers) {
    int64_t in_block = 1;
    for (auto [stride, size] : dims) {
      if (size <= 1) continue;
      const int64_t fit = stride >= t.size ? 1 : std::min(size, std::max<int64_t>(1, t.size / stride));
      in_block *= fit;
    }
    g.per_level.push_back(std::max<int64_t>(1, in_block / inner));
    inner = std::max(inner, in_block);
  }
  // Whatever does not fit the last tier (a layout larger than the cluster
  // description) is counted at the outermost level.
  int64_t total = 1;
  for (auto [stride, size] : dims) total *= std::max<int64_t>(1, size);
  if (!g.per_level.empty() && g.size() < total) g.per_level.back() *= total / g.size();
  return g;
}

namespace {

// Ring over the slowest tier the group crosses: 2(g-1)/g * n / beta + 2(g-1) alpha
// for an all-reduce (half of that for all-gather / reduce-scatter).
// `eff`: the collective's achieved fraction of a tier's bandwidth.
using EffOf = double TierDesc::*;

double RingSeconds(const ClusterDesc& c, const GroupSpan& g, double bytes, double passes, EffOf eff) {
  const int64_t n = g.size();
  const int k = g.outermost();
  if (k < 0) return 0;
  const TierDesc& t = c.tiers[k];
  return passes * (static_cast<double>(n - 1) / n * bytes / (t.bandwidth * (t.*eff)) + (n - 1) * t.latency);
}

// Double binary tree: every byte crosses each member's link about twice
// (reduce up, broadcast down, pipelined), latency log2(g) per phase.
double TreeSeconds(const ClusterDesc& c, const GroupSpan& g, double bytes) {
  const int64_t n = g.size();
  const int k = g.outermost();
  if (k < 0) return 0;
  const TierDesc& t = c.tiers[k];
  return 2 * bytes / (t.bandwidth * t.allreduce_eff) + 2 * std::ceil(std::log2(static_cast<double>(n))) * t.latency;
}

// Hierarchical: a ring per tier on a shrinking buffer (reduce-scatter in
// the inner tier, the next tier works on 1/l of it, ...).
double HierarchicalSeconds(const ClusterDesc& c, const GroupSpan& g, double bytes, double passes, EffOf eff) {
  double s = 0, n = bytes;
  for (size_t k = 0; k < g.per_level.size(); ++k) {
    const int64_t l = g.per_level[k];
    if (l <= 1) continue;
    const TierDesc& t = c.tiers[k];
    s += passes * (static_cast<double>(l - 1) / l * n / (t.bandwidth * (t.*eff)) + (l - 1) * t.latency);
    n /= static_cast<double>(l);
  }
  return s;
}

double ReductionSeconds(const ClusterDesc& c, const GroupSpan& g, double bytes) {
  if (c.device.reduce_bw <= 0 || g.size() <= 1) return 0;
  const double n = static_cast<double>(g.size());
  return 3 * (n - 1) / n * bytes / c.device.reduce_bw;
}

// The all-reduce's traffic only: the fastest algorithm.
CollCost AllReduceTraffic(const ClusterDesc& c, const GroupSpan& g, double bytes) {
  if (g.size() <= 1 || bytes <= 0) return {};
  CollCost best{RingSeconds(c, g, bytes, 2, &TierDesc::allreduce_eff), Algo::kRing};
  const double tree = TreeSeconds(c, g, bytes);
  if (tree < best.seconds) best = {tree, Algo::kTree};
  int levels = 0;
  for (int64_t l : g.per_level) levels += l > 1;
  if (levels > 1) {
    const double h = HierarchicalSeconds(c, g, bytes, 2, &TierDesc::allreduce_eff);
    if (h < best.seconds) best = {h, Algo::kHierarchical};
  }
  return best;
}

}  // namespace

CollCost AllReduce(const ClusterDesc& c, const GroupSpan& g, double bytes) {
  CollCost r = AllReduceTraffic(c, g, bytes);
  r.seconds += ReductionSeconds(c, g, bytes);
  return r;
}

namespace {
CollCost HalfRing(const ClusterDesc& c, const GroupSpan& g, double bytes, EffOf eff) {
  if (g.size() <= 1 || bytes <= 0) return {};
  CollCost best{RingSeconds(c, g, bytes, 1, eff), Algo::kRing};
  int levels = 0;
  for (int64_t l : g.per_level) levels += l > 1;
  if (levels > 1) {
    const double h = HierarchicalSeconds(c, g, bytes, 1, eff);
    if (h < best.seconds) best = {h, Algo::kHierarchical};
  }
  return best;
}
}  // namespace

CollCost AllGather(const ClusterDesc& c, const GroupSpan& g, double bytes) {
  return HalfRing(c, g, bytes, &TierDesc::allgather_eff);
}

CollCost ReduceScatter(const ClusterDesc& c, const GroupSpan& g, double bytes) {
  CollCost r = HalfRing(c, g, bytes, &TierDesc::allreduce_eff);  // it reduces, like the all-reduce's first half
  r.seconds += ReductionSeconds(c, g, bytes);
  return r;
}

CollCost AllToAll(const ClusterDesc& c, const GroupSpan& g, double bytes, double imbalance) {
  const int64_t n = g.size();
  if (n <= 1 || bytes <= 0) return {};
  // Members reachable inside one block of each level: traffic to the ones
  // in the same level-k block but not the level-(k-1) block uses tier k.
  double worst = 0, inner = 1;
  const int top = g.outermost();
  for (size_t k = 0; k < g.per_level.size(); ++k) {
    const double reach = inner * static_cast<double>(g.per_level[k]);
    const double share = bytes * imbalance * (reach - inner) / static_cast<double>(n);
    worst = std::max(worst, share / (c.tiers[k].bandwidth * c.tiers[k].alltoall_eff));
    inner = reach;
  }
  return {worst + static_cast<double>(n - 1) * c.tiers[top].latency, Algo::kRing};
}

double SendRecv(const ClusterDesc& c, int64_t stride, double bytes) {
  if (bytes <= 0) return 0;
  for (const TierDesc& t : c.tiers)
    if (stride < t.size) return bytes / t.bandwidth + t.latency;
  const TierDesc& t = c.tiers.back();
  return bytes / t.bandwidth + t.latency;
}

// ---------------------------------------------------------------- layers

namespace {

// One GEMM [M,K] x [K,N]: the slower of its FLOPs at the device's GEMM
// efficiency and of moving its three operands once (small or skinny GEMMs
// are memory bound).
double Gemm(const DeviceDesc& d, double M, double N, double K, double elem_bytes) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  const double flops = 2 * M * N * K;
  const double bytes = (M * K + K * N + M * N) * elem_bytes;
  return std::max(flops / (d.peak_flops * d.gemm_efficiency), bytes / (d.memory_bw * d.memory_efficiency)) +
         d.gemm_overhead_s;
}

// One layer's pass on one rank for one micro-batch.
struct LayerCost {
  double gemm_fwd = 0, attn_fwd = 0, elem_fwd = 0;  // seconds
  double flops_fwd = 0, core_flops = 0;               // executed FLOPs (this rank); the attention core's part
  double tp_fwd = 0, ep_fwd = 0, cp_fwd = 0;          // comm seconds of the forward (before overlap)
  double act_none = 0, act_selective = 0, act_input = 0;  // activation bytes kept for the backward
};

struct Ctx {
  const JobDesc& job;
  const ClusterDesc& c;
  const Layout& l;
  const ModelConfig& m;
  double s, tokS;  // sequence length, tokens of this rank's micro-batch (its CP shard)
};

LayerCost LayerOf(const Ctx& x, bool moe, bool indexer) {
  const DeviceDesc& d = x.c.device;
  const ModelConfig& m = x.m;
  const Layout& l = x.l;
  const double ab = x.job.activation_bytes;
  const double tp = static_cast<double>(l.tp), C = static_cast<double>(m.d_model);
  const double hd = static_cast<double>(m.head_dim());
  const double Hl = m.n_heads / tp, Hkvl = m.n_kv_heads / tp;
  const double tok = x.tokS;
  LayerCost r;
  auto gemm = [&](double M, double N, double K) {
    r.gemm_fwd += Gemm(d, M, N, K, ab);
    r.flops_fwd += 2 * M * N * K;
  };
  // Attention: projections, then the causal (or top-k sparse) core.
  if (m.mla()) {
    // MLA (model/flops.h): the compressions whole on every tp rank, the
    // per-head up-projections and o_proj split by heads.
    const double Dqk = static_cast<double>(m.qk_head_dim()), Dv = static_cast<double>(m.v_head_dim);
    const double R = static_cast<double>(m.kv_lora_rank), Qr = static_cast<double>(m.q_lora_rank);
    const double Dn = static_cast<double>(m.qk_nope_head_dim), Dr = static_cast<double>(m.qk_rope_head_dim);
    if (Qr > 0) {
      gemm(tok, Qr, C);
      gemm(tok, Hl * Dqk, Qr);
    } else {
      gemm(tok, Hl * Dqk, C);
    }
    gemm(tok, R + Dr, C);
    gemm(tok, Hl * (Dn + Dv), R);
    gemm(tok, C, Hl * Dv);
  } else {
    gemm(tok, (Hl + 2 * Hkvl) * hd, C);
    gemm(tok, C, Hl * hd);
  }
  const double k = m.dsa() ? static_cast<double>(m.dsa_topk) : x.s;
  const double pairs = CausalPairs(x.s, k) / static_cast<double>(l.cp) * l.micro_batch;
  // q.k and p.v per pair and head (model/flops.h's count).
  double core = 2 * pairs * Hl * static_cast<double>(m.qk_head_dim() + m.v_dim());
  if (indexer) {
    const double Hi = static_cast<double>(m.dsa_index_heads), Di = static_cast<double>(m.dsa_index_dim);
    gemm(tok, Hi * Di + Di + Hi, C);
    // Scores of every causal key (model/flops.h: 2 * Hi * (Di + 1) per pair).
    core += 2 * CausalPairs(x.s, x.s) / static_cast<double>(l.cp) * l.micro_batch * Hi * (Di + 1);
  }
  r.attn_fwd = core / (d.peak_flops * d.attention_efficiency);
  r.flops_fwd += core;
  r.core_flops = core;
  // FFN: dense, or router + routed experts (the busiest rank's tokens) + shared.
  double ffn_width = 0;
  if (!moe) {
    const double F = m.d_ff / tp;
    gemm(tok, 2 * F, C);
    gemm(tok, C, F);
    ffn_width = F;
  } else {
    const double E = static_cast<double>(m.n_routed_experts), Fe = m.d_expert / tp;
    const double local_experts = E / static_cast<double>(l.ep);
    const double per_expert = tok * m.top_k * static_cast<double>(l.ep) / E * x.job.moe_imbalance;
    gemm(tok, E, C);
    for (int i = 0; i < 2; ++i) {  // gate+up, then down, for each local expert
      const double t = i == 0 ? Gemm(d, per_expert, 2 * Fe, C, ab) : Gemm(d, per_expert, C, Fe, ab);
      r.gemm_fwd += t * local_experts;
      r.flops_fwd += 2 * per_expert * (i == 0 ? 2 * Fe * C : C * Fe) * local_experts;
    }
    const double SF = static_cast<double>(m.n_shared_experts * m.d_expert) / tp;
    if (SF > 0) {
      gemm(tok, 2 * SF, C);
      gemm(tok, C, SF);
    }
    ffn_width = m.top_k * Fe * x.job.moe_imbalance + SF;
  }
  // Element-wise passes (norms, residuals, RoPE, the FFN activation, the
  // experts' permutation copies), each a read and a write.
  double elems = 12 * tok * C / tp + 2 * tok * (Hl + Hkvl) * hd + 3 * tok * ffn_width;
  if (moe) elems += 4 * tok * m.top_k * C / tp;
  r.elem_fwd = elems * ab / (d.memory_bw * d.memory_efficiency) + d.kernel_overhead_s;

  // Communication of the forward. TP with sequence parallelism: an
  // all-gather and a reduce-scatter around attention and around the FFN.
  if (l.tp > 1) {
    const GroupSpan g = SpanOf(x.c, {{1, l.tp}});
    r.tp_fwd = 2 * AllGather(x.c, g, tok * C * ab).seconds + 2 * ReduceScatter(x.c, g, tok * C * ab).seconds;
  }
  if (moe && l.ep > 1) {  // dispatch and combine of this rank's tokens
    const GroupSpan g = SpanOf(x.c, {{l.tp * l.cp, l.ep}});
    r.ep_fwd = 2 * AllToAll(x.c, g, tok / tp * m.top_k * C * ab, x.job.moe_imbalance).seconds;
  }
  if (l.cp > 1) {  // ring attention: the other cp-1 shards' keys and values pass by
    double kv = tok * 2 * Hkvl * hd * ab;
    if (indexer) kv += tok * m.dsa_index_dim * ab;
    r.cp_fwd = static_cast<double>(l.cp - 1) * SendRecv(x.c, l.tp, kv);
  }

  // Activations kept for the backward (bytes): the layer input and norm
  // outputs (sequence-parallel: /tp), q, k, v and the attention output, the
  // FFN's inputs and intermediates; indexer selections as int32.
  const double attn_keep = tok * (2 * C / tp + (2 * Hl + 2 * Hkvl) * hd) * ab;
  double ffn_keep, ffn_recomputable;
  if (!moe) {
    ffn_keep = tok * (2 * C / tp + 3 * ffn_width) * ab;
    ffn_recomputable = tok * (C / tp + ffn_width) * ab;  // norm output, activation output
  } else {
    ffn_keep = tok * (2 * C / tp + 2 * m.top_k * C / tp + 3 * ffn_width) * ab + tok * m.n_routed_experts * 4;
    ffn_recomputable = tok * (C / tp + ffn_width) * ab;
  }
  double sel = 0;
  if (indexer && k < x.s) sel = tok * k * 4;
  r.act_none = attn_keep + ffn_keep + sel;
  r.act_selective = r.act_none - ffn_recomputable - tok * C / tp * ab;
  r.act_input = tok * C / tp * ab + sel;
  return r;
}

}  // namespace

ServingMemory EstimateServing(const JobDesc& job, const ClusterDesc& c, int64_t devices, double kv_bytes) {
  const ModelConfig& m = job.model;
  ServingMemory s;
  s.devices = devices;
  s.tp = std::min(devices, c.devices_per_node());
  while (s.tp > 1 && (m.n_kv_heads % s.tp || m.n_heads % s.tp)) s.tp /= 2;  // tp splits whole kv heads
  s.pp = std::max<int64_t>(1, devices / s.tp);
  const ParamCounts pc = CountParams(m);
  // Inference keeps one copy of the weights (no optimizer state), split tp x pp.
  s.weights_per_device = pc.total * job.weight_bytes / static_cast<double>(s.tp * s.pp);
  const double layers = static_cast<double>(m.n_layers + m.mtp_depth) / static_cast<double>(s.pp);
  // Indexer keys (DSA), one per sharing group, whole on every tp rank.
  const double indexer = static_cast<double>(m.dsa_indexer_layers()) / static_cast<double>(s.pp) *
                         static_cast<double>(m.dsa_index_dim) * kv_bytes;
  s.kv_bytes_per_token = layers * KvValuesPerTokenLayer(m, s.tp) * kv_bytes + indexer;
  s.gqa_kv_bytes_per_token = layers * KvValuesPerTokenLayer(GqaAtEqualWidth(m), s.tp) * kv_bytes + indexer;
  const double free = c.device.memory_bytes * c.device.usable_memory - s.weights_per_device;
  s.fits = free > 0;
  s.kv_capacity_tokens = s.fits ? free / s.kv_bytes_per_token : 0;
  return s;
}

ServingMemory SmallestServing(const JobDesc& job, const ClusterDesc& c, double kv_fraction, double kv_bytes) {
  ServingMemory s;
  for (int64_t n = 1; n <= c.devices; n *= 2) {
    s = EstimateServing(job, c, n, kv_bytes);
    if (s.fits && s.kv_capacity_tokens * s.kv_bytes_per_token >= kv_fraction * c.device.memory_bytes * c.device.usable_memory)
      return s;
  }
  return s;
}

double MegatronFlopsPerIteration(double B, double s, double l, double h, double V) {
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

Status CheckLayout(const JobDesc& job, const ClusterDesc& c, const Layout& l) {
  auto err = [&](const std::string& s) { return Status::Error(l.ToString() + ": " + s); };
  if (l.micro_batch < 1) return err("the micro-batch must be >= 1");
  if (l.zero < 0 || l.zero > 3) return err("zero stage must be 0-3");
  if (l.devices() != c.devices)
    return err("dp*tp*pp*ep*cp = " + std::to_string(l.devices()) + " but the cluster has " + std::to_string(c.devices));
  // A plan for Myriad's trainer uses only what it implements: its pipeline
  // is plain 1F1B and it keeps every activation (no recomputation), so a
  // layout may not win through either.
  if (job.myriad_limits && l.recompute != Recompute::kNone)
    return err(std::string("rc=") + RecomputeName(l.recompute) +
               ": Myriad's trainer does not recompute activations (hint: rc=none, more pp, tp or cp, or "
               "job.myriad_limits = false to plan for an engine that does)");
  if (job.myriad_limits && l.interleave > 1)
    return err("v=" + std::to_string(l.interleave) +
               ": Myriad's pipeline is plain 1F1B (hint: v=1, or job.myriad_limits = false to plan for an engine "
               "that interleaves)");
  if (job.seq_len < 1 || job.global_batch_tokens % job.seq_len)
    return err("global_batch_tokens=" + std::to_string(job.global_batch_tokens) + " is not divisible by seq_len=" +
               std::to_string(job.seq_len));
  // The degrees against the model and the batch: training's own validator.
  // A micro-batch of mb sequences is S/mb pipeline micro-batches per replica
  // (Myriad's parallel.microbatches), once mb divides the S sequences.
  LayoutBatch b;
  b.seq_len = job.seq_len;
  b.sequences = job.sequences();
  b.interleave = l.interleave;
  b.seq_len_key = "seq_len";
  b.sequences_key = "sequences per step";
  b.microbatches_key = "micro-batches";
  b.dims_prefix = "";
  b.myriad_limits = job.myriad_limits;
  const int64_t data = static_cast<int64_t>(l.dp) * l.ep;
  if (data >= 1 && b.sequences % data == 0) {
    const int64_t per_replica = b.sequences / data;
    if (per_replica % l.micro_batch)
      return err("sequences per replica=" + std::to_string(per_replica) + " is not divisible by micro_batch=" +
                 std::to_string(l.micro_batch));
    b.microbatches = per_replica / l.micro_batch;
  }
  const Status st = l.Validate(0, job.model, b);
  return st.ok() ? st : err(st.message());
}

std::vector<int64_t> BalanceStages(const std::vector<double>& t, double first_extra, double last_extra, int64_t P) {
  const int64_t L = static_cast<int64_t>(t.size());
  CHECK(P >= 1 && P <= L);
  // Greedy from the last stage back: the fewest stages whose times stay
  // within T; returns their sizes (last stage first), empty if T is too small.
  auto pack = [&](double T) {
    std::vector<int64_t> sizes;
    double cur = last_extra;
    int64_t n = 0;
    for (int64_t i = L - 1; i >= 0; --i) {
      const double extra = i == 0 ? first_extra : 0;
      if (n > 0 && cur + t[i] + extra > T) {
        sizes.push_back(n);
        cur = 0, n = 0;
      }
      cur += t[i] + extra;
      ++n;
      if (cur > T) return std::vector<int64_t>{};
    }
    sizes.push_back(n);
    return sizes;
  };
  double lo = 0, hi = first_extra + last_extra;
  for (double x : t) hi += x;
  std::vector<int64_t> best = pack(hi);
  for (int it = 0; it < 60 && hi - lo > 1e-9 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    std::vector<int64_t> s = pack(mid);
    if (!s.empty() && static_cast<int64_t>(s.size()) <= P) {
      hi = mid;
      best = std::move(s);
    } else {
      lo = mid;
    }
  }
  std::reverse(best.begin(), best.end());
  // Fewer stages than P: split the largest (never raises the maximum).
  while (static_cast<int64_t>(best.size()) < P) {
    auto it = std::max_element(best.begin(), best.end());
    const int64_t n = *it, keep = n / 2;
    *it = n - keep;
    best.insert(it, keep);
  }
  return best;
}

StepEstimate Estimate(const JobDesc& job, const ClusterDesc& cluster, const Layout& l) {
  StepEstimate e;
  // The device at the job's precision.
  ClusterDesc c = cluster;
  c.device.peak_flops = PeakFlops(cluster.device, job);
  if (!(c.device.peak_flops > 0)) {
    e.why = "the cluster gives no " + job.precision + " peak (hint: cluster.device.peak_tflops_" + job.precision + ")";
    return e;
  }
  const Status ok = CheckLayout(job, c, l);
  if (!ok.ok()) {
    e.why = ok.message();
    return e;
  }
  const ModelConfig& m = job.model;
  const DeviceDesc& d = c.device;
  const Ctx x{job, c, l, m, static_cast<double>(job.seq_len),
              static_cast<double>(l.micro_batch * job.seq_len) / static_cast<double>(l.cp)};
  const int64_t mb_count = job.sequences() / (l.dp * l.ep * l.micro_batch);
  e.microbatches = mb_count;
  const double ab = job.activation_bytes, tp = static_cast<double>(l.tp), C = static_cast<double>(m.d_model);

  // The four kinds of layer: dense or MoE FFN, with or without an indexer.
  LayerCost kinds[4];
  for (int i = 0; i < 4; ++i) kinds[i] = LayerOf(x, i >= 2, i % 2 == 1);
  const int64_t L = m.n_layers, P = l.pp;
  const double rc_fwd = l.recompute == Recompute::kFull ? 1.0 : 0.0;
  // A layer's time per micro-batch: forward, backward (and recompute), and
  // its exposed communication. TP: the same collectives again in the
  // backward (and in a full recompute); EP: dispatch and combine again; CP:
  // twice the bytes (keys/values and their gradients), hidden behind the core.
  auto layer_time = [&](const LayerCost& lc, double* f, double* b, double* tps, double* eps, double* cps) {
    *f = lc.gemm_fwd + lc.attn_fwd + lc.elem_fwd;
    *b = 2 * lc.gemm_fwd + 2.5 * lc.attn_fwd + 2 * lc.elem_fwd + rc_fwd * *f;
    if (l.recompute == Recompute::kSelective) *b += lc.attn_fwd + lc.elem_fwd;
    *tps = lc.tp_fwd * (2 + rc_fwd);
    *eps = lc.ep_fwd * (2 + rc_fwd);
    // Overlapped communication (job.overlap_*: GEMMs split around the TP
    // collectives; expert all-to-alls behind another micro-batch's compute)
    // hides behind the layer's compute, a tenth always exposed.
    if (job.overlap_tp_comm) *tps = std::max(0.1 * *tps, *tps - (*f + *b));
    if (job.overlap_ep_comm) *eps = std::max(0.1 * *eps, *eps - (*f + *b));
    *cps = d.comm_on_cores ? lc.cp_fwd * (3 + rc_fwd)
                           : std::max(0.0, lc.cp_fwd - lc.attn_fwd) * (1 + rc_fwd) +
                                 std::max(0.0, 2 * lc.cp_fwd - 2.5 * lc.attn_fwd);
    return *f + *b + *tps + *eps + *cps;
  };
  auto kind_of = [&](int64_t li) { return (m.is_moe_layer(li) ? 2 : 0) + (m.dsa_indexer_layer(li) ? 1 : 0); };
  // The last stage's extra work: final norm, head and loss; the MTP modules
  // (a block, a projection and the head each).
  const double V = static_cast<double>(m.vocab_size);
  const double head = Gemm(d, x.tokS, V / tp, C, ab);
  const double loss_s = x.tokS * V / tp * 3 * 4 / (d.memory_bw * d.memory_efficiency);
  // With context parallelism an engine may run the MTP modules on whole
  // sequences on every cp rank (job.mtp_whole_sequences; Myriad does).
  const bool mtp_whole = job.mtp_whole_sequences && l.cp > 1;
  Layout lm = l;
  if (mtp_whole) lm.cp = 1;
  const Ctx xm{job, c, lm, m, x.s, mtp_whole ? x.tokS * static_cast<double>(l.cp) : x.tokS};
  const LayerCost mtp_kind = LayerOf(xm, m.mtp_block_is_moe(), false);
  const double proj = Gemm(d, xm.tokS, C, 2 * C, ab) + Gemm(d, xm.tokS, V / tp, C, ab);
  double last_extra = 3 * head + 2 * loss_s;
  {
    double f, b, t1, t2, t3;
    const double block = layer_time(mtp_kind, &f, &b, &t1, &t2, &t3);
    last_extra += static_cast<double>(m.mtp_depth) * (block + 3 * proj);
  }
  // Stages: layers balanced so that no stage's time exceeds what it must
  // (job.balance_stages, Myriad's parallel.pp_layers), or as even as possible.
  std::vector<int64_t> sizes;
  if (job.balance_stages && P > 1) {
    std::vector<double> t(L);
    for (int64_t li = 0; li < L; ++li) {
      double f, b, t1, t2, t3;
      t[li] = layer_time(kinds[kind_of(li)], &f, &b, &t1, &t2, &t3);
    }
    sizes = BalanceStages(t, 0.0, last_extra, P);
  } else {
    for (int64_t st = 0; st < P; ++st) sizes.push_back(L / P + (st < L % P ? 1 : 0));
  }
  double stage_max = 0, stage_sum = 0, stage_bwd_max = 0, hw_flops = 0, mem_max = 0;
  MemoryBreakdown worst;
  const ParamCounts pc = CountParams(m);
  const int64_t D_dense = l.dp * l.ep * l.cp, D_expert = l.dp * l.cp;
  double tp_total = 0, ep_total = 0, cp_total = 0, pp_total = 0, dp_total = 0, z3_total = 0, opt_total = 0;
  for (int64_t st = 0, begin = 0; st < P; ++st) {
    const int64_t n = sizes[st];
    const int64_t end = begin + n;
    double fwd = 0, bwd = 0, tp_s = 0, ep_s = 0, cp_s = 0, flops = 0, act = 0, act_work = 0;
    double dense_params = 0, expert_params = 0;
    auto add_layer = [&](const LayerCost& lc) {
      double f, b, t1, t2, t3;
      layer_time(lc, &f, &b, &t1, &t2, &t3);
      fwd += f, bwd += b, tp_s += t1, ep_s += t2, cp_s += t3;
      flops += lc.flops_fwd * (3 + rc_fwd) + (l.recompute == Recompute::kSelective ? lc.core_flops : 0);
      const double keep = l.recompute == Recompute::kNone ? lc.act_none
                          : l.recompute == Recompute::kSelective ? lc.act_selective : lc.act_input;
      act += keep;
      act_work = std::max(act_work, lc.act_none);
    };
    for (int64_t li = begin; li < end; ++li) {
      const bool moe = m.is_moe_layer(li);
      add_layer(kinds[kind_of(li)]);
      dense_params += pc.dense_per_layer + (moe ? pc.ffn_moe_shared : pc.ffn_dense);
      if (moe) expert_params += pc.expert * static_cast<double>(m.n_routed_experts);
    }
    const bool first = st == 0, last = st == P - 1;
    if (first) dense_params += pc.embedding;
    double logits = 0;
    if (last) {
      fwd += head + loss_s;
      bwd += 2 * head + loss_s;
      flops += 3 * 2 * x.tokS * V / tp * C;
      for (int64_t j = 0; j < m.mtp_depth; ++j) {
        const bool moe = m.mtp_block_is_moe();
        add_layer(mtp_kind);
        fwd += proj;
        bwd += 2 * proj;
        flops += 3 * 2 * xm.tokS * (C * 2 * C + V / tp * C);
        dense_params += pc.dense_per_layer + 3 * C + 2 * C * C + (moe ? pc.ffn_moe_shared : pc.ffn_dense);
        if (moe) expert_params += pc.expert * static_cast<double>(m.n_routed_experts);
      }
      dense_params += pc.head;
      if (m.tie_embeddings && P > 1) dense_params += pc.embedding;  // the head's copy of the embedding
      logits = x.tokS * V / tp * 8;  // fp32 logits and their gradient
    }
    // Per rank: TP splits the matrices (norms too, as an approximation),
    // EP the routed experts.
    dense_params /= tp;
    expert_params /= tp * static_cast<double>(l.ep);
    const double local = dense_params + expert_params;

    // Pipeline p2p: the boundary activation (sequence-parallel shard) out
    // and its gradient back, per micro-batch and model chunk.
    double pp_s = 0;
    if (P > 1) pp_s = 2 * static_cast<double>(l.interleave) * SendRecv(c, l.tp * l.cp * l.ep * l.dp, x.tokS * C / tp * ab);

    // Memory.
    MemoryBreakdown mem;
    const double Dd = static_cast<double>(D_dense), De = static_cast<double>(D_expert);
    auto shard = [&](double params, double D, double bytes, bool sharded) { return params * bytes / (sharded ? D : 1.0); };
    mem.weights = shard(dense_params, Dd, job.weight_bytes, l.zero >= 3) + shard(expert_params, De, job.weight_bytes, l.zero >= 3);
    // The engine's ZeRO (train/parallel/zero.h): every stage keeps the whole
    // gradient, which the micro-batches accumulate into and which is reduced
    // once, on the last; from stage 2 the owned shard it is reduce-scattered
    // into and the padded send copy come on top (train/memory_estimate.h).
    const double whole_grads = (dense_params + expert_params) * job.grad_bytes;
    const double grad_shard =
        shard(dense_params, Dd, job.grad_bytes, true) + shard(expert_params, De, job.grad_bytes, true);
    mem.grads = whole_grads + (l.zero >= 2 ? grad_shard + whole_grads : 0);
    mem.optimizer = shard(dense_params, Dd, job.optimizer_bytes, l.zero >= 1) + shard(expert_params, De, job.optimizer_bytes, l.zero >= 1);
    // 1F1B: stage st holds min(m, P - st) micro-batches in flight
    // (interleaving adds (P-1)/(P v) more at the first stage).
    double inflight = static_cast<double>(std::min<int64_t>(mb_count, P - st));
    if (l.interleave > 1) inflight *= 1 + static_cast<double>(P - 1) / static_cast<double>(P * l.interleave);
    // Full recomputation rebuilds one layer's whole working set at a time.
    mem.activations = act * inflight + (l.recompute == Recompute::kFull ? act_work : 0);
    mem.logits = logits;
    const double layer_params = n > 0 ? local / static_cast<double>(n) : 0;
    // ZeRO-3's gathered and prefetched layers; every stage's all-gather
    // stages one segment (at most a layer) at a time.
    mem.buffers = 2 * x.tokS * C * ab + (l.zero >= 3 ? 2 * layer_params * job.weight_bytes : 0) +
                  (l.zero >= 1 ? layer_params * job.weight_bytes : 0);
    mem.total = mem.weights + mem.grads + mem.optimizer + mem.activations + mem.logits + mem.buffers;
    mem.capacity = d.memory_bytes * d.usable_memory;
    if (mem.total > mem_max) {
      mem_max = mem.total;
      worst = mem;
    }

    // Data parallel: gradients reduced over each parameter's replicas, as
    // the engine does it: ZeRO 0 all-reduces; ZeRO 1 all-reduces too, then
    // all-gathers the updated weights; ZeRO 2 reduce-scatters, then
    // all-gathers; ZeRO 3 reduce-scatters (its weights are gathered per
    // micro-batch, below).
    const GroupSpan gd = SpanOf(c, {{l.tp, l.cp * l.ep * l.dp}});
    const GroupSpan ge = SpanOf(c, {{l.tp, l.cp}, {l.tp * l.cp * l.ep, l.dp}});
    double dp_s = 0, z3 = 0;
    auto reduce = [&](const GroupSpan& g, double params) {
      const double gather = l.zero == 1 || l.zero == 2 ? AllGather(c, g, params * job.weight_bytes).seconds : 0;
      if (l.zero <= 1) return AllReduce(c, g, params * job.grad_bytes).seconds + gather;
      return ReduceScatter(c, g, params * job.grad_bytes).seconds + gather;
    };
    dp_s = reduce(gd, dense_params) + reduce(ge, expert_params);
    if (l.zero >= 3) {
      // Weights gathered before each micro-batch's forward and backward
      // (into fresh pages when the engine returns them to the OS after),
      // prefetched behind the previous layer's compute or waited for.
      double ag = AllGather(c, gd, dense_params * job.weight_bytes).seconds +
                  AllGather(c, ge, expert_params * job.weight_bytes).seconds;
      if (job.zero3_release_pages && d.page_touch_bw > 0) ag += local * job.weight_bytes / d.page_touch_bw;
      z3 = static_cast<double>(mb_count) *
           (job.zero3_prefetch ? std::max(0.0, ag - fwd) + std::max(0.0, ag - bwd) : 2 * ag);
    }
    // Optimizer: stream the shard's master weights, moments, gradients, weights.
    const double shard_params = l.zero >= 1 ? dense_params / Dd + expert_params / De : local;
    const double opt = shard_params * (2 * job.optimizer_bytes + job.grad_bytes + 2 * job.weight_bytes) /
                       (d.memory_bw * d.memory_efficiency);

    const double per_mb = fwd + bwd + tp_s + ep_s + cp_s + pp_s;
    stage_sum += per_mb;
    if (per_mb > stage_max) {
      stage_max = per_mb;
      stage_bwd_max = bwd;
      tp_total = tp_s, ep_total = ep_s, cp_total = cp_s, pp_total = pp_s;
    }
    dp_total = std::max(dp_total, dp_s);
    z3_total = std::max(z3_total, z3);
    opt_total = std::max(opt_total, opt);
    hw_flops += flops * static_cast<double>(mb_count);
    begin = end;
  }
  const double mbs = static_cast<double>(mb_count);
  e.compute_s = mbs * (stage_max - tp_total - ep_total - cp_total - pp_total);
  e.tp_s = mbs * tp_total, e.ep_s = mbs * ep_total, e.cp_s = mbs * cp_total, e.pp_s = mbs * pp_total;
  // 1F1B fills and drains through the other stages: (sum - max) of the
  // stage times ((P-1) stage times when balanced), over v with interleaving.
  e.bubble_s = P > 1 ? (stage_sum - stage_max) / static_cast<double>(l.interleave) : 0;
  // Gradient reduction overlaps the last micro-batch's backward (bucketed;
  // the last bucket, an eighth, is always exposed).
  // (Ranks whose collectives run on their own compute cores hide nothing.)
  e.dp_s = d.comm_on_cores ? dp_total
                           : std::max(dp_total - (job.overlap_grad_reduce ? stage_bwd_max : 0), dp_total / 8);
  e.zero3_s = z3_total;
  e.optimizer_s = opt_total;
  e.step_s = e.compute_s + e.tp_s + e.ep_s + e.cp_s + e.pp_s + e.bubble_s + e.dp_s + e.zero3_s + e.optimizer_s;
  e.mem = worst;
  const double tokens = static_cast<double>(job.global_batch_tokens);
  e.tokens_per_s = tokens / e.step_s;
  e.model_flops_per_token = TrainFlopsPerToken(m, job.seq_len);
  e.mfu = e.model_flops_per_token * tokens / (e.step_s * static_cast<double>(c.devices) * d.peak_flops);
  // hw_flops counted one pipeline (one dp*ep*cp replica's stages, each
  // tp-sharded): scale to the whole cluster.
  e.hw_flops_per_step = hw_flops * static_cast<double>(l.dp * l.ep * l.cp * l.tp);
  if (worst.total > worst.capacity) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "needs %.1f GB per device, %.1f GB usable", worst.total / 1e9, worst.capacity / 1e9);
    e.why = buf;
    return e;
  }
  e.feasible = true;
  return e;
}

}  // namespace myriad::plan
