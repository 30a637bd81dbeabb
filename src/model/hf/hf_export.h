// A Myriad model as a Hugging Face model folder (`myriad export --hf`,
// docs/open-models.md): config.json in the family's own keys,
// model.safetensors (or shards and model.safetensors.index.json),
// generation_config.json and the tokenizer files of the model's tokenizer.
//
// The family is chosen from the config, as the inverse of MapHfConfig
// (hf_model.h): MapHfConfig(HfConfigFor(c)).config == c for every config
// the import produces, and every other config exports only where a family
// computes the same function:
//   dense, no q/k/v biases, no q/k norms      -> LlamaForCausalLM
//   dense with q/k/v biases                    -> Qwen2ForCausalLM
//   dense with per-head q/k norms              -> Qwen3ForCausalLM
//   MoE: softmax scores, no shared experts, no groups, scale 1, q/k norms,
//        no selection bias                     -> Qwen3MoeForCausalLM
//   multi-head latent attention (MLA, model.kv_lora_rank > 0), dense or MoE
//   (sigmoid scores, shared experts, groups, a routing scale, a dense prefix,
//   MTP modules)                               -> DeepseekV3ForCausalLM
//   MoE with shared experts, sigmoid scores, groups or a routing scale but
//   GQA attention: refused (DeepSeek-V3's attention is MLA)
// Anything else is refused with one line naming the feature that has no
// equivalent ("shared experts (model.n_shared_experts=1) ... have no
// Qwen3MoeForCausalLM equivalent ..."): never a folder that computes another
// function. Training-only keys (aux_loss_weight, bias_update_rate,
// mtp_loss_weight, dsa_warmup_steps) have no HF key and are not exported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/status.h"
#include "model/config.h"
#include "model/model.h"

namespace myriad::hf {

struct HfExportOptions {
  // "F32", or "BF16"/"F16" when every weight converts exactly (a model
  // imported from such a folder); WriteHfWeights refuses a rounding.
  std::string dtype = "F32";
  // Shard size, as transformers' save_pretrained (max_shard_size "5GB").
  uint64_t max_shard_bytes = 5'000'000'000;
  // Export the main model of a model with MTP modules, without them (no
  // family but DeepSeek-V3 has MTP layers; they do not change the logits).
  bool drop_mtp = false;
  // DeepSeek-V3: q's and k_pe's RoPE rows in interleaved pairs (2i, 2i+1),
  // config.json's rope_interleave, as DeepSeek's own folders have them;
  // false keeps our rotate-half rows (i, i + d/2).
  bool rope_interleave = true;
  // config.json's and generation_config.json's bos/eos ids (-1 / empty: unknown, not written).
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // A tokenizer file or a folder: the Hugging Face tokenizer files beside it
  // (tokenizer.json, tokenizer_config.json, tokenizer.model, ...;
  // TokenizerFileNames) are copied. "" copies none.
  std::string tokenizer_from;
  // Replace an existing non-empty out_dir (else refused).
  bool overwrite = false;
};

// The file names copied as a model's tokenizer.
const std::vector<std::string>& TokenizerFileNames();

// The config.json of the family `cfg` maps to exactly, or why none does.
Result<nlohmann::ordered_json> HfConfigFor(const ModelConfig& cfg, const HfExportOptions& options = {});

// Writes `model` as a Hugging Face folder at out_dir. Everything is written
// into out_dir.tmp first (each file atomically and fsynced) and renamed into
// place at the end, so a failure leaves out_dir as it was; an existing
// non-empty out_dir is refused unless options.overwrite. Besides
// HfConfigFor's refusals, a model whose MoE blocks hold a non-zero selection
// bias (trained with bias_update_rate > 0) is refused for families without
// one (DeepSeek-V3 stores it as mlp.gate.e_score_correction_bias). The
// weights are in the family's layout (FromOurLayout), with DeepSeek's MTP
// layers' own embed_tokens and shared_head.head copies. Progress goes to the
// log (stderr).
Status ExportHfModel(const Model& model, const std::string& out_dir, const HfExportOptions& options = {},
                     Env* env = Env::Default());

}  // namespace myriad::hf
