#include "cli/ckpt_util.h"

#include "model/hf/hf_model.h"
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
  if (meta.contains("hf") && meta["hf"].is_object()) {  // written by `myriad import`
    const auto& h = meta["hf"];
    out.hf_dir = h.value("dir", std::string());
    out.architecture = h.value("architecture", std::string());
    if (h.contains("eos_token_ids") && h["eos_token_ids"].is_array())
      for (const auto& e : h["eos_token_ids"])
        if (e.is_number_integer()) out.eos_token_ids.push_back(e.get<int64_t>());
  }
  out.dir = ck.dir;
  out.step = ck.step;
  return out;
}

Result<LoadedModel> LoadModelFromHf(const std::string& dir) {
  hf::HfModelInfo info;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, hf::LoadHfModel(dir, &info));
  LoadedModel out;
  out.model = std::move(model);
  out.dir = dir;
  out.hf_dir = dir;
  out.tokenizer_path = dir;
  out.architecture = info.architecture;
  out.eos_token_ids = info.eos_token_ids;
  return out;
}

Result<LoadedModel> LoadModelFor(const std::string& ckpt, const std::string& hf) {
  if (ckpt.empty() == hf.empty())
    return Status::Error("give exactly one of --ckpt RUN_DIR and --hf HF_DIR");
  return hf.empty() ? LoadModelFromCheckpoint(ckpt) : LoadModelFromHf(hf);
}

}  // namespace myriad::cli
