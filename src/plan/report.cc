// Reports of the planner's results.
#include "plan/report.h"

#include <cstdio>

namespace myriad::plan {
namespace {

std::string F(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string Pct(double part, double whole) { return whole > 0 ? F("%4.1f%%", 100 * part / whole) : "-"; }

}  // namespace

std::string Seconds(double s) {
  if (s >= 7200) return F("%.1f hours", s / 3600);
  if (s >= 120) return F("%.1f min", s / 60);
  if (s >= 1) return F("%.3g s", s);
  if (s >= 1e-3) return F("%.3g ms", s * 1e3);
  return F("%.3g us", s * 1e6);
}

std::string Duration(double hours) {
  if (hours >= 24 * 60) return F("%.2f months", hours / (24 * 30.44));
  if (hours >= 48) return F("%.1f days", hours / 24);
  if (hours >= 1) return F("%.1f hours", hours);
  return F("%.1f minutes", hours * 60);
}

std::string Bytes(double b) {
  if (b >= 1e12) return F("%.2f TB", b / 1e12);
  if (b >= 1e9) return F("%.2f GB", b / 1e9);
  if (b >= 1e6) return F("%.2f MB", b / 1e6);
  return F("%.0f B", b);
}

std::string FormatEstimate(const JobDesc& job, const ClusterDesc& c, const Layout& l, const StepEstimate& e) {
  std::string o;
  o += "layout      " + l.ToString() + "  (" + std::to_string(l.devices()) + " devices, " +
       std::to_string(e.microbatches) + " micro-batches per replica)\n";
  if (!e.feasible && e.mem.total <= 0) return o + "infeasible  " + e.why + "\n";
  const double st = e.step_s;
  o += "step        " + Seconds(st) + "  = compute " + Seconds(e.compute_s) + " (" + Pct(e.compute_s, st) + ")";
  auto part = [&](const char* name, double v) {
    if (v > 0) o += std::string(", ") + name + " " + Seconds(v) + " (" + Pct(v, st) + ")";
  };
  part("bubble", e.bubble_s);
  part("tp", e.tp_s);
  part("cp", e.cp_s);
  part("ep", e.ep_s);
  part("pp", e.pp_s);
  part("dp", e.dp_s);
  part("zero3", e.zero3_s);
  part("optimizer", e.optimizer_s);
  o += "\n";
  o += "throughput  " + F("%.4g", e.tokens_per_s) + " tokens/s, " + F("%.4g", e.tokens_per_s / static_cast<double>(l.devices())) +
       " per device; MFU " + F("%.1f%%", 100 * e.mfu) + " (" +
       F("%.4g", e.mfu * PeakFlops(c.device, job) / 1e12) + " model TFLOP/s per device; " +
       F("%.4g", e.hw_flops_per_step / st / static_cast<double>(l.devices()) / 1e12) + " executed, recompute included)\n";
  const MemoryBreakdown& m = e.mem;
  o += "memory      " + Bytes(m.total) + " of " + Bytes(m.capacity) + " usable: weights " + Bytes(m.weights) +
       ", grads " + Bytes(m.grads) + ", optimizer " + Bytes(m.optimizer) + ", activations " + Bytes(m.activations) +
       (m.logits > 0 ? ", logits " + Bytes(m.logits) : "") + ", buffers " + Bytes(m.buffers) + "\n";
  o += "train       " + F("%.4g", job.train_tokens) + " tokens in " + Duration(job.train_tokens / e.tokens_per_s / 3600) + "\n";
  if (!e.feasible) o += "infeasible  " + e.why + "\n";
  const ServingMemory sv = SmallestServing(job, c);
  if (sv.fits)
    o += "serving     " + std::to_string(sv.devices) + " devices (tp" + std::to_string(sv.tp) + " pp" +
         std::to_string(sv.pp) + "): weights " + Bytes(sv.weights_per_device) + " per device, KV " +
         F("%.4g", sv.kv_bytes_per_token / 1024) + " KiB per token (bf16" +
         (job.model.mla() ? "; GQA at equal width " + F("%.4g", sv.gqa_kv_bytes_per_token / 1024) + " KiB" : "") +
         "): " + F("%.3g", sv.kv_capacity_tokens) +
         " tokens, " + F("%.3g", sv.kv_capacity_tokens / static_cast<double>(job.seq_len)) + " sequences of " +
         std::to_string(job.seq_len) + "\n";
  return o;
}

nlohmann::json EstimateJson(const JobDesc& job, const ClusterDesc& c, const Layout& l, const StepEstimate& e) {
  nlohmann::json j;
  j["layout"] = {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"ep", l.ep}, {"cp", l.cp}, {"micro_batch", l.micro_batch},
                 {"zero", l.zero}, {"recompute", RecomputeName(l.recompute)}, {"interleave", l.interleave}};
  j["feasible"] = e.feasible;
  if (!e.feasible) j["why"] = e.why;
  if (e.mem.total <= 0) return j;  // the layout does not apply: no estimate
  j["step_s"] = e.step_s;
  j["parts_s"] = {{"compute", e.compute_s}, {"bubble", e.bubble_s}, {"tp", e.tp_s}, {"cp", e.cp_s}, {"ep", e.ep_s},
                  {"pp", e.pp_s}, {"dp", e.dp_s}, {"zero3", e.zero3_s}, {"optimizer", e.optimizer_s}};
  j["microbatches"] = e.microbatches;
  j["tokens_per_s"] = e.tokens_per_s;
  j["mfu"] = e.mfu;
  j["model_flops_per_token"] = e.model_flops_per_token;
  j["hw_tflops_per_device"] = e.hw_flops_per_step / e.step_s / static_cast<double>(l.devices()) / 1e12;
  j["memory_bytes"] = {{"total", e.mem.total}, {"capacity", e.mem.capacity}, {"weights", e.mem.weights},
                       {"grads", e.mem.grads}, {"optimizer", e.mem.optimizer}, {"activations", e.mem.activations},
                       {"logits", e.mem.logits}, {"buffers", e.mem.buffers}};
  j["train_hours"] = job.train_tokens / e.tokens_per_s / 3600;
  return j;
}

std::string FormatPlan(const JobDesc& job, const ClusterDesc& c, const PlanResult& r) {
  std::string o = "searched    " + std::to_string(r.layouts) + " parallel layouts, " + std::to_string(r.evaluated) +
                  " estimates\n";
  if (!r.found) return o + "no feasible layout: " + r.why + "\n";
  o += "best:\n" + FormatEstimate(job, UsingDevices(c, r.layout.devices()), r.layout, r.est);
  if (!r.runners_up.empty()) {
    o += "runners-up (best of each other parallel layout):\n";
    for (const auto& [l, e] : r.runners_up)
      o += "  " + l.ToString() + " (" + std::to_string(l.devices()) + " devices)  step " + Seconds(e.step_s) + ", MFU " + F("%.1f%%", 100 * e.mfu) + ", memory " +
           Bytes(e.mem.total) + "\n";
  }
  return o;
}

std::string FormatDynamic(const JobDesc& job, const ClusterDesc& c, const DynamicPlan& p) {
  if (!p.found) return "dynamic plan: " + p.why + "\n";
  std::string st = p.static_layout.ToString();
  if (auto k = st.find(" mb0"); k != std::string::npos) st.erase(k, 4);
  std::string o = "static layout for every bucket: " + st + " (micro-batch per bucket)\n\n";
  o += "  length   tokens  | dynamic layout                                        step      MFU   | static step  MFU\n";
  for (const auto& b : p.buckets) {
    char buf[320];
    std::snprintf(buf, sizeof buf, "  %-7lld %5.1f%%  | %-52s %-9s %5.1f%% | %-9s %5.1f%% (mb%lld)\n",
                  (long long)b.bucket.seq_len, 100 * b.bucket.token_fraction, b.dynamic.layout.ToString().c_str(),
                  Seconds(b.dynamic.est.step_s).c_str(), 100 * b.dynamic.est.mfu, Seconds(b.static_est.step_s).c_str(),
                  100 * b.static_est.mfu, (long long)b.static_micro_batch);
    o += buf;
  }
  o += "\ntime to train " + F("%.4g", job.train_tokens) + " tokens:\n";
  o += "  static   " + Duration(p.static_hours) + "  (MFU " + F("%.1f%%", 100 * p.static_mfu) + ")\n";
  o += "  dynamic  " + Duration(p.dynamic_hours) + "  (MFU " + F("%.1f%%", 100 * p.dynamic_mfu) + ", incl. " +
       std::to_string(p.switches) + " re-shardings, " + Duration(p.switch_hours) + ")\n";
  o += "  speedup  " + F("%.2fx", p.static_hours / p.dynamic_hours) + "\n";
  if (p.longest_layout_hours > 0)
    o += "  (the longest bucket's layout for every bucket: " + Duration(p.longest_layout_hours) + ", " +
         F("%.2fx", p.longest_layout_hours / p.dynamic_hours) + " the dynamic plan's time)\n";
  (void)c;
  return o;
}

nlohmann::json DynamicJson(const JobDesc& job, const ClusterDesc& c, const DynamicPlan& p) {
  nlohmann::json j;
  j["found"] = p.found;
  if (!p.found) {
    j["why"] = p.why;
    return j;
  }
  j["static_hours"] = p.static_hours;
  j["dynamic_hours"] = p.dynamic_hours;
  j["switch_hours"] = p.switch_hours;
  j["switches"] = p.switches;
  j["static_mfu"] = p.static_mfu;
  j["longest_layout_hours"] = p.longest_layout_hours;
  j["dynamic_mfu"] = p.dynamic_mfu;
  for (const auto& b : p.buckets) {
    JobDesc bj = job;
    bj.seq_len = b.bucket.seq_len;
    Layout sl = p.static_layout;
    sl.micro_batch = b.static_micro_batch;
    j["buckets"].push_back({{"seq_len", b.bucket.seq_len},
                            {"token_fraction", b.bucket.token_fraction},
                            {"dynamic", EstimateJson(bj, c, b.dynamic.layout, b.dynamic.est)},
                            {"static", EstimateJson(bj, c, sl, b.static_est)}});
  }
  return j;
}

}  // namespace myriad::plan
