// The planner and training agree on layouts (one validator,
// ParallelDims::Validate in model/parallel_dims.h): for configs/tiny.toml,
// configs/demo-moe.toml and the tiny config with DSA attention, on 1 to 8
// devices,
//   - every candidate the planner proposes (ParallelLayouts with each
//     micro-batch CheckLayout accepts, and FindBest's best and runners-up)
//     passes TrainConfig::ValidateLayout -- the check DistTrainer::Create
//     and pre-flight make -- once written into [parallel] as a run would be;
//   - for every (dp, tp, pp, ep, cp) with the device count as product, the
//     planner's CheckLayout and training's check give the same verdict
//     (so the planner leaves out exactly what training refuses);
//   - the proposals are not vacuous: the dense configs get tp, pp, ep and cp
//     candidates; the DSA config gets dp and ep ones and none with tp, pp
//     or cp (what dist training supports with DSA).
// tests/dist/plan_layouts.sh runs a sample of the proposals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/config.h"
#include "plan/planner.h"
#include "train/train_config.h"

namespace myriad {
namespace {

struct Loaded {
  ModelConfig model;
  TrainConfig train;
  plan::JobDesc job;
};

Loaded Load(const std::string& name, const std::vector<std::string>& overrides) {
  const char* src = std::getenv("MYRIAD_SOURCE_DIR");
  const std::string path = std::string(src ? src : ".") + "/configs/" + name;
  auto doc = ConfigDoc::Load(path, overrides);
  EXPECT_TRUE(doc.ok()) << doc.status().message();
  Loaded s;
  if (!doc.ok()) return s;
  s.model = ModelConfig::Read(doc->get());
  s.train = TrainConfig::Read(doc->get());
  EXPECT_TRUE((*doc)->Finish().ok());
  EXPECT_TRUE(s.model.Validate().ok()) << s.model.Validate().message();
  EXPECT_TRUE(s.train.Validate().ok()) << s.train.Validate().message();
  s.job = plan::TrainingJob(s.model, s.train.seq_len, s.train.batch_size * s.train.grad_accum, path);
  return s;
}

// One node of `devices` CPU "devices" (the cpu preset's device and link).
plan::ClusterDesc Cluster(int64_t devices) {
  auto base = plan::ClusterPreset("cpu");
  EXPECT_TRUE(base.ok()) << base.status().message();
  plan::ClusterDesc c = *base;
  c.devices = devices;
  c.tiers.resize(1);
  c.tiers[0].size = devices;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate().message();
  return c;
}

// The [parallel] section a run of planner layout `l` uses: its degrees and
// ZeRO stage; with pp > 1 its micro-batch of mb sequences is S / mb
// pipeline micro-batches per data rank (parallel.microbatches).
TrainConfig RunOf(const TrainConfig& base, const plan::Layout& l) {
  TrainConfig t = base;
  static_cast<ParallelDims&>(t.parallel) = l;
  t.parallel.zero = l.zero;
  const int64_t per_rank = t.batch_size * t.grad_accum / (static_cast<int64_t>(l.dp) * l.ep);
  t.parallel.microbatches = l.pp > 1 ? static_cast<int>(per_rank / l.micro_batch) : 0;
  return t;
}

struct Seen {
  int64_t proposals = 0;
  std::set<std::string> degrees;  // "tp", "pp", ... that were > 1 in some proposal
  void Add(const plan::Layout& l) {
    ++proposals;
    for (auto [n, v] : {std::pair{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"ep", l.ep}, {"cp", l.cp}})
      if (v > 1) degrees.insert(n);
  }
};

// Checks every proposal for 1..8 devices; returns what was proposed.
Seen CheckProposals(const Loaded& s) {
  Seen seen;
  for (int64_t devices = 1; devices <= 8; ++devices) {
    const plan::ClusterDesc c = Cluster(devices);
    plan::SearchSpace space;
    space.max_tp = devices;
    space.recompute = {plan::Recompute::kNone};  // Myriad's training has none
    auto validates = [&](const plan::Layout& l, const char* from) {
      const TrainConfig run = RunOf(s.train, l);
      const Status st = run.ValidateLayout(s.model, l.world());
      EXPECT_TRUE(st.ok()) << s.job.model_name << ": " << from << " proposes " << l.ToString()
                           << " but training refuses it: " << st.message();
    };
    const std::vector<plan::Layout> candidates = plan::ParallelLayouts(s.job, c, space);
    for (const plan::Layout& dims : candidates)
      for (int64_t mb : space.micro_batches) {
        plan::Layout l = dims;
        l.micro_batch = mb;
        if (!plan::CheckLayout(s.job, c, l).ok()) continue;
        validates(l, "ParallelLayouts");
        seen.Add(l);
      }
    // (Odd counts may have no candidate: 3, 5, 7 divide none of tiny's shapes.)
    const plan::PlanResult r = plan::FindBest(s.job, c, space, 100);
    EXPECT_EQ(r.found, !candidates.empty()) << s.job.model_name << " on " << devices << " devices: " << r.why;
    if (r.found) validates(r.layout, "FindBest");
    for (const auto& [l, e] : r.runners_up) validates(l, "FindBest (runner-up)");
  }
  return seen;
}

// Every degree tuple with `devices` as product: the planner accepts it
// (micro-batch 1) exactly when training does.
void CheckAgreement(const Loaded& s) {
  for (int devices = 1; devices <= 8; ++devices) {
    const plan::ClusterDesc c = Cluster(devices);
    for (int tp = 1; tp <= devices; ++tp)
      for (int pp = 1; pp * tp <= devices; ++pp)
        for (int ep = 1; ep * pp * tp <= devices; ++ep)
          for (int cp = 1; cp * ep * pp * tp <= devices; ++cp) {
            const int rest = cp * ep * pp * tp;
            if (devices % rest) continue;
            plan::Layout l;
            l.dp = devices / rest, l.tp = tp, l.pp = pp, l.ep = ep, l.cp = cp;
            const Status planner = plan::CheckLayout(s.job, c, l);
            const Status training = RunOf(s.train, l).ValidateLayout(s.model, devices);
            EXPECT_EQ(planner.ok(), training.ok())
                << s.job.model_name << " " << l.ToString() << ": planner says '" << planner.message()
                << "', training says '" << training.message() << "'";
          }
  }
}

const std::vector<std::string> kDsa = {"model.attention=\"dsa\"", "model.dsa_topk=8", "model.dsa_index_heads=2",
                                       "model.dsa_index_dim=16"};

// A dense-attention training config: proposals validate, cover every
// degree, and the planner agrees with training on every tuple.
void CheckDenseConfig(const std::string& name) {
  const Loaded s = Load(name, {});
  const Seen seen = CheckProposals(s);
  EXPECT_GT(seen.proposals, 50) << name;
  for (const char* d : {"dp", "tp", "pp", "ep", "cp"})
    EXPECT_TRUE(seen.degrees.count(d)) << name << ": no proposal with " << d;
  CheckAgreement(s);
}

TEST(PlannedLayouts, TinyProposalsValidate) { CheckDenseConfig("tiny.toml"); }
TEST(PlannedLayouts, DemoMoeProposalsValidate) { CheckDenseConfig("demo-moe.toml"); }

TEST(PlannedLayouts, DsaProposalsAreDataAndExpertParallelOnly) {
  const Loaded s = Load("tiny.toml", kDsa);
  ASSERT_TRUE(s.model.dsa());
  const Seen seen = CheckProposals(s);
  EXPECT_GT(seen.proposals, 10);
  EXPECT_TRUE(seen.degrees.count("dp"));
  EXPECT_TRUE(seen.degrees.count("ep"));
  for (const char* d : {"tp", "pp", "cp"}) EXPECT_FALSE(seen.degrees.count(d)) << "a DSA proposal with " << d;
  CheckAgreement(s);
  // The planner's reason names DSA (it used to propose these, and training refused them).
  plan::Layout l;
  l.dp = 2, l.tp = 2;
  const Status st = plan::CheckLayout(s.job, Cluster(4), l);
  EXPECT_NE(st.message().find("tp=2: model.attention=\"dsa\" trains with data and expert parallelism only"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace myriad
