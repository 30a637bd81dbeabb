// Evaluation of a detector on labelled documents: per-type and micro
// precision, recall, F1 and F2 at the entity level (a predicted span is a
// true positive when it has the gold type and IoU >= min_iou with a gold
// span not matched before; exact-match figures beside them), the decoy
// false-positive rate, character-level over-redaction and speed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "edge/corpus.h"
#include "edge/entity.h"

namespace myriad::edge {

// Spans (code points) over one UTF-8 text.
using Detector = std::function<std::vector<Span>(std::string_view utf8)>;

struct TypeFigures {
  int64_t gold = 0, predicted = 0;
  int64_t tp = 0;        // IoU matches
  int64_t tp_exact = 0;  // same start, end and type
  double precision = 0, recall = 0, f1 = 0, f2 = 0;
  double precision_exact = 0, recall_exact = 0, f1_exact = 0;
};

struct EvalOptions {
  std::vector<EntityType> types;  // only these (gold and predicted); empty: every type
  double min_iou = 0.5;
};

struct EvalReport {
  int64_t docs = 0;
  std::map<EntityType, TypeFigures> per_type;  // every type with gold or predicted spans
  TypeFigures micro;                           // over all of them
  int64_t decoys = 0, decoys_hit = 0;          // decoys overlapped by any predicted span
  double decoy_fp_rate = 0;
  // Characters predicted that lie outside every gold span (of any type), over
  // the characters outside gold spans.
  int64_t chars_outside_gold = 0, over_redacted_chars = 0;
  double over_redaction = 0;
  int64_t bytes = 0;
  double seconds = 0, kb_per_s = 0;  // the detector's time only
};

// Intersection over union of two spans' ranges (0 when disjoint).
double SpanIoU(const Span& a, const Span& b);
// F-beta from precision and recall (0 when both are 0).
double FBeta(double precision, double recall, double beta);

EvalReport EvaluateDetector(const std::vector<LabelledDoc>& docs, const Detector& detect,
                            const EvalOptions& opt = {});
std::string FormatEvalTable(const EvalReport& r);
nlohmann::json EvalReportJson(const EvalReport& r);

}  // namespace myriad::edge
