#include "train/dist_train.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "ops/ops.h"
#include "train/comm/hierarchical.h"

namespace myriad {
namespace {

using comm::DType;
using comm::ReduceOp;

// Copies the slice a local tensor `p` holds out of (to_local) or into a
// whole tensor `whole` laid out as p.global_shape.
void CopySlice(const ParamInfo& p, float* whole, float* local, bool to_local) {
  if (p.tp_dim < 0) {
    if (to_local) std::memcpy(local, whole, p.numel * sizeof(float));
    else std::memcpy(whole, local, p.numel * sizeof(float));
    return;
  }
  // A 1-D tensor split by rows (a q/k/v bias) is a column: [R, 1].
  const int64_t Cg = p.global_shape.size() > 1 ? p.global_shape[1] : 1, r = p.shape[0];
  const int64_t c = p.shape.size() > 1 ? p.shape[1] : 1;
  const int64_t r0 = p.tp_dim == 0 ? p.tp_offset : 0, c0 = p.tp_dim == 1 ? p.tp_offset : 0;
  for (int64_t i = 0; i < r; ++i) {
    float* w = whole + (r0 + i) * Cg + c0;
    if (to_local) std::memcpy(local + i * c, w, c * sizeof(float));
    else std::memcpy(w, local + i * c, c * sizeof(float));
  }
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

}  // namespace

DistTrainer::~DistTrainer() = default;

ShardPlan DistTrainer::PlanFor(const Coords& c) const {
  const ParallelDims& d = mesh_->dims();
  ShardPlan p;
  p.tp = d.tp; p.tp_rank = c.tp;
  p.ep = d.ep; p.ep_rank = c.ep;
  p.layer_begin = stage_begin_[c.pp];
  p.layer_end = stage_begin_[c.pp + 1];
  p.first_stage = c.pp == 0;
  p.last_stage = c.pp == d.pp - 1;
  return p;
}

Result<std::unique_ptr<DistTrainer>> DistTrainer::Create(comm::Comm* world, const ModelConfig& mc,
                                                         const TrainConfig& tc) {
  const ParallelConfig& pc = tc.parallel;
  const ParallelDims dims = pc;
  const int64_t global_batch = tc.batch_size * tc.grad_accum;
  const int64_t micro = pc.pipeline_microbatches();
  RETURN_IF_ERROR(tc.ValidateLayout(mc, world->size()));
  std::unique_ptr<DistTrainer> t(new DistTrainer());
  t->mc_ = mc;
  t->tc_ = tc;
  // One rank: ZeRO has nothing to shard (stage 0 keeps the flat state) and
  // no gradient goes anywhere (no hierarchy or compression).
  const bool solo = world->size() == 1;
  const int zero = solo ? 0 : pc.zero;
  t->tc_.parallel.zero = zero;
  ASSIGN_OR_RETURN(t->stage_begin_, StageLayers(mc.n_layers, dims.pp, pc.pp_layers));
  t->mesh_ = std::make_unique<Mesh>(world, dims);
  Mesh& m = *t->mesh_;
  // Sub-communicators, created in the same order on every rank.
  comm::Comm& dense = m.dense_data();
  comm::Comm& expert = m.expert_data();
  comm::Comm* ep = dims.ep > 1 ? &m.ep() : nullptr;
  comm::Comm* tp = dims.tp > 1 ? &m.tp() : nullptr;
  comm::Comm* dense_rep = tp ? &m.Group(Dim::kDp | Dim::kEp | Dim::kCp | Dim::kTp) : &dense;
  t->model_ = std::make_unique<Model>(mc, t->PlanFor(m.coords()));
  t->model_->InitWeights(tc.seed);
  if (dims.pp > 1) t->model_->set_slots(dims.pp);
  // Hierarchical (and optionally compressed) all-reduce for the dense
  // gradients: a decorator over the dense group.
  if (!solo && (pc.hierarchical || pc.compression != "none")) {
    comm::HierOptions ho;
    ho.ranks_per_node = pc.ranks_per_node;
    ho.inter.mode = pc.compression == "int8"   ? comm::Compression::kInt8
                    : pc.compression == "bf16" ? comm::Compression::kBf16
                                               : comm::Compression::kNone;
    try {
      t->hier_ = std::make_unique<comm::HierarchicalComm>(dense, ho);
    } catch (const std::exception& e) {
      return Status::Error(std::string("parallel.ranks_per_node=") + std::to_string(pc.ranks_per_node) + ": " +
                           e.what());
    }
    t->grad_comm_ = t->hier_.get();
    if (zero >= 2 && t->is_root())
      LOG_WARN("parallel.zero=%d reduce-scatters gradients; hierarchy and compression apply to the all-reduce "
               "of ZeRO 0 and 1 only", zero);
    if (t->is_root())
      LOG_INFO("gradients: hierarchical all-reduce over %d nodes x %d ranks, inter-node compression %s",
               t->hier_->num_nodes(), t->hier_->local_size(), pc.compression.c_str());
  }
  t->zero_ = std::make_unique<ZeroSync>(t->model_.get(), &dense, &expert, dense_rep, zero, t->grad_comm_);
  if (ep) t->ep_ = std::make_unique<ExpertParallel>(ep, t->model_.get());
  if (dims.pp > 1 && m.coords().pp == dims.pp - 1 && m.coords().pp != 0 &&
      (mc.tie_embeddings || mc.mtp_depth > 0))
    t->zero_->MarkMirror(t->model_->layout().offsets().embed);
  if (tp) t->sp_ = std::make_unique<TpRows>(tp);
  comm::Comm* cp = dims.cp > 1 ? &m.cp() : nullptr;
  if (cp) t->cp_ = std::make_unique<ContextParallel>(cp, static_cast<int>(mc.n_layers));
  comm::Comm* loss_group = (tp || cp) ? &m.Group(Dim::kTp | Dim::kCp) : nullptr;
  t->data_ = &m.Group(Dim::kDp | Dim::kEp);
  if (dims.pp > 1) {
    // The first and last stages' copies of the embedding sum their gradients.
    comm::Comm& pp = m.pp();
    const bool ends = pp.rank() == 0 || pp.rank() == dims.pp - 1;
    const int others = dims.world() / dims.pp;
    const int color = ends ? (m.rank() % others) : others + m.rank();
    t->embed_owner_ = m.world().Split(color, m.rank());
    if (ends && (mc.tie_embeddings || mc.mtp_depth > 0)) t->embed_group_ = t->embed_owner_.get();
  }
  if (dims.pp > 1) t->pipe_ = std::make_unique<Pipeline>(&m.pp(), t->model_.get(), t->zero_.get());
  // On one rank every hook would be a no-op (stage 0, groups of one): the
  // model runs without them, as a plain single-device model.
  if (!solo) {
    t->hooks_ = std::make_unique<DistHooks>(t->zero_.get(), t->ep_.get(), t->sp_.get(), t->cp_.get(), loss_group);
    t->model_->set_hooks(t->hooks_.get());
  }
  const size_t state = zero == 0 ? t->model_->layout().total() : t->zero_->packed_size();
  t->m_.zero(state);
  t->v_.zero(state);
  // Micro-batches per rank: as few as keep each no larger than train.batch_size.
  const int64_t D = m.data_size(), S = global_batch / D;
  int64_t mb_count = std::max<int64_t>(1, tc.grad_accum / D);
  while (S % mb_count) ++mb_count;
  t->micro_ = dims.pp > 1 ? micro : mb_count;
  if (t->is_root())
    LOG_INFO("parallel: %s, ZeRO-%d, %lld sequences per rank per step in %lld micro-batches; %lld of %lld "
             "parameters here", dims.ToString().c_str(), zero, static_cast<long long>(S),
             static_cast<long long>(mb_count), static_cast<long long>(t->model_->layout().total()),
             static_cast<long long>(ParamLayout(mc).total()));
  return t;
}

StepStats DistTrainer::Step(const int32_t* global, int A, int B, int T, int64_t step, HeadObjective* objective) {
  Mesh& m = *mesh_;
  StepStats st;
  const bool pipe = pipe_ != nullptr, multi = !solo();
  CHECK_MSG(!(pipe && objective), "a head objective (post-training) needs parallel.pp = 1");
  if (mc_.dsa()) model_->set_dsa_dense(step <= mc_.dsa_warmup_steps);
  const int64_t D = m.data_size(), S = static_cast<int64_t>(A) * B / D, mb = S / micro_;
  const int32_t* mine = global + m.data_rank() * S * (T + 1);
  const float scale = static_cast<float>(static_cast<double>(mb) / (static_cast<double>(A) * B));
  comm::Comm& dense = m.dense_data();
  comm::Comm& expert = m.expert_data();
  auto bytes_now = [&] {
    return dense.stats().bytes_sent + (&expert != &dense ? expert.stats().bytes_sent : 0) +
           (hier_ ? hier_->step_stats().intra_bytes + hier_->step_stats().inter_bytes : 0);
  };
  if (hier_) hier_->ResetStepStats();
  const int64_t ep_bytes0 = ep_ ? m.ep().stats().bytes_sent : 0;
  const int64_t bytes0 = bytes_now();
  zero_->stats() = SyncStats{};
  zero_->ZeroGrads();
  model_->ClearExpertLoad();
  // The second step (the first pays one-time costs: connections, page
  // faults) reduces synchronously to time the reduction on its own; the
  // others overlap it with backward (hidden = 1 - exposed / alone).
  zero_->set_sync(steps_done_ == 1);
  LossParts& loss = st.loss;
  const int64_t pp_bytes0 = pipe ? m.pp().stats().bytes_sent : 0;
  if (pipe) {
    pipe_->Step(mine, micro_, mb, T, scale, &loss);
    comm_.bubble_theory = pipe_->bubble_theory();
    comm_.bubble_measured = pipe_->bubble_measured();
  } else {
    for (int64_t i = 0; i < micro_; ++i) {
      zero_->set_reduce(i == micro_ - 1);
      model_->set_head_objective(objective, m.data_rank() * S + i * mb);
      loss.AddScaled(model_->Step(mine + i * mb * (T + 1), static_cast<int>(mb), T, true, scale), scale);
    }
    model_->set_head_objective(nullptr);
  }
  zero_->Finish();
  if (embed_group_) zero_->SumSegmentGrad(model_->layout().offsets().embed, embed_group_);
  // The model's loss terms cover its sequences (summed over tp and cp
  // already) and its pipeline stage: add the other data ranks' and stages'.
  if (multi) {
    double parts[LossParts::kCount];
    loss.ToArray(parts);
    data_->AllReduce(parts, LossParts::kCount, DType::kF64, ReduceOp::kSum);
    if (pipe) m.pp().AllReduce(parts, LossParts::kCount, DType::kF64, ReduceOp::kSum);
    loss.FromArray(parts);
  }

  // Global gradient norm over disjoint owned slices, clipping, AdamW.
  double sumsq = zero_->OwnedGradSumSquares();
  if (multi) m.world().AllReduce(&sumsq, 1, DType::kF64, ReduceOp::kSum);
  const OptimConfig& oc = tc_.optim;
  const double norm = std::sqrt(sumsq);
  const double clip = ClipScale(oc, norm);
  const double lr = LearningRate(oc, step);
  const bool flat = zero_->stage() == 0;
  zero_->ForEachOwned([&](int64_t off, int64_t n, int64_t packed, bool decay) {
    AdamWUpdate(oc, step, lr, clip, decay, n, zero_->OwnedParam(off, packed), zero_->OwnedGrad(off, packed),
                m_.data() + (flat ? off : packed), v_.data() + (flat ? off : packed));
  });
  zero_->PublishParams();
  st.grad_norm = norm;
  st.lr = lr;

  // Expert loads of every data rank, then the (identical) bias update.
  // (Each pipeline stage counts its own blocks: summed over the stages, every
  // rank holds every block's loads and keeps every bias in step.)
  if (multi) {
    for (auto& load : model_->mutable_expert_load()) {
      dense.AllReduce(load.data(), static_cast<int64_t>(load.size()), DType::kI64, ReduceOp::kSum);
      if (pipe) m.pp().AllReduce(load.data(), static_cast<int64_t>(load.size()), DType::kI64, ReduceOp::kSum);
    }
  }
  st.expert_load = model_->expert_load();
  for (const auto& load : st.expert_load) {
    int64_t sum = 0, mx = 0;
    for (auto c : load) sum += c, mx = std::max(mx, c);
    if (sum > 0) st.max_imbalance = std::max(st.max_imbalance, static_cast<double>(mx) * load.size() / sum);
  }
  model_->ApplyBiasUpdate();

  comm_.grad_bytes = bytes_now() - bytes0;
  if (hier_) {
    comm_.intra_node_bytes = hier_->step_stats().intra_bytes;
    comm_.inter_node_bytes = hier_->step_stats().inter_bytes;
  }
  comm_.ep_bytes = ep_ ? m.ep().stats().bytes_sent - ep_bytes0 : 0;
  comm_.exposed_s = zero_->stats().wait_s;
  comm_.resident_peak = zero_->stats().gathered_peak;
  comm_.local_params = model_->layout().total();
  comm_.pp_bytes = pipe ? m.pp().stats().bytes_sent - pp_bytes0 : 0;
  if (steps_done_ == 1) {
    comm_.sync_s = zero_->stats().reduce_sync_s;
    comm_.exposed_s = comm_.sync_s;  // nothing was hidden in the timing step
  }
  ++steps_done_;
  return st;
}

void DistTrainer::Forward(const int32_t* global, int A, int B, int T, HeadObjective* objective) {
  CHECK_MSG(!pipe_, "a head objective (post-training) needs parallel.pp = 1");
  Mesh& m = *mesh_;
  const int64_t D = m.data_size(), S = static_cast<int64_t>(A) * B / D, mb = S / micro_;
  const int32_t* mine = global + m.data_rank() * S * (T + 1);
  for (int64_t i = 0; i < micro_; ++i) {
    model_->set_head_objective(objective, m.data_rank() * S + i * mb);
    (void)model_->Step(mine + i * mb * (T + 1), static_cast<int>(mb), T, /*backward=*/false);
  }
  model_->set_head_objective(nullptr);
  model_->ClearExpertLoad();
}

EvalResult DistTrainer::Evaluate(DataLoader& val, int B, int T, int64_t batches) {
  if (!pipe_) return myriad::Evaluate(*model_, val, B, T, batches);
  EvalResult r = EvaluateWith(val, B, T, batches, [&](const int32_t* tokens) { return pipe_->ForwardLoss(tokens, B, T); });
  model_->ClearExpertLoad();
  return r;
}

std::unique_ptr<CheckpointSnapshot> DistTrainer::Snapshot(int64_t step, const nlohmann::json& meta) {
  Mesh& m = *mesh_;
  zero_->GatherAll();
  const ParamLayout& lay = model_->layout();
  // One rank holds the whole tensors in the single-device layout and flat
  // moments: they go into the snapshot as they are (one copy, the snapshot's).
  // Parameters and moments come to the host first (the snapshot is host data).
  // Into recycled buffers (SnapshotBufferPool): after the first save no
  // page is faulted in on the training thread.
  std::vector<float> hp = snap_pool_->Take(model_->num_params()), hm = snap_pool_->Take(m_.size()),
                     hv = snap_pool_->Take(v_.size());
  model_->ParamsToHost(&hp);
  ToHost(m_, &hm);
  ToHost(v_, &hv);
  if (solo()) return MakeSnapshot(step, meta, std::move(hp), std::move(hm), std::move(hv));
  // Distributed: these are staging only; back to the pool when done.
  struct GiveBack {
    SnapshotBufferPool* pool;
    std::vector<float>* v[3];
    ~GiveBack() {
      for (std::vector<float>* x : v) pool->Give(std::move(*x));
    }
  } give_back{snap_pool_.get(), {&hp, &hm, &hv}};
  // Whole local optimizer moments (local layout).
  std::vector<float> lm, lv;
  if (zero_->stage() == 0) {
    lm = hm;
    lv = hv;
  } else {
    lm.assign(lay.total(), 0.f);
    lv.assign(lay.total(), 0.f);
    for (const Segment& s : zero_->segments()) {
      const int g = s.group->size();
      std::vector<float> mine(s.shard, 0.f), all(static_cast<size_t>(s.shard) * g);
      for (int which = 0; which < 2; ++which) {
        const std::vector<float>& src = which ? hv : hm;
        std::vector<float>& dst = which ? lv : lm;
        std::fill(mine.begin(), mine.end(), 0.f);
        std::memcpy(mine.data(), src.data() + s.packed, s.own_count * sizeof(float));
        s.group->AllGather(mine.data(), all.data(), s.shard, DType::kF32);
        std::memcpy(dst.data() + s.offset, all.data(), s.count * sizeof(float));
      }
    }
  }
  // Representatives of each distinct shard (dp = cp = 0) send theirs to rank 0.
  const Coords& c = m.coords();
  const bool rep = c.dp == 0 && c.cp == 0;
  const ParallelDims& d = m.dims();
  std::vector<int> reps;
  for (int pp = 0; pp < d.pp; ++pp)
    for (int ep = 0; ep < d.ep; ++ep)
      for (int tp = 0; tp < d.tp; ++tp) reps.push_back(m.RankOf(Coords{tp, 0, ep, 0, pp}));
  constexpr int kTag = 7001;
  if (rep && !is_root()) {
    m.world().Send(hp.data(), lay.total(), DType::kF32, 0, kTag);
    m.world().Send(lm.data(), lay.total(), DType::kF32, 0, kTag + 1);
    m.world().Send(lv.data(), lay.total(), DType::kF32, 0, kTag + 2);
  }
  if (is_root()) {
    // Whole tensors in the single-device layout.
    ParamLayout whole(mc_);
    std::vector<float> P = snap_pool_->Take(whole.total()), Mo = snap_pool_->Take(whole.total()),
                       Vo = snap_pool_->Take(whole.total());
    for (std::vector<float>* x : {&P, &Mo, &Vo}) std::fill(x->begin(), x->end(), 0.f);
    std::map<std::string, const ParamInfo*> by_name;
    for (const auto& p : whole.params()) by_name[p.name] = &p;
    for (int r : reps) {
      Coords rc{r % d.tp, 0, (r / (d.tp * d.cp)) % d.ep, 0, r / (d.tp * d.cp * d.ep * d.dp)};
      ParamLayout rl(mc_, PlanFor(rc));
      std::vector<float> rp, rm, rv;
      const float *pp = hp.data(), *pm = lm.data(), *pv = lv.data();
      if (r != 0) {
        rp.resize(rl.total()); rm.resize(rl.total()); rv.resize(rl.total());
        m.world().Recv(rp.data(), rl.total(), DType::kF32, r, kTag);
        m.world().Recv(rm.data(), rl.total(), DType::kF32, r, kTag + 1);
        m.world().Recv(rv.data(), rl.total(), DType::kF32, r, kTag + 2);
        pp = rp.data(); pm = rm.data(); pv = rv.data();
      }
      for (const auto& p : rl.params()) {
        auto it = by_name.find(p.name);
        if (it == by_name.end()) continue;
        const int64_t o = it->second->offset;
        CopySlice(p, P.data() + o, const_cast<float*>(pp) + p.offset, false);
        CopySlice(p, Mo.data() + o, const_cast<float*>(pm) + p.offset, false);
        CopySlice(p, Vo.data() + o, const_cast<float*>(pv) + p.offset, false);
      }
    }
    return MakeSnapshot(step, meta, std::move(P), std::move(Mo), std::move(Vo));
  }
  return nullptr;
}

void DistTrainer::PrepareSnapshotBuffers() {
  // Zeroed: every page touched. One rank: the host copies are the snapshot.
  // More: every rank stages its own state (local size), and rank 0 gathers
  // the whole tensors into the snapshot.
  const auto give = [&](size_t n) {
    for (int i = 0; i < 3; ++i) snap_pool_->Give(std::vector<float>(n));
  };
  if (!solo()) give(static_cast<size_t>(model_->num_params()));
  if (is_root()) give(static_cast<size_t>(ParamLayout(mc_).total()));
}

std::unique_ptr<CheckpointSnapshot> DistTrainer::MakeSnapshot(int64_t step, const nlohmann::json& meta,
                                                              std::vector<float>&& params_v,
                                                              std::vector<float>&& exp_avg_v,
                                                              std::vector<float>&& exp_avg_sq_v) const {
  const ParamLayout whole(mc_);
  CHECK(static_cast<int64_t>(params_v.size()) == whole.total() && exp_avg_v.size() == params_v.size() &&
        exp_avg_sq_v.size() == params_v.size());
  auto snap = std::make_unique<CheckpointSnapshot>();
  snap->step = step;
  snap->meta = meta;
  snap->ReturnAdoptedTo(snap_pool_);
  const float* params = snap->Adopt(std::move(params_v));
  const float* exp_avg = snap->Adopt(std::move(exp_avg_v));
  const float* exp_avg_sq = snap->Adopt(std::move(exp_avg_sq_v));
  for (const auto& p : whole.params()) {
    if (mc_.tie_embeddings && p.name == "lm_head.weight") continue;
    snap->AddModelView(p.name, p.shape, params + p.offset, p.numel);
  }
  const auto& bn = whole.bias_names();
  for (size_t i = 0; i < bn.size(); ++i)
    snap->AddModel(bn[i], {mc_.n_routed_experts}, model_->biases()[i].data(), mc_.n_routed_experts);
  for (const auto& p : whole.params()) {
    if (mc_.tie_embeddings && p.name == "lm_head.weight") continue;
    snap->AddOptimizerView(p.name + ".exp_avg", p.shape, exp_avg + p.offset, p.numel);
    snap->AddOptimizerView(p.name + ".exp_avg_sq", p.shape, exp_avg_sq + p.offset, p.numel);
  }
  return snap;
}

Status DistTrainer::Restore(const LoadedCheckpoint& ck, bool with_optimizer) {
  if (with_optimizer && !ck.optimizer)
    return Status::Error(ck.dir + ": no optimizer state (hint: it was saved for inference only; use --fresh)");
  auto reader = [&ck](const SafetensorsFile& f) -> WholeTensorReader {
    return [&ck, &f](const std::string& name, const std::vector<int64_t>& shape) -> Result<std::vector<float>> {
      auto v = ReadF32(f, name, shape);
      if (!v.ok()) return v.status().With(ck.dir);
      return v;
    };
  };
  const WholeTensorReader model = reader(ck.model);
  if (!with_optimizer) return Load(model, nullptr);
  const WholeTensorReader optimizer = reader(*ck.optimizer);
  return Load(model, &optimizer);
}

Status DistTrainer::RestoreWeights(const WholeTensorReader& read_model) { return Load(read_model, nullptr); }

Status DistTrainer::Load(const WholeTensorReader& read_model, const WholeTensorReader* read_optimizer) {
  const ParamLayout& lay = model_->layout();
  std::vector<float> lm(lay.total(), 0.f), lv(lay.total(), 0.f);
  auto load = [&](const WholeTensorReader& read, const std::string& name, const ParamInfo& p, float* dst) -> Status {
    ASSIGN_OR_RETURN(std::vector<float> v, read(name, p.global_shape));
    if (static_cast<int64_t>(v.size()) != Numel(p.global_shape)) return Status::Error(name + ": wrong size");
    CopySlice(p, v.data(), dst, true);
    return Status::Ok();
  };
  std::vector<float> hp(lay.total());  // each tensor through the host, then to the device
  for (const auto& p : lay.params()) {
    if (mc_.tie_embeddings && p.name == "lm_head.weight") continue;
    RETURN_IF_ERROR(load(read_model, p.name, p, hp.data() + p.offset));
    model_->ParamsFromHost(hp.data() + p.offset, p.offset, p.numel);
    if (read_optimizer) {
      RETURN_IF_ERROR(load(*read_optimizer, p.name + ".exp_avg", p, lm.data() + p.offset));
      RETURN_IF_ERROR(load(*read_optimizer, p.name + ".exp_avg_sq", p, lv.data() + p.offset));
    }
  }
  ParamLayout whole(mc_);
  const auto& bn = whole.bias_names();  // every MoE block's (all stages keep all biases)
  for (size_t i = 0; i < bn.size(); ++i) {
    ASSIGN_OR_RETURN(model_->biases()[i], read_model(bn[i], {mc_.n_routed_experts}));
  }
  if (zero_->stage() == 0) {
    ops::CopyToDevice(m_.data(), lm.data(), lm.size() * sizeof(float));
    ops::CopyToDevice(v_.data(), lv.data(), lv.size() * sizeof(float));
  } else {
    for (const Segment& s : zero_->segments()) {
      ops::CopyToDevice(m_.data() + s.packed, lm.data() + s.offset + s.own_begin, s.own_count * sizeof(float));
      ops::CopyToDevice(v_.data() + s.packed, lv.data() + s.offset + s.own_begin, s.own_count * sizeof(float));
    }
  }
  zero_->AdoptParams();
  return Status::Ok();
}

}  // namespace myriad
