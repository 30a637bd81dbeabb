// The planner's searches: pruned (FindBest), exhaustive (BruteForce) and
// per length bucket (PlanDynamic).
#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>


namespace myriad::plan {
namespace {

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i * i != n) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

bool Better(const StepEstimate& a, const StepEstimate& b) { return a.tokens_per_s > b.tokens_per_s; }

std::string DimsKey(const Layout& l) { return ParallelDims(l).ToString(); }

// Keeps the best result and the best of each other parallel layout.
struct Tracker {
  PlanResult r;
  std::map<std::string, std::pair<Layout, StepEstimate>> per_dims;
  double closest_mem = std::numeric_limits<double>::infinity();
  void Offer(const Layout& l, const StepEstimate& e) {
    if (!e.feasible) {
      if (e.mem.total > 0 && e.mem.total - e.mem.capacity < closest_mem) {
        closest_mem = e.mem.total - e.mem.capacity;
        r.why = l.ToString() + ": " + e.why;
      }
      return;
    }
    if (!r.found || Better(e, r.est)) {
      r.found = true;
      r.layout = l;
      r.est = e;
    }
    auto& slot = per_dims[DimsKey(l)];
    if (slot.second.tokens_per_s < e.tokens_per_s) slot = {l, e};
  }
  PlanResult Finish(int keep) {
    std::vector<std::pair<Layout, StepEstimate>> v;
    for (auto& [k, p] : per_dims)
      if (DimsKey(p.first) != DimsKey(r.layout)) v.push_back(p);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return Better(a.second, b.second); });
    if (static_cast<int>(v.size()) > keep) v.resize(keep);
    r.runners_up = std::move(v);
    if (r.found) r.why.clear();
    else if (r.why.empty()) r.why = "no layout passes the divisibility rules";
    return std::move(r);
  }
};

}  // namespace

Result<std::vector<int64_t>> ParseIntList(const std::string& what, const std::string& text) {
  std::vector<int64_t> vals;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    try {
      size_t used = 0;
      const int64_t x = std::stoll(part, &used);
      if (used != part.size() || x < 1) throw std::invalid_argument(part);
      vals.push_back(x);
    } catch (const std::exception&) {
      return Status::Error(what + "='" + text + "': '" + part + "' is not a positive integer (hint: e.g. \"1,2,4\")");
    }
  }
  if (vals.empty()) return Status::Error(what + " is empty (hint: e.g. \"1,2,4\")");
  return vals;
}

Result<SearchSpace> ReadSearchSpace(ConfigDoc* doc, const SearchSpace& base) {
  SearchSpace s = base;
  auto list = [&](const std::string& key, std::vector<int64_t>* out) -> Status {
    if (!doc->Has(key)) return Status::Ok();
    auto v = ParseIntList(doc->source() + ": " + key, doc->GetString(key, ""));
    if (!v.ok()) return v.status();
    *out = *v;
    return Status::Ok();
  };
  RETURN_IF_ERROR(list("search.micro_batches", &s.micro_batches));
  RETURN_IF_ERROR(list("search.interleave", &s.interleave));
  s.max_tp = doc->GetInt("search.max_tp", s.max_tp);
  s.max_pp = doc->GetInt("search.max_pp", s.max_pp);
  s.max_cp = doc->GetInt("search.max_cp", s.max_cp);
  s.max_ep = doc->GetInt("search.max_ep", s.max_ep);
  s.min_devices = doc->GetInt("search.min_devices", s.min_devices);
  return s;
}

std::vector<int64_t> UsedDeviceCounts(const ClusterDesc& c, const SearchSpace& s) {
  std::vector<int64_t> out;
  const int64_t node = c.devices_per_node();
  const int64_t lo = s.min_devices > 0 ? std::min(s.min_devices, c.devices) : c.devices;
  for (int64_t n = c.devices; n >= lo && n > 0; n -= node) out.push_back(n);
  return out;
}

