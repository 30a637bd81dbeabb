// myriad eval (--ckpt DIR | --hf HF_DIR) [--data DIR] [--batches N]: validation loss and perplexity.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/ckpt_util.h"
#include "cli/verbs.h"
#include "data/loader.h"
#include "train/trainer.h"

namespace myriad::cli {

int RunEval(int argc, char** argv) {
  CLI::App app{"Validation loss and perplexity of a checkpoint", "myriad eval"};
  std::string ckpt, hf, data;
  int64_t batches = 16, batch = 0, seq = 0;
  app.add_option("--ckpt", ckpt, "run directory or step directory (ours, or written by `myriad import`)");
  app.add_option("--hf", hf, "a Hugging Face model folder (then --data is needed)");
  app.add_option("--data", data, "prepared data directory (default: the one the run trained on)");
  app.add_option("--batches", batches, "number of validation batches")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch, "rows per batch (default: the run's)");
  app.add_option("--seq-len", seq, "tokens per row (default: the run's)");
  CLI11_PARSE(app, argc, argv);
  auto lm = LoadModelFor(ckpt, hf);
  if (!lm.ok()) {
    std::fprintf(stderr, "myriad eval: %s\n", lm.status().message().c_str());
    return 1;
  }
  if (data.empty()) data = lm->train.data_dir;
  if (data.empty()) {
    std::fprintf(stderr, "myriad eval: this model has no training data to evaluate on (hint: --data DIR, a folder "
                         "prepared with the model's tokenizer)\n");
    return 2;
  }
  const int B = static_cast<int>(batch > 0 ? batch : lm->train.batch_size);
  const int T = static_cast<int>(seq > 0 ? seq : lm->train.seq_len);
  if (T > lm->model->config().max_seq_len) {
    std::fprintf(stderr, "myriad eval: --seq-len %d exceeds the model's max_seq_len %lld\n", T,
                 static_cast<long long>(lm->model->config().max_seq_len));
    return 1;
  }
  auto val = DataLoader::Open(data, "val", T, 0);
  if (!val.ok()) {
    std::fprintf(stderr, "myriad eval: %s\n", val.status().message().c_str());
    return 1;
  }
  EvalResult r = Evaluate(*lm->model, **val, B, T, batches);
  std::printf("checkpoint %s (step %lld)\nval_loss   %.4f nats/token\nperplexity %.2f\ntokens     %lld\n",
              lm->dir.c_str(), static_cast<long long>(lm->step), r.loss, r.perplexity,
              static_cast<long long>(r.tokens));
  return 0;
}

}  // namespace myriad::cli
