// myriad plan --calibrate and --measure-comm (plan_calibrate.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/calibrate.h"

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

// The calibration: kernels, collectives, then each layout predicted and run.
int RunCalibrate(const CalibrateOptions& o);
// One rank of the collective benchmark (under mpirun), and of the kernels
// timed on every rank at once for the training config; rank 0 writes `out`.
int RunMeasureComm(const std::string& out, const std::string& config, const std::vector<std::string>& overrides);

}  // namespace myriad::cli