ClusterDesc UsingDevices(const ClusterDesc& c, int64_t devices) {
  ClusterDesc u = c;
  u.devices = devices;
  if (!u.tiers.empty() && u.tiers.back().size > devices) u.tiers.back().size = devices;
  return u;
}

std::vector<Layout> ParallelLayouts(const JobDesc& job, const ClusterDesc& c, const SearchSpace& s) {
  const ModelConfig& m = job.model;
  const int64_t N = c.devices;
  const int64_t max_tp = s.max_tp > 0 ? s.max_tp : c.devices_per_node();
  const int64_t max_pp = s.max_pp > 0 ? s.max_pp : m.n_layers;
  auto fixed = [](int64_t want, int64_t v) { return want == 0 || want == v; };
  std::vector<Layout> out;
  for (int64_t tp : Divisors(N)) {
    if (tp > max_tp || !fixed(s.tp, tp)) continue;
    for (int64_t cp : Divisors(N / tp)) {
      if ((s.max_cp > 0 && cp > s.max_cp) || !fixed(s.cp, cp)) continue;
      for (int64_t ep : Divisors(N / (tp * cp))) {
        if ((s.max_ep > 0 && ep > s.max_ep) || !fixed(s.ep, ep)) continue;
        for (int64_t pp : Divisors(N / (tp * cp * ep))) {
          if (pp > max_pp || !fixed(s.pp, pp)) continue;
          const int64_t dp = N / (tp * cp * ep * pp);
          if (!fixed(s.dp, dp)) continue;
          Layout l;
          l.dp = static_cast<int>(dp), l.tp = static_cast<int>(tp), l.pp = static_cast<int>(pp);
          l.ep = static_cast<int>(ep), l.cp = static_cast<int>(cp);
          if (CheckLayout(job, c, l).ok()) out.push_back(l);
        }
      }
    }
  }
  return out;
}

namespace {
// fn(c, dims) for every parallel layout of job on every device count the
// search may use; c is the cluster cut to that count.
template <typename Fn>
void ForEachParallelLayout(const JobDesc& job, const ClusterDesc& cluster, const SearchSpace& s, Fn&& fn) {
  for (int64_t used : UsedDeviceCounts(cluster, s)) {
    const ClusterDesc c = UsingDevices(cluster, used);
    for (const Layout& dims : ParallelLayouts(job, c, s)) fn(c, dims);
  }
}
}  // namespace

PlanResult FindBest(const JobDesc& job, const ClusterDesc& cluster, const SearchSpace& s, int keep) {
  Tracker t;
  std::vector<int64_t> mbs = s.micro_batches;
  std::sort(mbs.begin(), mbs.end());
  const int64_t v_min = s.interleave.empty() ? 1 : *std::min_element(s.interleave.begin(), s.interleave.end());
  ForEachParallelLayout(job, cluster, s, [&](const ClusterDesc& c, const Layout& dims) {
    ++t.r.layouts;
    // The least memory this parallel layout can need: the smallest valid
    // micro-batch, no interleaving, the best ZeRO stage and recomputation.
    int64_t mb0 = 0;
    for (int64_t mb : mbs) {
      Layout l = dims;
      l.micro_batch = mb;
      if (CheckLayout(job, c, l).ok()) {
        mb0 = mb;
        break;
      }
    }
    if (mb0 == 0) return;
    double least = std::numeric_limits<double>::infinity();
    for (int z : s.zero_stages)
      for (Recompute rc : s.recompute) {
        Layout l = dims;
        l.micro_batch = mb0, l.zero = z, l.recompute = rc, l.interleave = v_min;
        const StepEstimate e = Estimate(job, c, l);
        ++t.r.evaluated;
        if (e.mem.total > 0) least = std::min(least, e.mem.total);
        if (!e.feasible) t.Offer(l, e);
      }
    if (!(least <= c.device.memory_bytes * c.device.usable_memory)) return;
    for (int z : s.zero_stages)
      for (Recompute rc : s.recompute)
        for (int64_t v : s.interleave)
          for (int64_t mb : mbs) {
            Layout l = dims;
            l.micro_batch = mb, l.zero = z, l.recompute = rc, l.interleave = v;
            if (!CheckLayout(job, c, l).ok()) continue;
            const StepEstimate e = Estimate(job, c, l);
            ++t.r.evaluated;
            t.Offer(l, e);
            if (!e.feasible) break;  // out of memory: a larger micro-batch needs more
          }
  });
  return t.Finish(keep);
}

