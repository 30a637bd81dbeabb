// Choosing the compute precision of a training run: train.precision is
// "fp32", "bf16" (bf16 GEMM inputs, fp32 accumulation and master weights) or
// "auto", which times a GEMM of the run's shapes both ways on this machine
// and picks bf16 only where the backend has it and it is measured faster.
#pragma once

#include <string>

#include "core/status.h"
#include "model/config.h"
#include "ops/ops.h"

namespace myriad {

struct PrecisionChoice {
  ops::GemmPrecision precision = ops::GemmPrecision::kFp32;
  std::string reason;  // one line for the log
};

Result<PrecisionChoice> ChoosePrecision(const std::string& setting, const ModelConfig& model,
                                        int64_t tokens_per_micro_batch);

}  // namespace myriad
