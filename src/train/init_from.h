// train.init_from: a run that starts from another model's weights
// (fine-tuning; docs/open-models.md, "Fine-tuning an imported model").
//
// The source is a Hugging Face folder (config.json and safetensors: the
// import's families) or a Myriad checkpoint (a run directory, following
// `latest`, or a step directory: one `myriad import` wrote, or any run's).
// The model config is the source's; a config's [model] section may be left
// out, and every [model] key it does give must agree with the source's,
// except the training-only keys (ModelConfig::WithTrainingKeysOf), which
// it may set. The run gets the weights only: a fresh optimizer, step 0, a
// fresh data cursor, its own out_dir; every rank copies its shard of each
// whole tensor (DistTrainer::RestoreWeights / Restore), so any layout the
// model allows can start from one folder.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/env.h"
#include "core/status.h"
#include "model/config.h"

namespace myriad {

class DistTrainer;

struct InitSource {
  std::string path;
  bool hf = false;      // a Hugging Face folder (else a checkpoint)
  ModelConfig config;   // the source's model
  // The manifest's "hf" record of a Hugging Face model (as `myriad import`
  // writes it: architecture, source, dir, torch_dtype, bos/eos ids), carried
  // into the fine-tune's checkpoints so that generate, serve and export
  // treat them as that model; null for our own.
  nlohmann::json hf_record;
};

// Reads the source's model config (config.json, or the checkpoint's
// manifest.json) without its weights. The source must stay in place while
// the run resumes (each start reads it).
Result<InitSource> ResolveInitSource(Env* env, const std::string& path);

// [model] of `doc` over the source's config; a key that changes the model
// is refused, naming each such key with both values.
Result<ModelConfig> ModelConfigFromInitSource(ConfigDoc* doc, const InitSource& src);

// Every rank loads its shard of the source's weights (collective in the
// sense that every rank must call it; no communication).
Status LoadInitWeights(Env* env, const InitSource& src, DistTrainer* trainer);

}  // namespace myriad
