#include "train/train_config.h"

namespace myriad {

TrainConfig TrainConfig::Read(ConfigDoc* doc) {
  TrainConfig c;
  c.seq_len = doc->GetInt("train.seq_len", c.seq_len);
  c.batch_size = doc->GetInt("train.batch_size", c.batch_size);
  c.grad_accum = doc->GetInt("train.grad_accum", c.grad_accum);
  c.steps = doc->GetInt("train.steps", c.steps);
  c.optim.steps = c.steps;
  c.optim.lr = doc->GetFloat("train.lr", c.optim.lr);
  c.optim.min_lr = doc->GetFloat("train.min_lr", c.optim.lr * 0.1);
  c.optim.warmup_steps = doc->GetInt("train.warmup_steps", c.optim.warmup_steps);
  c.optim.weight_decay = doc->GetFloat("train.weight_decay", c.optim.weight_decay);
  c.optim.beta1 = doc->GetFloat("train.beta1", c.optim.beta1);
  c.optim.beta2 = doc->GetFloat("train.beta2", c.optim.beta2);
  c.optim.eps = doc->GetFloat("train.adam_eps", c.optim.eps);
  c.optim.grad_clip = doc->GetFloat("train.grad_clip", c.optim.grad_clip);
  c.seed = static_cast<uint64_t>(doc->GetInt("train.seed", static_cast<int64_t>(c.seed)));
  c.log_every = doc->GetInt("train.log_every", c.log_every);
  c.eval_every = doc->GetInt("train.eval_every", c.eval_every);
  c.eval_batches = doc->GetInt("train.eval_batches", c.eval_batches);
  c.ckpt_every = doc->GetInt("train.ckpt_every", c.ckpt_every);
  c.keep_last = doc->GetInt("train.keep_last", c.keep_last);
  c.threads = doc->GetInt("train.threads", c.threads);
  c.out_dir = doc->GetString("train.out_dir", c.out_dir);
  c.metrics_file = doc->GetString("train.metrics_file", c.metrics_file);
  c.precision = doc->GetString("train.precision", c.precision);
  c.async_checkpoint = doc->GetBool("train.async_checkpoint", c.async_checkpoint);
  c.snapshot_dir = doc->GetString("train.snapshot_dir", c.snapshot_dir);
  c.health_check = doc->GetBool("train.health_check", c.health_check);
  c.loss_spike_factor = doc->GetFloat("train.loss_spike_factor", c.loss_spike_factor);
  c.data_dir = doc->GetString("data.dir", c.data_dir);
  auto& pc = c.parallel;
  pc.dp = static_cast<int>(doc->GetInt("parallel.dp", pc.dp));
  pc.tp = static_cast<int>(doc->GetInt("parallel.tp", pc.tp));
  pc.pp = static_cast<int>(doc->GetInt("parallel.pp", pc.pp));
  pc.ep = static_cast<int>(doc->GetInt("parallel.ep", pc.ep));
  pc.cp = static_cast<int>(doc->GetInt("parallel.cp", pc.cp));
  pc.zero = static_cast<int>(doc->GetInt("parallel.zero", pc.zero));
  pc.microbatches = static_cast<int>(doc->GetInt("parallel.microbatches", pc.microbatches));
  pc.pp_layers = doc->GetString("parallel.pp_layers", pc.pp_layers);
  pc.ranks_per_node = static_cast<int>(doc->GetInt("parallel.ranks_per_node", pc.ranks_per_node));
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
  if (!(optim.lr > 0)) return bad("train.lr must be positive (hint: 3e-4 is a common start)");
  if (optim.min_lr < 0 || optim.min_lr > optim.lr)
    return bad("train.min_lr must be in [0, train.lr]");
  if (optim.warmup_steps < 0) return bad("train.warmup_steps must be >= 0");
  if (optim.beta1 < 0 || optim.beta1 >= 1 || optim.beta2 < 0 || optim.beta2 >= 1)
    return bad("train.beta1 and train.beta2 must be in [0, 1)");
  if (optim.grad_clip < 0) return bad("train.grad_clip must be >= 0 (0 disables clipping)");
  if (precision != "fp32" && precision != "bf16" && precision != "auto")
    return bad("train.precision=\"" + precision + "\" is not known (hint: \"auto\", \"fp32\" or \"bf16\")");
  if (log_every < 1) return bad("train.log_every must be at least 1");
  if (loss_spike_factor != 0 && !(loss_spike_factor > 1))
    return bad("train.loss_spike_factor must be 0 (off) or above 1 (hint: 3)");
  if (parallel.zero < 0 || parallel.zero > 3)
    return bad("parallel.zero=" + std::to_string(parallel.zero) + " is not a ZeRO stage (hint: 0, 1, 2 or 3)");
  if (parallel.compression != "none" && parallel.compression != "bf16" && parallel.compression != "int8")
    return bad("parallel.compression=\"" + parallel.compression + "\" is not known (hint: \"none\", \"bf16\" or \"int8\")");
  if (parallel.ranks_per_node < 0) return bad("parallel.ranks_per_node must be >= 0 (0: real machines)");
  if (parallel.microbatches < 0) return bad("parallel.microbatches must be >= 0 (0: twice the pipeline depth)");
  return Status::Ok();
}

Status TrainConfig::ValidateLayout(const ModelConfig& m, int world_size) const {
  LayoutBatch b;
  b.seq_len = seq_len;
  b.sequences = batch_size * grad_accum;
  b.microbatches = parallel.pipeline_microbatches();
  return parallel.Validate(world_size, m, b).With("parallel");
}

nlohmann::json TrainConfig::ToJson() const {
  return {{"seq_len", seq_len}, {"batch_size", batch_size}, {"grad_accum", grad_accum},
          {"steps", steps}, {"lr", optim.lr}, {"min_lr", optim.min_lr},
          {"warmup_steps", optim.warmup_steps}, {"weight_decay", optim.weight_decay},
          {"beta1", optim.beta1}, {"beta2", optim.beta2}, {"adam_eps", optim.eps},
          {"grad_clip", optim.grad_clip}, {"seed", seed}, {"out_dir", out_dir},
          {"data_dir", data_dir}, {"precision", precision},
          {"parallel", {{"dp", parallel.dp}, {"tp", parallel.tp}, {"pp", parallel.pp}, {"ep", parallel.ep},
                        {"cp", parallel.cp}, {"zero", parallel.zero}, {"microbatches", parallel.microbatches}, {"pp_layers", parallel.pp_layers},
                        {"ranks_per_node", parallel.ranks_per_node}, {"hierarchical", parallel.hierarchical},
                        {"compression", parallel.compression}}}};
}

}  // namespace myriad