PlanResult BruteForce(const JobDesc& job, const ClusterDesc& cluster, const SearchSpace& s) {
  Tracker t;
  ForEachParallelLayout(job, cluster, s, [&](const ClusterDesc& c, const Layout& dims) {
    ++t.r.layouts;
    for (int z : s.zero_stages)
      for (Recompute rc : s.recompute)
        for (int64_t v : s.interleave)
          for (int64_t mb : s.micro_batches) {
            Layout l = dims;
            l.micro_batch = mb, l.zero = z, l.recompute = rc, l.interleave = v;
            const StepEstimate e = Estimate(job, c, l);
            ++t.r.evaluated;
            t.Offer(l, e);
          }
  });
  return t.Finish(0);
}

// ---------------------------------------------------------------- dynamic

Result<std::vector<LengthBucket>> ParseBuckets(const std::string& spec) {
  std::vector<LengthBucket> out;
  double sum = 0;
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, ',');) {
    const auto colon = part.find(':');
    LengthBucket b;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      size_t used = 0;
      const std::string len = part.substr(0, colon);
      b.seq_len = std::stoll(len, &used);
      if (used != len.size()) throw std::invalid_argument("length");
      const std::string frac = part.substr(colon + 1);
      b.token_fraction = std::stod(frac, &used);
      if (used != frac.size()) throw std::invalid_argument("fraction");
    } catch (const std::exception&) {
      return Status::Error("length buckets: '" + part + "' is not LENGTH:FRACTION (hint: e.g. 4096:0.7,262144:0.3)");
    }
    if (b.seq_len < 1 || !(b.token_fraction > 0))
      return Status::Error("length buckets: '" + part + "' needs a positive length and fraction");
    sum += b.token_fraction;
    out.push_back(b);
  }
  if (out.empty()) return Status::Error("length buckets: empty (hint: e.g. 4096:0.7,262144:0.3)");
  for (auto& b : out) b.token_fraction /= sum;
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.seq_len < b.seq_len; });
  return out;
}

namespace {

JobDesc BucketJob(const JobDesc& job, int64_t seq_len) {
  JobDesc j = job;
  j.seq_len = seq_len;
  j.model.max_seq_len = std::max(j.model.max_seq_len, seq_len);
  // Tokens per step stay (as near as whole sequences allow).
  j.global_batch_tokens = std::max<int64_t>(1, job.global_batch_tokens / seq_len) * seq_len;
  return j;
}

// The best micro-batch for a fixed layout on one bucket (memory never falls
// as the micro-batch grows, so the search stops at the first that does not fit).
std::pair<int64_t, StepEstimate> BestMicroBatch(const JobDesc& j, const ClusterDesc& c, Layout l,
                                                const std::vector<int64_t>& mbs) {
  std::pair<int64_t, StepEstimate> best{0, {}};
  for (int64_t mb : mbs) {
    l.micro_batch = mb;
    if (!CheckLayout(j, c, l).ok()) continue;
    const StepEstimate e = Estimate(j, c, l);
    if (!e.feasible) break;
    if (best.first == 0 || Better(e, best.second)) best = {mb, e};
  }
  return best;
}

double Hours(const JobDesc& job, const LengthBucket& b, const StepEstimate& e) {
  return job.train_tokens * b.token_fraction / e.tokens_per_s / 3600.0;
}

}  // namespace

