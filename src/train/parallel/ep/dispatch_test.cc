// Expert-parallel dispatch on LocalComm ranks (ep = 2 and 4).
//
// Rows carry their identity: every rank builds M rows grouped by global
// expert, with seeded random counts per expert (zeros included, and whole
// ranks with no rows), each row holding (source rank, row index, expert)
// in its C floats. PlanDispatch + DispatchRows must hand rank q exactly the
// rows of its experts [q*El, (q+1)*El), grouped by local expert, then by
// source rank, then by row; CombineRows must bring every (transformed) row
// back to its place on its source rank. The expected lists are computed here
// from every rank's counts (each rank can regenerate them from the seed).
//
// Then ExpertParallel inside the model: a tiny MoE model cut ep = 2 ways,
// both ranks fed the same tokens, gives the single-device loss and
// gradients (dense: equal; routed experts: twice, as each expert sees its
// rows from both ranks).
#include "train/parallel/ep/dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/rng.h"
#include "train/comm/local_comm.h"

namespace myriad {
namespace {

constexpr int64_t kC = 5;  // floats per row: src, row, expert, a checksum, a constant

// Rows per global expert of rank `src` in trial `seed`.
std::vector<int64_t> CountsOf(int src, int64_t E, uint64_t seed, bool empty_rank) {
  std::vector<int64_t> n(E, 0);
  if (empty_rank) return n;
  Rng rng(seed * 1000003 + static_cast<uint64_t>(src) * 7919 + 1);
  for (int64_t e = 0; e < E; ++e) {
    // About a third of the (rank, expert) pairs are empty.
    n[e] = rng.Below(3) == 0 ? 0 : static_cast<int64_t>(1 + rng.Below(5));
  }
  return n;
}

void FillRow(float* row, int src, int64_t i, int64_t e) {
  row[0] = static_cast<float>(src);
  row[1] = static_cast<float>(i);
  row[2] = static_cast<float>(e);
  row[3] = static_cast<float>(src * 1000 + i * 10 + e);
  row[4] = 0.25f;
}

struct Case {
  int ep;
  int64_t E;
  uint64_t seed;
  int empty_rank;  // a rank that sends nothing (-1: none)
};

void RunCase(const Case& k) {
  const int64_t El = k.E / k.ep;
  std::mutex mu;
  std::vector<std::string> failures;
  comm::RunLocalRanks(k.ep, [&](comm::Comm& ep) {
    const int r = ep.rank();
    auto fail = [&](const std::string& s) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("ep" + std::to_string(k.ep) + " E" + std::to_string(k.E) + " seed " +
                         std::to_string(k.seed) + " rank " + std::to_string(r) + ": " + s);
    };
    // Every rank's counts (only our own are used to build rows; the rest
    // are the oracle).
    std::vector<std::vector<int64_t>> counts(k.ep);
    for (int q = 0; q < k.ep; ++q) counts[q] = CountsOf(q, k.E, k.seed, q == k.empty_rank);
    std::vector<int64_t> offset(k.E + 1, 0);
    for (int64_t e = 0; e < k.E; ++e) offset[e + 1] = offset[e] + counts[r][e];
    const int64_t M = offset[k.E];
    std::vector<float> x(static_cast<size_t>(M) * kC);
    for (int64_t e = 0; e < k.E; ++e)
      for (int64_t i = offset[e]; i < offset[e + 1]; ++i) FillRow(x.data() + i * kC, r, i, e);
    ExpertRows rows;
    rows.x = x.data();
    rows.offset = offset.data();
    rows.M = M; rows.C = kC; rows.E = k.E;

    DispatchPlan p = PlanDispatch(ep, rows);
    if (p.El != El || p.M != M || p.C != kC || p.rank != r || p.ep != k.ep) fail("plan header");
    for (int q = 0; q < k.ep; ++q)
      for (int64_t e = 0; e < k.E; ++e)
        if (p.counts[q * k.E + e] != counts[q][e]) fail("plan counts");

    // Expected rows here: local expert, then source rank, then row order.
    std::vector<float> expect;
    std::vector<int64_t> expect_offset(El + 1, 0);
    for (int64_t le = 0; le < El; ++le) {
      const int64_t e = r * El + le;
      for (int q = 0; q < k.ep; ++q) {
        int64_t first = 0;
        for (int64_t f = 0; f < e; ++f) first += counts[q][f];
        for (int64_t i = first; i < first + counts[q][e]; ++i) {
          float row[kC];
          FillRow(row, q, i, e);
          expect.insert(expect.end(), row, row + kC);
        }
      }
      expect_offset[le + 1] = static_cast<int64_t>(expect.size()) / kC;
    }
    const int64_t R = static_cast<int64_t>(expect.size()) / kC;
    if (p.R != R) fail("R = " + std::to_string(p.R) + ", expected " + std::to_string(R));
    if (p.local_offset != expect_offset) fail("local_offset");

    std::vector<float> local(static_cast<size_t>(std::max<int64_t>(p.R, 0)) * kC, -1.f);
    Buf<float> tmp;
    DispatchRows(ep, p, x.data(), local.data(), &tmp);
    if (local != expect) {
      // Name the first wrong row.
      for (int64_t i = 0; i < std::min<int64_t>(R, p.R); ++i)
        if (!std::equal(local.begin() + i * kC, local.begin() + (i + 1) * kC, expect.begin() + i * kC)) {
          fail("received row " + std::to_string(i) + " is (src " + std::to_string(local[i * kC]) + ", row " +
               std::to_string(local[i * kC + 1]) + ", expert " + std::to_string(local[i * kC + 2]) +
               "), expected (src " + std::to_string(expect[i * kC]) + ", row " +
               std::to_string(expect[i * kC + 1]) + ", expert " + std::to_string(expect[i * kC + 2]) + ")");
          break;
        }
      if (R != p.R) fail("received row count");
    }

    // "Run the experts": add 100*(expert+1) to every float of a row, with
    // the expert taken from the plan's grouping (not from the row).
    std::vector<float> y = local;
    for (int64_t le = 0; le < El; ++le)
      for (int64_t i = p.local_offset[le]; i < p.local_offset[le + 1]; ++i)
        for (int64_t c = 0; c < kC; ++c) y[i * kC + c] += 100.f * static_cast<float>(r * El + le + 1);
    std::vector<float> back(static_cast<size_t>(M) * kC, -1.f);
    CombineRows(ep, p, y.data(), back.data(), &tmp);
    for (int64_t e = 0; e < k.E; ++e)
      for (int64_t i = offset[e]; i < offset[e + 1]; ++i)
        for (int64_t c = 0; c < kC; ++c)
          if (back[i * kC + c] != x[i * kC + c] + 100.f * static_cast<float>(e + 1)) {
            fail("combined row " + std::to_string(i) + " (expert " + std::to_string(e) + ") col " +
                 std::to_string(c) + " = " + std::to_string(back[i * kC + c]));
            e = k.E; i = M; break;  // one message is enough
          }

    // The plan is reusable: dispatching again (as backward does) gives the
    // same rows.
    std::vector<float> again(local.size(), -2.f);
    DispatchRows(ep, p, x.data(), again.data(), &tmp);
    if (again != local) fail("second dispatch with the same plan differs");
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(DispatchTest, Ep2RowsReachTheirExpertsAndComeBack) {
  for (uint64_t seed = 1; seed <= 6; ++seed) RunCase({2, 8, seed, -1});
  RunCase({2, 2, 7, -1});  // one expert per rank
  RunCase({2, 8, 8, 0});   // rank 0 sends nothing
}

TEST(DispatchTest, Ep4RowsReachTheirExpertsAndComeBack) {
  for (uint64_t seed = 1; seed <= 6; ++seed) RunCase({4, 8, seed, -1});
  RunCase({4, 4, 9, -1});   // one expert per rank
  RunCase({4, 12, 10, 2});  // rank 2 sends nothing
}

TEST(DispatchTest, NothingAnywhere) {
  // Every count zero: empty plans, no crash.
  comm::RunLocalRanks(2, [&](comm::Comm& ep) {
    std::vector<int64_t> offset(5, 0);
    ExpertRows rows;
    rows.offset = offset.data();
    rows.M = 0; rows.C = kC; rows.E = 4;
    DispatchPlan p = PlanDispatch(ep, rows);
    EXPECT_EQ(p.R, 0);
    std::vector<float> local, back;
    Buf<float> tmp;
    DispatchRows(ep, p, nullptr, local.data(), &tmp);
    CombineRows(ep, p, local.data(), back.data(), &tmp);
  });
}

// ---- ExpertParallel in a tiny MoE model.

ModelConfig TinyMoe() {
  ModelConfig c;
  c.vocab_size = 97; c.d_model = 32; c.n_layers = 3; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48;
  c.n_dense_layers = 1; c.n_routed_experts = 4; c.n_shared_experts = 1; c.top_k = 2; c.d_expert = 24;
  c.score_func = "softmax"; c.max_seq_len = 64; c.init_std = 0.2;
  return c;
}

class EpOnlyHooks : public ParallelHooks {
 public:
  explicit EpOnlyHooks(ExpertParallel* ep) : ep_(ep) {}
  bool ExpertsRemote() const override { return true; }
  void ExpertsForward(int b, const ExpertRows& rows, float* y) override { ep_->Forward(b, rows, y); }
  void ExpertsBackward(int b, const float* dy, float* dx) override { ep_->Backward(b, dy, dx); }

 private:
  ExpertParallel* ep_;
};

double RelDiff(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

TEST(ExpertParallelTest, Ep2ModelMatchesSingleDevice) {
  const ModelConfig cfg = TinyMoe();
  ASSERT_TRUE(cfg.Validate().ok());
  const int B = 2, T = 16;
  std::vector<int32_t> tokens(B * (T + 1));
  Rng rng(11);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.Below(cfg.vocab_size));

  Model full(cfg);
  full.InitWeights(5);
  full.ZeroGrads();
  const LossParts ref = full.Step(tokens.data(), B, T, true);
  std::map<std::string, const ParamInfo*> by_name;
  for (const auto& p : full.layout().params()) by_name[p.name] = &p;

  std::mutex mu;
  std::vector<std::string> failures;
  comm::RunLocalRanks(2, [&](comm::Comm& ep) {
    auto fail = [&](const std::string& s) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("rank " + std::to_string(ep.rank()) + ": " + s);
    };
    ShardPlan plan;
    plan.ep = 2;
    plan.ep_rank = ep.rank();
    Model m(cfg, plan);
    // Weights copied by name from the whole model (this rank's experts only).
    const std::vector<float> full_params = full.ParamsToHost();
    for (const auto& p : m.layout().params()) {
      auto it = by_name.find(p.name);
      if (it == by_name.end()) { fail("no tensor " + p.name + " in the whole model"); return; }
      m.ParamsFromHost(full_params.data() + it->second->offset, p.offset, p.numel);
    }
    m.biases() = full.biases();
    ExpertParallel xp(&ep, &m);
    EpOnlyHooks hooks(&xp);
    m.set_hooks(&hooks);
    m.ZeroGrads();
    const LossParts lp = m.Step(tokens.data(), B, T, true);
    if (RelDiff(lp.total, ref.total) > 1e-5 || RelDiff(lp.main, ref.main) > 1e-5)
      fail("loss " + std::to_string(lp.total) + " vs single-device " + std::to_string(ref.total));
    // Experts here processed rows of both ranks (identical data): 2x.
    if (xp.rows_in(0) <= 0) fail("no rows reached the local experts");
    double worst = 0;
    std::string worst_name;
    const std::vector<float> grads = m.GradsToHost(), full_grads = full.GradsToHost();
    for (const auto& p : m.layout().params()) {
      const ParamInfo& w = *by_name[p.name];
      const double f = p.expert ? 2.0 : 1.0;
      double num = 0, den = 0;
      for (int64_t i = 0; i < p.numel; ++i) {
        const double g = grads[p.offset + i], gr = f * full_grads[w.offset + i];
        num = std::max(num, std::fabs(g - gr));
        den = std::max(den, std::fabs(gr));
      }
      const double rel = num / std::max(den, 1e-12);
      if (rel > worst) worst = rel, worst_name = p.name;
    }
    if (worst > 1e-4) fail("gradient " + worst_name + " differs by " + std::to_string(worst) + " (relative)");
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace myriad
