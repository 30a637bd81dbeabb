#include "train/train_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/checked_size.h"

namespace myriad {

// The ranges of [train]'s and [parallel]'s integer keys (docs/config.md,
// "Ranges"); a value outside is refused at read, before any cast to int.
namespace {
constexpr int64_t kMaxSteps = 1000000000;  // steps and step intervals
constexpr int64_t kMaxDegree = 65536;      // each parallel degree
constexpr int64_t kMaxRanks = 1 << 20;     // their product
}  // namespace

TrainConfig TrainConfig::Read(ConfigDoc* doc) {
  TrainConfig c;
  c.seq_len = doc->GetInt("train.seq_len", c.seq_len, 2, int64_t{1} << 24);
  c.batch_size = doc->GetInt("train.batch_size", c.batch_size, 1, int64_t{1} << 20);
  c.grad_accum = doc->GetInt("train.grad_accum", c.grad_accum, 1, 65536);
  c.steps = doc->GetInt("train.steps", c.steps, 1, kMaxSteps);
  c.optim.steps = c.steps;
  c.optim.lr = doc->GetFloat("train.lr", c.optim.lr);
  c.optim.min_lr = doc->GetFloat("train.min_lr", c.optim.lr * 0.1);
  c.optim.warmup_steps = doc->GetInt("train.warmup_steps", c.optim.warmup_steps, 0, kMaxSteps);
  c.optim.weight_decay = doc->GetFloat("train.weight_decay", c.optim.weight_decay);
  c.optim.beta1 = doc->GetFloat("train.beta1", c.optim.beta1);
  c.optim.beta2 = doc->GetFloat("train.beta2", c.optim.beta2);
  c.optim.eps = doc->GetFloat("train.adam_eps", c.optim.eps);
  c.optim.grad_clip = doc->GetFloat("train.grad_clip", c.optim.grad_clip);
  c.seed = static_cast<uint64_t>(
      doc->GetInt("train.seed", static_cast<int64_t>(c.seed), 0, std::numeric_limits<int64_t>::max()));
  c.log_every = doc->GetInt("train.log_every", c.log_every, 1, kMaxSteps);
  c.eval_every = doc->GetInt("train.eval_every", c.eval_every, 0, kMaxSteps);
  c.eval_batches = doc->GetInt("train.eval_batches", c.eval_batches, 0, 100000);
  c.ckpt_every = doc->GetInt("train.ckpt_every", c.ckpt_every, 0, kMaxSteps);
  c.keep_last = doc->GetInt("train.keep_last", c.keep_last, 0, 10000);
  c.threads = doc->GetInt("train.threads", c.threads, 0, 1024);
  c.out_dir = doc->GetString("train.out_dir", c.out_dir);
  c.metrics_file = doc->GetString("train.metrics_file", c.metrics_file);
  c.init_from = doc->GetString("train.init_from", c.init_from);
  c.precision = doc->GetString("train.precision", c.precision);
  c.async_checkpoint = doc->GetBool("train.async_checkpoint", c.async_checkpoint);
  c.snapshot_dir = doc->GetString("train.snapshot_dir", c.snapshot_dir);
  c.health_check = doc->GetBool("train.health_check", c.health_check);
  c.loss_spike_factor = doc->GetFloat("train.loss_spike_factor", c.loss_spike_factor);
  c.data_dir = doc->GetString("data.dir", c.data_dir);
  auto& pc = c.parallel;
  auto get_int = [&](const char* key, int def, int64_t lo, int64_t hi) {
    return static_cast<int>(doc->GetInt(key, def, lo, hi));  // in range: the cast keeps the value
  };
  pc.dp = get_int("parallel.dp", pc.dp, 1, kMaxDegree);
  pc.tp = get_int("parallel.tp", pc.tp, 1, kMaxDegree);
  pc.pp = get_int("parallel.pp", pc.pp, 1, kMaxDegree);
  pc.ep = get_int("parallel.ep", pc.ep, 1, kMaxDegree);
  pc.cp = get_int("parallel.cp", pc.cp, 1, kMaxDegree);
  pc.zero = get_int("parallel.zero", pc.zero, 0, 3);
  pc.microbatches = get_int("parallel.microbatches", pc.microbatches, 0, 65536);
  pc.pp_layers = doc->GetString("parallel.pp_layers", pc.pp_layers);
  pc.ranks_per_node = get_int("parallel.ranks_per_node", pc.ranks_per_node, 0, 65536);
  pc.hierarchical = doc->GetBool("parallel.hierarchical", pc.hierarchical);
  pc.compression = doc->GetString("parallel.compression", pc.compression);
  return c;
}

Status TrainConfig::Validate() const {
  auto bad = [](const std::string& m) { return Status::Error(m); };
  if (seq_len < 2) return bad("train.seq_len=" + std::to_string(seq_len) + " must be at least 2");
  if (batch_size < 1) return bad("train.batch_size=" + std::to_string(batch_size) + " must be at least 1");
  if (grad_accum < 1) return bad("train.grad_accum=" + std::to_string(grad_accum) + " must be at least 1");
  if (steps < 1) return bad("train.steps=" + std::to_string(steps) + " must be at least 1");
  // Floats: finite (a config read by ConfigDoc is; one built in code may not
  // be), and each comparison written so that NaN fails it.
  for (auto [name, v] : {std::pair{"lr", optim.lr}, {"min_lr", optim.min_lr}, {"weight_decay", optim.weight_decay},
                         {"beta1", optim.beta1}, {"beta2", optim.beta2}, {"adam_eps", optim.eps},
                         {"grad_clip", optim.grad_clip}, {"loss_spike_factor", loss_spike_factor}})
    if (!std::isfinite(v)) return bad(std::string("train.") + name + "=" + std::to_string(v) + " must be a finite number");
  if (!(optim.lr > 0)) return bad("train.lr must be positive (hint: 3e-4 is a common start)");
  if (!(optim.min_lr >= 0 && optim.min_lr <= optim.lr))
    return bad("train.min_lr must be in [0, train.lr]");
  if (optim.warmup_steps < 0) return bad("train.warmup_steps must be >= 0");
  if (!(optim.weight_decay >= 0)) return bad("train.weight_decay must be >= 0");
  if (!(optim.beta1 >= 0 && optim.beta1 < 1 && optim.beta2 >= 0 && optim.beta2 < 1))
    return bad("train.beta1 and train.beta2 must be in [0, 1)");
  if (!(optim.eps > 0)) return bad("train.adam_eps must be positive (hint: 1e-8)");
  if (!(optim.grad_clip >= 0)) return bad("train.grad_clip must be >= 0 (0 disables clipping)");
  if (precision != "fp32" && precision != "bf16" && precision != "auto")
    return bad("train.precision=\"" + precision + "\" is not known (hint: \"auto\", \"fp32\" or \"bf16\")");
  if (log_every < 1) return bad("train.log_every must be at least 1");
  if (keep_last < 0) return bad("train.keep_last=" + std::to_string(keep_last) + " must be >= 0 (0 keeps every checkpoint)");
  if (loss_spike_factor != 0 && !(loss_spike_factor > 1))
    return bad("train.loss_spike_factor must be 0 (off) or above 1 (hint: 3)");
  if (parallel.zero < 0 || parallel.zero > 3)
    return bad("parallel.zero=" + std::to_string(parallel.zero) + " is not a ZeRO stage (hint: 0, 1, 2 or 3)");
  if (parallel.compression != "none" && parallel.compression != "bf16" && parallel.compression != "int8")
    return bad("parallel.compression=\"" + parallel.compression + "\" is not known (hint: \"none\", \"bf16\" or \"int8\")");
  if (parallel.ranks_per_node < 0) return bad("parallel.ranks_per_node must be >= 0 (0: real machines)");
  if (parallel.microbatches < 0) return bad("parallel.microbatches must be >= 0 (0: twice the pipeline depth)");
  // The degrees' product (ParallelDims::world() is an int) must not wrap.
  CheckedSize ranks(1);
  for (auto [name, v] : {std::pair{"parallel.dp", parallel.dp}, {"parallel.tp", parallel.tp},
                         {"parallel.pp", parallel.pp}, {"parallel.ep", parallel.ep}, {"parallel.cp", parallel.cp}})
    ranks = ranks * CheckedSize::Key(name, std::max(v, 1));
  return ranks.Check("parallel: dp*tp*pp*ep*cp (the ranks)", kMaxRanks);
}

Status TrainConfig::CheckSizes(const ModelConfig& m) const {
  // What one step allocates from [train] x [model] (the memory estimate,
  // train/memory_estimate.h, prices it; this only makes sure no size wraps):
  // the tokens of a step, and per token the activations of every layer
  // (bounded by the estimate's per-token floats) and the logits.
  using S = CheckedSize;
  const S tokens = S::Key("train.batch_size", batch_size) * S::Key("train.grad_accum", grad_accum) *
                   S::Key("train.seq_len", seq_len);
  const S C = S::Key("model.d_model", m.d_model), L = S::Key("model.n_layers", m.n_layers) + S(m.mtp_depth + 1);
  const S per_layer = S(16) * C + S(4) * S::Key("model.d_ff", m.d_ff) + S(2) * S::Key("model.n_routed_experts", m.n_routed_experts) +
                      S::Key("model.top_k", m.top_k) * (S(2) * C + S(4) * S::Key("model.d_expert", m.d_expert)) +
                      S(4) * S::Key("model.n_shared_experts", m.n_shared_experts) * S::Key("model.d_expert", m.d_expert);
  const S logits = S(2) * S::Key("model.vocab_size", m.vocab_size) * S(m.mtp_depth + 1);
  return (S(8) * tokens * (L * per_layer + logits)).Check("train: one step's activations' size");
}

Status TrainConfig::ValidateLayout(const ModelConfig& m, int world_size) const {
  LayoutBatch b;
  b.seq_len = seq_len;
  b.sequences = batch_size * grad_accum;
  b.microbatches = parallel.pipeline_microbatches();
  return parallel.Validate(world_size, m, b).With("parallel");
}

nlohmann::json TrainConfig::ToJson() const {
  nlohmann::json j = {{"seq_len", seq_len}, {"batch_size", batch_size}, {"grad_accum", grad_accum},
          {"steps", steps}, {"lr", optim.lr}, {"min_lr", optim.min_lr},
          {"warmup_steps", optim.warmup_steps}, {"weight_decay", optim.weight_decay},
          {"beta1", optim.beta1}, {"beta2", optim.beta2}, {"adam_eps", optim.eps},
          {"grad_clip", optim.grad_clip}, {"seed", seed}, {"out_dir", out_dir},
          {"data_dir", data_dir}, {"precision", precision},
          {"parallel", {{"dp", parallel.dp}, {"tp", parallel.tp}, {"pp", parallel.pp}, {"ep", parallel.ep},
                        {"cp", parallel.cp}, {"zero", parallel.zero}, {"microbatches", parallel.microbatches}, {"pp_layers", parallel.pp_layers},
                        {"ranks_per_node", parallel.ranks_per_node}, {"hierarchical", parallel.hierarchical},
                        {"compression", parallel.compression}}}};
  if (!init_from.empty()) j["init_from"] = init_from;
  return j;
}

}  // namespace myriad