DynamicPlan PlanDynamic(const JobDesc& job, const ClusterDesc& c, const SearchSpace& s,
                        const std::vector<LengthBucket>& buckets, int64_t rounds) {
  DynamicPlan p;
  std::vector<int64_t> mbs = s.micro_batches;
  std::sort(mbs.begin(), mbs.end());
  std::vector<JobDesc> jobs;
  for (const auto& b : buckets) jobs.push_back(BucketJob(job, b.seq_len));
  double mfu_hours = 0;  // MFU (of the devices in use) weighted by time
  for (size_t i = 0; i < buckets.size(); ++i) {
    BucketPlan bp;
    bp.bucket = buckets[i];
    bp.dynamic = FindBest(jobs[i], c, s, 0);
    if (!bp.dynamic.found) {
      p.why = "no layout fits sequences of " + std::to_string(buckets[i].seq_len) + " tokens: " + bp.dynamic.why;
      return p;
    }
    bp.dynamic_hours = Hours(jobs[i], buckets[i], bp.dynamic.est);
    p.dynamic_hours += bp.dynamic_hours;
    mfu_hours += bp.dynamic_hours * bp.dynamic.est.mfu;
    p.buckets.push_back(std::move(bp));
  }
  // Re-sharding: every device sends and receives its weights and optimizer
  // state once over the outermost tier, plus a restart of the communicators.
  const ParamCounts pc = CountParams(job.model);
  const double state = pc.total * (job.weight_bytes + job.optimizer_bytes) / static_cast<double>(c.devices);
  const double one_switch = state / c.tiers.back().bandwidth + 30.0;
  std::map<std::string, int> distinct;
  for (const auto& bp : p.buckets) distinct[DimsKey(bp.dynamic.layout)]++;
  p.switches = distinct.size() > 1 ? rounds * static_cast<int64_t>(distinct.size()) : 0;
  p.switch_hours = static_cast<double>(p.switches) * one_switch / 3600.0;
  p.dynamic_hours += p.switch_hours;
  p.dynamic_mfu = mfu_hours / p.dynamic_hours;  // re-sharding time counts as idle

  // Static: one layout for all buckets; it must fit the longest.
  const size_t longest = buckets.size() - 1;
  double best = std::numeric_limits<double>::infinity();
  ForEachParallelLayout(jobs[longest], c, s, [&](const ClusterDesc& cu, const Layout& dims) {
    for (int z : s.zero_stages)
      for (Recompute rc : s.recompute)
        for (int64_t v : s.interleave) {
          Layout l = dims;
          l.zero = z, l.recompute = rc, l.interleave = v;
          double hours = 0;
          bool ok = true;
          // Longest first: it is the one most likely not to fit.
          for (size_t i = buckets.size(); i-- > 0 && ok;) {
            const auto [mb, e] = BestMicroBatch(jobs[i], cu, l, mbs);
            if (mb == 0) ok = false;
            else hours += Hours(jobs[i], buckets[i], e);
            if (hours >= best) ok = false;
          }
          if (!ok || hours >= best) continue;
          best = hours;
          p.static_layout = l;
        }
  });
  if (!std::isfinite(best)) {
    p.why = "no single layout fits every bucket";
    return p;
  }
  p.static_hours = best;
  const ClusterDesc cs = UsingDevices(c, p.static_layout.devices());
  for (size_t i = 0; i < buckets.size(); ++i) {
    auto [mb, e] = BestMicroBatch(jobs[i], cs, p.static_layout, mbs);
    p.buckets[i].static_micro_batch = mb;
    p.buckets[i].static_est = e;
    p.buckets[i].static_hours = Hours(jobs[i], buckets[i], e);
    p.static_mfu += p.buckets[i].static_hours * e.mfu / p.static_hours;
  }
  p.static_layout.micro_batch = 0;
  {
    Layout ll = p.buckets.back().dynamic.layout;
    const ClusterDesc cl = UsingDevices(c, ll.devices());
    for (size_t i = 0; i < buckets.size(); ++i) {
      auto [mb, e] = BestMicroBatch(jobs[i], cl, ll, mbs);
      if (mb == 0) {
        p.longest_layout_hours = 0;
        break;
      }
      p.longest_layout_hours += Hours(jobs[i], buckets[i], e);
    }
  }
  p.found = true;
  return p;
}

}  // namespace myriad::plan
