// Loading a trained model (and its tokenizer) from a checkpoint, for the
// verbs that use one: eval and generate.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/train_config.h"

namespace myriad::cli {

struct LoadedModel {
  std::unique_ptr<Model> model;
  TrainConfig train;
  std::string dir;             // the step directory
  std::string tokenizer_path;  // from the manifest
  int64_t step = 0;
};

Result<LoadedModel> LoadModelFromCheckpoint(const std::string& path);

}  // namespace myriad::cli
