#include "train/parallel/pp/pipeline.h"

#include "ops/ops.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace myriad {

using comm::DType;
using comm::ReduceOp;

Result<std::vector<int>> StageLayers(int64_t n_layers, int pp, const std::string& spec) {
  std::vector<int> begin{0};
  if (spec.empty()) {
    for (int s = 0; s < pp; ++s) begin.push_back(begin.back() + static_cast<int>(n_layers / pp + (s < n_layers % pp)));
    return begin;
  }
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int n = 0;
    try { n = std::stoi(item); } catch (...) { n = -1; }
    if (n < 1) return Status::Error("parallel.pp_layers=\"" + spec + "\": \"" + item + "\" is not a layer count >= 1");
    begin.push_back(begin.back() + n);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (static_cast<int>(begin.size()) - 1 != pp || begin.back() != n_layers)
    return Status::Error("parallel.pp_layers=\"" + spec + "\" must give " + std::to_string(pp) +
                         " stage sizes summing to model.n_layers=" + std::to_string(n_layers));
  return begin;
}

void Pipeline::Step(const int32_t* tokens, int64_t M, int64_t mb, int T, float scale, LossParts* loss) {
  comm::Comm& pp = *pp_;
  const int P = pp.size(), s = pp.rank();
  const int64_t F = model_->BoundaryFloats(static_cast<int>(mb), T);
  constexpr int kActTag = 1 << 20, kGradTag = 2 << 20;
  act_in_.resize(P); act_out_.resize(P); grad_out_.resize(P);
  for (int i = 0; i < P; ++i) { act_in_[i].resize(F); act_out_[i].resize(F); grad_out_[i].resize(F); }
  grad_in_.resize(F);
  std::vector<comm::Request> send_act(P), send_grad(P);
  double wait = 0;
  auto now = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  const double t_start = now();
  // Micro-batch i lives in slot i % P: at most P - s are in flight on stage s.
  auto forward = [&](int64_t i) {
    const int slot = static_cast<int>(i % P);
    const float* x = nullptr;
    if (s > 0) {
      const double t0 = now();
      pp.Recv(act_in_[slot].data(), F, DType::kF32, s - 1, kActTag + static_cast<int>(i));
      wait += now() - t0;
      x = act_in_[slot].data();
    }
    LossParts lp;
    const float* y = model_->StageForward(slot, tokens + i * mb * (T + 1), static_cast<int>(mb), T, x, true, scale, &lp);
    loss->AddScaled(lp, scale);
    if (s < P - 1) {
      send_act[slot].Wait();
      ops::Copy(y, F, act_out_[slot].data());
      send_act[slot] = pp.ISend(act_out_[slot].data(), F, DType::kF32, s + 1, kActTag + static_cast<int>(i));
    }
  };
  auto backward = [&](int64_t i) {
    const int slot = static_cast<int>(i % P);
    const float* d = nullptr;
    if (s < P - 1) {
      const double t0 = now();
      pp.Recv(grad_in_.data(), F, DType::kF32, s + 1, kGradTag + static_cast<int>(i));
      wait += now() - t0;
      d = grad_in_.data();
    }
    zero_->set_reduce(i == M - 1);  // reduce gradients during the last backward
    const float* dx = model_->StageBackward(slot, d, scale);
    loss->indexer += model_->IndexerLoss(slot) * scale;
    if (s > 0) {
      send_grad[slot].Wait();
      ops::Copy(dx, F, grad_out_[slot].data());
      send_grad[slot] = pp.ISend(grad_out_[slot].data(), F, DType::kF32, s - 1, kGradTag + static_cast<int>(i));
    }
  };
  // 1F1B: warm up with P-s-1 forwards, then alternate one forward and one
  // backward, then drain the backwards.
  const int64_t warmup = std::min<int64_t>(P - s - 1, M);
  for (int64_t i = 0; i < warmup; ++i) forward(i);
  for (int64_t i = 0; i < M - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int64_t i = M - warmup; i < M; ++i) backward(i);
  for (auto& r : send_act) r.Wait();
  for (auto& r : send_grad) r.Wait();
  // Idle fraction: the schedule's (P-1)/(M+P-1), and the time this stage
  // waited for its neighbours, averaged over the stages.
  double frac = wait / std::max(1e-9, now() - t_start);
  pp.AllReduce(&frac, 1, DType::kF64, ReduceOp::kSum);
  bubble_measured_ = frac / P;
  bubble_theory_ = static_cast<double>(P - 1) / static_cast<double>(M + P - 1);
}

double Pipeline::ForwardLoss(const int32_t* tokens, int B, int T) {
  comm::Comm& pp = *pp_;
  const int P = pp.size(), s = pp.rank();
  const int64_t F = model_->BoundaryFloats(B, T);
  eval_in_.resize(F);
  if (s > 0) pp.Recv(eval_in_.data(), F, DType::kF32, s - 1, 3 << 20);
  LossParts lp;
  const float* y = model_->StageForward(0, tokens, B, T, s > 0 ? eval_in_.data() : nullptr, false, 1.f, &lp);
  if (s < P - 1) pp.Send(y, F, DType::kF32, s + 1, 3 << 20);
  double loss = lp.main;
  pp.Broadcast(&loss, 1, DType::kF64, P - 1);
  return loss;
}

}  // namespace myriad
