#include "edge/redact_eval.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace myriad::edge {

namespace {

bool Wanted(const EvalOptions& opt, EntityType t) {
  return opt.types.empty() || std::find(opt.types.begin(), opt.types.end(), t) != opt.types.end();
}

void Finish(TypeFigures* f) {
  auto ratio = [](int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  f->precision = ratio(f->tp, f->predicted);
  f->recall = ratio(f->tp, f->gold);
  f->f1 = FBeta(f->precision, f->recall, 1);
  f->f2 = FBeta(f->precision, f->recall, 2);
  f->precision_exact = ratio(f->tp_exact, f->predicted);
  f->recall_exact = ratio(f->tp_exact, f->gold);
  f->f1_exact = FBeta(f->precision_exact, f->recall_exact, 1);
}

nlohmann::json FiguresJson(const TypeFigures& f) {
  return {{"gold", f.gold},         {"predicted", f.predicted},   {"tp", f.tp},
          {"precision", f.precision}, {"recall", f.recall},       {"f1", f.f1},
          {"f2", f.f2},             {"tp_exact", f.tp_exact},     {"precision_exact", f.precision_exact},
          {"recall_exact", f.recall_exact}, {"f1_exact", f.f1_exact}};
}

}  // namespace

double SpanIoU(const Span& a, const Span& b) {
  const int64_t inter = std::min(a.end, b.end) - std::max(a.start, b.start);
  if (inter <= 0) return 0;
  const int64_t uni = std::max(a.end, b.end) - std::min(a.start, b.start);
  return static_cast<double>(inter) / static_cast<double>(uni);
}

double FBeta(double p, double r, double beta) {
  const double b2 = beta * beta;
  return p + r > 0 ? (1 + b2) * p * r / (b2 * p + r) : 0.0;
}

EvalReport EvaluateDetector(const std::vector<LabelledDoc>& docs, const Detector& detect, const EvalOptions& opt) {
  EvalReport r;
  for (const LabelledDoc& d : docs) {
    ++r.docs;
    r.bytes += static_cast<int64_t>(d.text.size());
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Span> all = detect(d.text);
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<Span> pred, gold;
    for (const Span& s : all)
      if (Wanted(opt, s.type)) pred.push_back(s);
    for (const Span& s : d.spans)
      if (Wanted(opt, s.type)) gold.push_back(s);
    // One-to-one matching: predicted spans by confidence, each to the unmatched
    // gold span of its type with the highest IoU (>= min_iou).
    std::stable_sort(pred.begin(), pred.end(), [](const Span& a, const Span& b) { return a.confidence > b.confidence; });
    std::vector<bool> used(gold.size(), false), used_exact(gold.size(), false);
    for (const Span& p : pred) {
      TypeFigures& f = r.per_type[p.type];
      ++f.predicted;
      int best = -1;
      double best_iou = 0;
      for (size_t g = 0; g < gold.size(); ++g) {
        if (used[g] || gold[g].type != p.type) continue;
        const double iou = SpanIoU(p, gold[g]);
        if (iou >= opt.min_iou && iou > best_iou) best = static_cast<int>(g), best_iou = iou;
      }
      if (best >= 0) used[best] = true, ++f.tp;
      for (size_t g = 0; g < gold.size(); ++g)
        if (!used_exact[g] && gold[g] == p) {
          used_exact[g] = true;
          ++f.tp_exact;
          break;
        }
    }
    for (const Span& g : gold) ++r.per_type[g.type].gold;
    // Decoys and characters.
    for (const Span& dec : d.decoys) {
      ++r.decoys;
      for (const Span& p : pred)
        if (std::min(p.end, dec.end) > std::max(p.start, dec.start)) {
          ++r.decoys_hit;
          break;
        }
    }
    const int64_t n = static_cast<int64_t>(DecodeUtf8(d.text).size());
    std::vector<char> in_gold(n, 0), in_pred(n, 0);
    for (const Span& g : d.spans)
      for (int64_t i = std::max<int64_t>(0, g.start); i < std::min(n, g.end); ++i) in_gold[i] = 1;
    for (const Span& p : pred)
      for (int64_t i = std::max<int64_t>(0, p.start); i < std::min(n, p.end); ++i) in_pred[i] = 1;
    for (int64_t i = 0; i < n; ++i)
      if (!in_gold[i]) {
        ++r.chars_outside_gold;
        r.over_redacted_chars += in_pred[i];
      }
  }
  for (auto& [type, f] : r.per_type) {
    Finish(&f);
    r.micro.gold += f.gold;
    r.micro.predicted += f.predicted;
    r.micro.tp += f.tp;
    r.micro.tp_exact += f.tp_exact;
  }
  Finish(&r.micro);
  r.decoy_fp_rate = r.decoys ? static_cast<double>(r.decoys_hit) / static_cast<double>(r.decoys) : 0.0;
  r.over_redaction =
      r.chars_outside_gold ? static_cast<double>(r.over_redacted_chars) / static_cast<double>(r.chars_outside_gold) : 0.0;
  r.kb_per_s = r.seconds > 0 ? static_cast<double>(r.bytes) / 1024.0 / r.seconds : 0.0;
  return r;
}

std::string FormatEvalTable(const EvalReport& r) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %6s %6s %6s %7s %7s %7s %7s %8s\n", "type", "gold", "pred", "tp", "P", "R",
                "F1", "F2", "F1exact");
  out += line;
  auto row = [&](const char* name, const TypeFigures& f) {
    std::snprintf(line, sizeof line, "%-12s %6lld %6lld %6lld %7.4f %7.4f %7.4f %7.4f %8.4f\n", name,
                  static_cast<long long>(f.gold), static_cast<long long>(f.predicted), static_cast<long long>(f.tp),
                  f.precision, f.recall, f.f1, f.f2, f.f1_exact);
    out += line;
  };
  for (const auto& [type, f] : r.per_type) row(EntityTypeName(type), f);
  row("micro", r.micro);
  std::snprintf(line, sizeof line,
                "docs %lld; decoys hit %lld/%lld (%.4f); over-redaction %lld/%lld chars (%.4f); %.1f KB/s (%lld bytes in %.3fs)\n",
                static_cast<long long>(r.docs), static_cast<long long>(r.decoys_hit), static_cast<long long>(r.decoys),
                r.decoy_fp_rate, static_cast<long long>(r.over_redacted_chars),
                static_cast<long long>(r.chars_outside_gold), r.over_redaction, r.kb_per_s,
                static_cast<long long>(r.bytes), r.seconds);
  out += line;
  return out;
}

nlohmann::json EvalReportJson(const EvalReport& r) {
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [type, f] : r.per_type) types[EntityTypeName(type)] = FiguresJson(f);
  return {{"docs", r.docs},
          {"per_type", types},
          {"micro", FiguresJson(r.micro)},
          {"decoys", r.decoys},
          {"decoys_hit", r.decoys_hit},
          {"decoy_fp_rate", r.decoy_fp_rate},
          {"chars_outside_gold", r.chars_outside_gold},
          {"over_redacted_chars", r.over_redacted_chars},
          {"over_redaction", r.over_redaction},
          {"bytes", r.bytes},
          {"seconds", r.seconds},
          {"kb_per_s", r.kb_per_s}};
}

}  // namespace myriad::edge
