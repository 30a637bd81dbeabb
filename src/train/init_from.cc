#include "train/init_from.h"

#include <filesystem>

#include "model/hf/hf_model.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/manifest.h"
#include "train/dist_train.h"

namespace myriad {

Result<InitSource> ResolveInitSource(Env* env, const std::string& path) {
  namespace fs = std::filesystem;
  InitSource src;
  src.path = path;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::Error("train.init_from=" + path + ": not found (hint: a Hugging Face model folder, or a run or "
                         "step directory)");
  if (fs::is_regular_file(fs::path(path) / "config.json", ec) && !fs::exists(fs::path(path) / kCheckpointManifest, ec)) {
    src.hf = true;
    ASSIGN_OR_RETURN(hf::HfModelInfo info, hf::ReadHfConfig(path));
    src.config = info.config;
    const std::string abs = fs::absolute(path, ec).lexically_normal().string();
    src.hf_record = {{"architecture", info.architecture}, {"source", abs}, {"dir", abs},
                     {"torch_dtype", info.torch_dtype}, {"bos_token_id", info.bos_token_id},
                     {"eos_token_ids", info.eos_token_ids}};
    return src;
  }
  auto dir = ResolveCheckpointDir(env, path);
  if (!dir.ok())
    return Status::Error("train.init_from=" + path + ": neither a Hugging Face folder (config.json) nor a checkpoint: " +
                         dir.status().message());
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(env, *dir));
  if (!m.json.contains("model_config"))
    return Status::Error(*dir + "/" + kCheckpointManifest + ": no model_config (hint: not a Myriad checkpoint)");
  auto mc = ModelConfig::FromJson(m.json["model_config"]);
  if (!mc.ok()) return mc.status().With(*dir);
  src.config = *mc;
  if (m.json.contains("hf")) src.hf_record = m.json["hf"];
  return src;
}

Result<ModelConfig> ModelConfigFromInitSource(ConfigDoc* doc, const InitSource& src) {
  const ModelConfig merged = ModelConfig::Read(doc, &src.config);
  const ModelConfig expected = src.config.WithTrainingKeysOf(merged);
  const nlohmann::json got = merged.ToJson(), want = expected.ToJson();
  if (got == want) return merged;
  std::string keys;
  nlohmann::json all = want;
  all.update(got);
  for (auto it = all.begin(); it != all.end(); ++it) {
    const std::string& k = it.key();
    const std::string g = got.contains(k) ? got[k].dump() : "(default)", w = want.contains(k) ? want[k].dump() : "(default)";
    if (g != w) keys += (keys.empty() ? "" : ", ") + ("model." + k + "=" + g + " (the model's: " + w + ")");
  }
  return Status::Error(doc->source() + ": [model] conflicts with the model of train.init_from=" + src.path + ": " + keys +
                       " (hint: leave [model] out, or set only the training-only keys aux_loss_weight, "
                       "bias_update_rate, mtp_loss_weight, init_std, dsa_warmup_steps)");
}

Status LoadInitWeights(Env* env, const InitSource& src, DistTrainer* trainer) {
  if (src.hf) {
    ASSIGN_OR_RETURN(hf::HfModelReader reader, hf::HfModelReader::Open(src.path));
    return trainer->RestoreWeights([&reader](const std::string& name, const std::vector<int64_t>& shape) {
      return reader.Read(name, shape);
    });
  }
  ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(env, src.path));
  return trainer->Restore(ck, /*with_optimizer=*/false);
}

}  // namespace myriad
