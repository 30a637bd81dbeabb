// Text and JSON reports of estimates and plans (what `myriad plan` prints).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "plan/planner.h"

namespace myriad::plan {

// Human units: "1.23 s", "45.6 ms"; "2.1 days"; "12.3 GB".
std::string Seconds(double s);
std::string Duration(double hours);
std::string Bytes(double b);

// One estimate: time breakdown, memory breakdown, throughput, MFU, time to
// train `job.train_tokens`.
std::string FormatEstimate(const JobDesc& job, const ClusterDesc& c, const Layout& l, const StepEstimate& e);
nlohmann::json EstimateJson(const JobDesc& job, const ClusterDesc& c, const Layout& l, const StepEstimate& e);

std::string FormatPlan(const JobDesc& job, const ClusterDesc& c, const PlanResult& r);
std::string FormatDynamic(const JobDesc& job, const ClusterDesc& c, const DynamicPlan& p);
nlohmann::json DynamicJson(const JobDesc& job, const ClusterDesc& c, const DynamicPlan& p);

}  // namespace myriad::plan
