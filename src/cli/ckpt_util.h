// Loading a model (and its tokenizer) for the verbs that use one: eval,
// generate and serve. From a Myriad checkpoint (--ckpt: a run written by
// `myriad train`, or by `myriad import` from a Hugging Face folder), or
// directly from a Hugging Face folder (--hf).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/train_config.h"

namespace myriad::cli {

struct LoadedModel {
  std::unique_ptr<Model> model;
  TrainConfig train;
  std::string dir;             // the step directory, or the Hugging Face folder
  std::string tokenizer_path;  // from the manifest, or the Hugging Face folder
  int64_t step = 0;
  // A Hugging Face model (imported or direct): the folder with its side
  // files (tokenizer, chat template, generation config); empty for our own.
  std::string hf_dir;
  std::string architecture;             // config.json's, for Hugging Face models
  std::vector<int64_t> eos_token_ids;   // the model's own (Hugging Face models)
};

Result<LoadedModel> LoadModelFromCheckpoint(const std::string& path);
// A Hugging Face folder (config.json + safetensors), as hf::LoadHfModel.
Result<LoadedModel> LoadModelFromHf(const std::string& dir);
// Exactly one of `ckpt` and `hf` is given (the verbs' --ckpt / --hf).
Result<LoadedModel> LoadModelFor(const std::string& ckpt, const std::string& hf);

}  // namespace myriad::cli
