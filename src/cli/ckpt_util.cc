#include "cli/ckpt_util.h"

#include "train/checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace myriad::cli {

Result<LoadedModel> LoadModelFromCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(Env::Default(), path));
  const auto& meta = ck.manifest;
  if (!meta.contains("model_config"))
    return Status::Error(ck.dir + "/manifest.json: no model_config (hint: not a Myriad training checkpoint)");
  ASSIGN_OR_RETURN(ModelConfig mc, ModelConfig::FromJson(meta["model_config"]));
  LoadedModel out;
  out.model = std::make_unique<Model>(mc);
  RETURN_IF_ERROR(RestoreModel(ck, out.model.get()));
  if (meta.contains("train_config")) {
    const auto& t = meta["train_config"];
    out.train.seq_len = t.value("seq_len", out.train.seq_len);
    out.train.batch_size = t.value("batch_size", out.train.batch_size);
    out.train.data_dir = t.value("data_dir", out.train.data_dir);
  }
  out.tokenizer_path = meta.value("tokenizer", std::string());
  out.dir = ck.dir;
  out.step = ck.step;
  return out;
}

}  // namespace myriad::cli
