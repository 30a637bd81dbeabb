// myriad plan --calibrate and --measure-comm (plan_calibrate.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "plan/calibrate.h"
#include "train/train_config.h"

namespace myriad::cli {

struct CalibrateOptions {
  std::string config;                  // a training config (configs/*.toml)
  std::vector<std::string> overrides;  // --set
  std::string layouts = "dp=1;dp=2;dp=2,zero=3;tp=2;pp=2;ep=2;cp=2";  // ';' between layouts
  int64_t steps = 12;                  // training steps per run
  int rounds = 3;                      // runs of every layout, interleaved (medians reported)
  int threads = 1;                     // per rank
  std::string report;                  // JSON report path ("": none)
  std::string work_dir;                // kept when given ("": a temporary one, removed)
};

// The job a training config describes (plan::TrainingJob from its [model]
// and [train]); the doc's keys are read, not finished. The second form loads
// `path` with `overrides` and finishes it.
Result<plan::JobDesc> JobFromTrainDoc(ConfigDoc* doc, const std::string& name, TrainConfig* tc);
Result<plan::JobDesc> JobFromTrainConfig(const std::string& path, const std::vector<std::string>& overrides,
                                         TrainConfig* tc);

// The calibration: kernels, collectives, then each layout predicted and run.
int RunCalibrate(const CalibrateOptions& o);
// One rank of the collective benchmark (under mpirun), and of the kernels
// timed on every rank at once for the training config; rank 0 writes `out`.
int RunMeasureComm(const std::string& out, const std::string& config, const std::vector<std::string>& overrides);

}  // namespace myriad::cli
