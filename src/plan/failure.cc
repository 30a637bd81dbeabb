// Failure simulator for long training runs: spec parsing and validation, the
// event-by-event Monte Carlo, the closed forms and the checkpoint-interval
// sweep (see failure.h for the model).
#include "plan/failure.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>

#include "core/check.h"
#include "core/rng.h"

namespace myriad::plan {

namespace {

constexpr double kHour = 3600.0;
constexpr double kPer1000DaysToPerHour = 1.0 / (1000.0 * 24.0);
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Key(const std::string& prefix, const std::string& k) {
  return prefix.empty() ? k : prefix + "." + k;
}

std::string RateKey(const FailureComponent& c) {
  return c.per_node ? "rate_per_1000_node_days" : "rate_per_1000_device_days";
}

// A uniform double in [0, 1) with 53 random bits (Rng::Uniform has only 24).
double U53(Rng& rng) { return static_cast<double>(rng.NextU64() >> 11) * 0x1.0p-53; }

// Inverse-CDF exponential; 1 - u is in (0, 1], so the log is finite.
double Exponential(Rng& rng, double lambda) {
  return lambda > 0 ? -std::log1p(-U53(rng)) / lambda : kInf;
}

uint64_t SplitMix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The job cut into checkpoint segments: `full` segments of tau compute +
// blocking checkpoint, then a last one of `last` compute with no checkpoint
// (the job is done; the final save is outside the run's exposure).
struct Segments {
  int64_t full = 0;
  double tau = 0, full_len = 0, last = 0;
};

Segments Segment(const FailureSpec& s) {
  Segments g;
  const double work = s.work_hours * kHour, tau = s.ckpt_interval_seconds;
  g.last = work;
  if (tau <= 0 || tau >= work) return g;
  int64_t n = static_cast<int64_t>(std::ceil(work / tau));
  while (n > 1 && static_cast<double>(n - 1) * tau >= work) --n;
  g.full = n - 1;
  g.tau = tau;
  g.full_len = tau + s.ckpt_blocking_seconds;
  g.last = work - static_cast<double>(g.full) * tau;
  return g;
}

double ComponentRate(const FailureSpec& s, const FailureComponent& c) {
  return c.rate_per_hour / kHour * static_cast<double>(c.per_node ? s.nodes() : s.devices);
}

// Rate-weighted mean down time per failure (detect + response + repair when
// there are no spares).
double MeanDownSeconds(const FailureSpec& s) {
  const double lambda = JobFailureRate(s);
  if (lambda <= 0) return 0;
  double d = 0;
  for (const auto& c : s.components) {
    double down = c.detect_seconds + (s.auto_recovery ? 0 : s.manual_response_seconds) +
                  (s.spare_nodes == 0 ? c.repair_seconds : 0);
    d += ComponentRate(s, c) / lambda * down;
  }
  return d;
}

struct Trial {
  double wall = 0, lost = 0, ckpt = 0, restart = 0, detect = 0, response = 0, repair_wait = 0;
  int64_t failures = 0, shortages = 0;
  std::vector<int64_t> by_component;
  bool truncated = false;
};

// One run of the whole job. Draws one exponential per exposed stretch (a run
// of segments, or a recovery), so the cost is O(failures), not O(segments).
Trial RunTrial(const FailureSpec& s, const Segments& g, const std::vector<double>& cum,
               Rng& rng) {
  const double lambda = cum.empty() ? 0 : cum.back();
  Trial tr;
  tr.by_component.assign(s.components.size(), 0);
  // Return times of nodes out for repair (at most spare_nodes of them).
  std::priority_queue<double, std::vector<double>, std::greater<double>> repairs;
  double t = 0;
  int64_t seg = 0;  // completed checkpointed segments

  // Down time after a failure at time t; false when the run is cut off.
  auto fail = [&]() {
    ++tr.failures;
    const double u = U53(rng) * lambda;
    size_t i = 0;
    while (i + 1 < cum.size() && !(u < cum[i])) ++i;
    ++tr.by_component[i];
    const FailureComponent& c = s.components[i];
    t += c.detect_seconds;
    tr.detect += c.detect_seconds;
    if (!s.auto_recovery) {
      t += s.manual_response_seconds;
      tr.response += s.manual_response_seconds;
    }
    if (c.repair_seconds > 0) {  // the node is excluded and goes to repair
      while (!repairs.empty() && repairs.top() <= t) repairs.pop();
      const double own = t + c.repair_seconds;
      if (static_cast<int64_t>(repairs.size()) < s.spare_nodes) {
        repairs.push(own);  // a spare takes its place
      } else {
        ++tr.shortages;
        double back = own;  // the first node back rejoins the job
        if (!repairs.empty() && repairs.top() < own) {
          back = repairs.top();
          repairs.pop();
          repairs.push(own);
        }
        tr.repair_wait += back - t;
        t = back;
      }
    }
    if (tr.failures >= s.max_failures_per_trial) tr.truncated = true;
    return !tr.truncated;
  };

  bool recovering = false;
  while (true) {
    if (recovering) {  // restart + load; a failure here starts it over
      const double r = s.restart_seconds + (seg > 0 ? s.load_seconds : 0);
      const double x = Exponential(rng, lambda);
      if (x < r) {
        t += x;
        tr.restart += x;
        if (!fail()) break;
        continue;
      }
      t += r;
      tr.restart += r;
      recovering = false;
    }
    double x = Exponential(rng, lambda);
    const int64_t left = g.full - seg;
    int64_t k = left;  // whole segments done before the failure
    if (left > 0 && x < static_cast<double>(left) * g.full_len)
      k = std::min(left - 1, static_cast<int64_t>(x / g.full_len));
    t += static_cast<double>(k) * g.full_len;
    tr.ckpt += static_cast<double>(k) * s.ckpt_blocking_seconds;
    seg += k;
    x -= static_cast<double>(k) * g.full_len;
    const double len = seg < g.full ? g.full_len : g.last;
    if (seg < g.full || x < len) {  // fails inside this segment: its work and stall are lost
      x = std::clamp(x, 0.0, len);
      t += x;
      tr.lost += x;
      recovering = true;
      if (!fail()) break;
      continue;
    }
    t += g.last;  // seg == g.full here: the last segment completes
    break;
  }
  tr.wall = t;
  return tr;
}

double Quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (pos - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}

}  // namespace

std::vector<FailureComponent> DefaultFailureComponents() {
  // Rates per 1000 device-days (host: node-days). Check against Llama 3, 54
  // days on 16,384 GPUs (884,736 GPU-days, 110,592 node-days): device 265,
  // host 50, network 49, software 53 = 417 (reported: 419).
  //   name        rate/1000 d  per_node  detect_s  repair_s
  return {
      {"device", 0.30 * kPer1000DaysToPerHour, false, 120, 48 * kHour},   // crash or ECC/Xid
      {"host", 0.45 * kPer1000DaysToPerHour, true, 60, 12 * kHour},       // reimage, PSU, SSD
      {"network", 0.055 * kPer1000DaysToPerHour, false, 600, 4 * kHour},  // hang: 10-min watchdog
      {"software", 0.06 * kPer1000DaysToPerHour, false, 60, 0},           // restart on same nodes
  };
}

Status ValidateFailureSpec(const FailureSpec& s, const std::string& p) {
  auto err = [&](const std::string& k, double v, const std::string& what, const std::string& hint) {
    return Status::Error(Key(p, k) + "=" + Num(v) + " " + what + " (hint: " + hint + ")");
  };
  // Non-negative and finite; `v` is in the key's own unit, for the message.
  auto bad = [](double v) { return !(v >= 0) || !std::isfinite(v); };
  const char* kNonNeg = "must be a number >= 0";
  if (s.devices < 1) return err("devices", s.devices, "must be at least 1", "the job's accelerator count");
  if (s.devices_per_node < 1)
    return err("devices_per_node", s.devices_per_node, "must be at least 1", "8 for a typical server");
  if (s.devices % s.devices_per_node != 0)
    return err("devices", s.devices, "is not a multiple of " + Key(p, "devices_per_node") + "=" +
               Num(s.devices_per_node), "the job uses whole nodes: devices = nodes x devices_per_node");
  if (bad(s.work_hours) || s.work_hours == 0)
    return err("work_hours", s.work_hours, "must be > 0", "hours of training at full speed");
  if (bad(s.ckpt_blocking_seconds))
    return err("ckpt_blocking_seconds", s.ckpt_blocking_seconds, kNonNeg, "the stall per checkpoint");
  if (bad(s.ckpt_interval_seconds))
    return err("ckpt_interval_minutes", s.ckpt_interval_seconds / 60, kNonNeg, "0 = never checkpoint");
  if (s.ckpt_interval_seconds > 0 && s.ckpt_interval_seconds < s.ckpt_blocking_seconds)
    return err("ckpt_interval_minutes", s.ckpt_interval_seconds / 60, "(" + Num(s.ckpt_interval_seconds) +
               " s) is shorter than " + Key(p, "ckpt_blocking_seconds") + "=" + Num(s.ckpt_blocking_seconds),
               "checkpoint less often than each stall lasts; 0 = never");
  if (bad(s.restart_seconds))
    return err("restart_seconds", s.restart_seconds, kNonNeg, "re-launch + init + collective setup");
  if (bad(s.load_seconds)) return err("load_seconds", s.load_seconds, kNonNeg, "time to read a checkpoint");
  if (bad(s.manual_response_seconds))
    return err("manual_response_minutes", s.manual_response_seconds / 60, kNonNeg,
               "time until a person restarts the job");
  if (s.spare_nodes < 0) return err("spare_nodes", s.spare_nodes, kNonNeg, "0 = wait for each repair");
  if (s.trials < 1) return err("trials", s.trials, "must be at least 1", "100-1000 runs give a small stderr");
  if (s.max_failures_per_trial < 1)
    return err("max_failures_per_trial", s.max_failures_per_trial, "must be at least 1",
               "a cap that keeps hopeless configurations from running forever");
  for (const auto& c : s.components) {
    const std::string k = c.name + ".";
    if (bad(c.rate_per_hour))
      return err(k + RateKey(c), c.rate_per_hour / kPer1000DaysToPerHour, kNonNeg,
                 "failures per 1000 " + std::string(c.per_node ? "node" : "device") + "-days; 0 = off");
    if (bad(c.detect_seconds))
      return err(k + "detect_seconds", c.detect_seconds, kNonNeg,
                 "~0 for crashes, the watchdog timeout for hangs");
    if (bad(c.repair_seconds))
      return err(k + "repair_hours", c.repair_seconds / kHour, kNonNeg,
                 "0 = no node is replaced (e.g. software)");
  }
  return Status::Ok();
}

Result<FailureSpec> ParseFailureSpec(ConfigDoc& doc, const std::string& prefix) {
  FailureSpec s;
  auto k = [&](const std::string& key) { return Key(prefix, key); };
  s.devices = doc.GetInt(k("devices"), s.devices);
  s.devices_per_node = doc.GetInt(k("devices_per_node"), s.devices_per_node);
  s.work_hours = doc.GetFloat(k("work_hours"), s.work_hours);
  s.ckpt_interval_seconds = 60 * doc.GetFloat(k("ckpt_interval_minutes"), s.ckpt_interval_seconds / 60);
  s.ckpt_blocking_seconds = doc.GetFloat(k("ckpt_blocking_seconds"), s.ckpt_blocking_seconds);
  s.restart_seconds = doc.GetFloat(k("restart_seconds"), s.restart_seconds);
  s.load_seconds = doc.GetFloat(k("load_seconds"), s.load_seconds);
  s.auto_recovery = doc.GetBool(k("auto_recovery"), s.auto_recovery);
  s.manual_response_seconds = 60 * doc.GetFloat(k("manual_response_minutes"), s.manual_response_seconds / 60);
  s.spare_nodes = doc.GetInt(k("spare_nodes"), s.spare_nodes);
  s.trials = doc.GetInt(k("trials"), s.trials);
  s.seed = static_cast<uint64_t>(doc.GetInt(k("seed"), static_cast<int64_t>(s.seed)));
  s.max_failures_per_trial = doc.GetInt(k("max_failures_per_trial"), s.max_failures_per_trial);
  for (auto& c : s.components) {
    auto ck = [&](const std::string& key) { return k(c.name + "." + key); };
    c.per_node = doc.GetBool(ck("per_node"), c.per_node);
    FailureComponent other = c;
    other.per_node = !c.per_node;
    if (doc.Has(ck(RateKey(other))))
      return Status::Error(doc.source() + ": " + ck(RateKey(other)) + ": " + c.name +
                           " failures are counted per " + (c.per_node ? "node" : "device") +
                           " here (per_node = " + (c.per_node ? "true" : "false") + ") (hint: write " +
                           ck(RateKey(c)) + ", or set " + ck("per_node") + " = " +
                           (c.per_node ? "false" : "true") + ")");
    c.rate_per_hour = kPer1000DaysToPerHour *
                      doc.GetFloat(ck(RateKey(c)), c.rate_per_hour / kPer1000DaysToPerHour);
    c.detect_seconds = doc.GetFloat(ck("detect_seconds"), c.detect_seconds);
    c.repair_seconds = kHour * doc.GetFloat(ck("repair_hours"), c.repair_seconds / kHour);
  }
  RETURN_IF_ERROR(ValidateFailureSpec(s, prefix).With(doc.source()));
  return s;
}

FailureResult SimulateFailures(const FailureSpec& s) {
  Status st = ValidateFailureSpec(s);
  CHECK_MSG(st.ok(), "%s", st.message().c_str());
  const Segments g = Segment(s);
  std::vector<double> cum;
  double total = 0;
  for (const auto& c : s.components) cum.push_back(total += ComponentRate(s, c));

  FailureResult r;
  r.failures_by_component.assign(s.components.size(), 0);
  std::vector<double> walls;
  walls.reserve(static_cast<size_t>(s.trials));
  for (int64_t i = 0; i < s.trials; ++i) {
    Rng rng(SplitMix(s.seed ^ SplitMix(static_cast<uint64_t>(i))));
    Trial tr = RunTrial(s, g, cum, rng);
    walls.push_back(tr.wall);
    r.failures += static_cast<double>(tr.failures);
    for (size_t c = 0; c < tr.by_component.size(); ++c)
      r.failures_by_component[c] += static_cast<double>(tr.by_component[c]);
    r.lost_work_hours += tr.lost;
    r.checkpoint_hours += tr.ckpt;
    r.restart_hours += tr.restart;
    r.detect_hours += tr.detect;
    r.response_hours += tr.response;
    r.repair_wait_hours += tr.repair_wait;
    r.spare_shortages += static_cast<double>(tr.shortages);
    r.truncated_trials += tr.truncated;
  }
  const double n = static_cast<double>(s.trials);
  double sum = 0;
  for (double w : walls) sum += w;
  const double mean = sum / n;
  double ss = 0;
  for (double w : walls) ss += (w - mean) * (w - mean);
  const double se = s.trials > 1 ? std::sqrt(ss / (n - 1) / n) : 0;
  std::sort(walls.begin(), walls.end());
  r.wall_hours = mean / kHour;
  r.wall_hours_stderr = se / kHour;
  r.wall_hours_p50 = Quantile(walls, 0.5) / kHour;
  r.wall_hours_p90 = Quantile(walls, 0.9) / kHour;
  r.ettr = s.work_hours / r.wall_hours;
  r.ettr_stderr = s.work_hours * r.wall_hours_stderr / (r.wall_hours * r.wall_hours);
  r.failures /= n;
  for (double& f : r.failures_by_component) f /= n;
  for (double* h : {&r.lost_work_hours, &r.checkpoint_hours, &r.restart_hours, &r.detect_hours,
                    &r.response_hours, &r.repair_wait_hours})
    *h /= n * kHour;
  r.spare_shortages /= n;
  return r;
}

double JobFailureRate(const FailureSpec& s) {
  double lambda = 0;
  for (const auto& c : s.components) lambda += ComponentRate(s, c);
  return lambda;
}

double JobMtbfSeconds(const FailureSpec& s) {
  const double lambda = JobFailureRate(s);
  return lambda > 0 ? 1 / lambda : kInf;
}

double YoungDalyInterval(double ckpt_cost_s, double mtbf_s) { return std::sqrt(2 * ckpt_cost_s * mtbf_s); }

double DalyInterval(double c, double m) {
  if (c >= 2 * m) return m;
  return std::sqrt(2 * c * m) * (1 + std::sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c;
}

double ExpectedSegmentSeconds(double a, double lambda, double down_s, double recover_s) {
  if (lambda <= 0) return a;
  return std::exp(lambda * recover_s) * (1 / lambda + down_s) * std::expm1(lambda * a);
}

double AnalyticWallSeconds(const FailureSpec& s) {
  const double lambda = JobFailureRate(s), d = MeanDownSeconds(s);
  const Segments g = Segment(s);
  const double r0 = s.restart_seconds, r1 = s.restart_seconds + s.load_seconds;
  if (g.full == 0) return ExpectedSegmentSeconds(g.last, lambda, d, r0);
  // Before the first checkpoint a recovery only re-launches; after, it loads.
  return ExpectedSegmentSeconds(g.full_len, lambda, d, r0) +
         static_cast<double>(g.full - 1) * ExpectedSegmentSeconds(g.full_len, lambda, d, r1) +
         ExpectedSegmentSeconds(g.last, lambda, d, r1);
}

double AnalyticEttr(const FailureSpec& s) { return s.work_hours * kHour / AnalyticWallSeconds(s); }

IntervalSweep BestCheckpointInterval(const FailureSpec& spec, int points, double span) {
  CHECK(points >= 1 && span >= 1);
  IntervalSweep out;
  FailureSpec s = spec;
  const double mtbf = JobMtbfSeconds(s);
  if (!std::isfinite(mtbf)) {
    s.ckpt_interval_seconds = 0;
    out.best_ettr = SimulateFailures(s).ettr;
    return out;
  }
  // A blocking time under 1 s is taken as 1 s to centre the sweep.
  out.young_daly_s = YoungDalyInterval(std::max(s.ckpt_blocking_seconds, 1.0), mtbf);
  for (int i = 0; i < points; ++i) {
    const double e = points == 1 ? 0 : -1 + 2.0 * i / (points - 1);
    const double iv = std::max(out.young_daly_s * std::pow(span, e), s.ckpt_blocking_seconds);
    if (!out.curve.empty() && iv <= out.curve.back().first) continue;
    s.ckpt_interval_seconds = iv;  // same seed each: common random numbers
    out.curve.emplace_back(iv, SimulateFailures(s).ettr);
  }
  size_t b = 0;
  for (size_t i = 1; i < out.curve.size(); ++i)
    if (out.curve[i].second > out.curve[b].second) b = i;
  out.best_interval_s = out.curve[b].first;
  out.best_ettr = out.curve[b].second;
  if (b == 0 || b + 1 == out.curve.size()) return out;
  // Parabola through the best point and its neighbours, in log(interval).
  const double x1 = std::log(out.curve[b].first), y1 = out.curve[b].second;
  const double h0 = std::log(out.curve[b - 1].first) - x1, d0 = out.curve[b - 1].second - y1;
  const double h2 = std::log(out.curve[b + 1].first) - x1, d2 = out.curve[b + 1].second - y1;
  const double det = h0 * h2 * (h0 - h2);
  const double a = (d0 * h2 - d2 * h0) / det, bb = (h0 * h0 * d2 - h2 * h2 * d0) / det;
  if (!(a < 0)) return out;
  const double h = std::clamp(-bb / (2 * a), h0, h2);
  out.best_interval_s = std::exp(x1 + h);
  out.best_ettr = y1 + bb * h + a * h * h;
  return out;
}

}  // namespace myriad::plan
