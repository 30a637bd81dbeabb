// Hugging Face model folders as Myriad models (docs/open-models.md): the
// config.json of LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// Qwen3MoeForCausalLM and DeepseekV3ForCausalLM mapped to a ModelConfig, and
// the folder's weights (HfWeights) loaded into a Model under the same names.
//
// Never a silently different model: a config key this import does not know,
// a feature value it does not implement (an o_proj bias, sliding windows, a
// rope type, MoE layers that are not one block after a dense prefix, ...)
// and a tensor in the folder that the model does not use are each refused
// with one line naming the file and the key or tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/config.h"
#include "model/hf/hf_weights.h"
#include "model/model.h"
#include "model/params.h"

namespace myriad::hf {

// The architectures the import maps, in config.json's spelling.
const std::vector<std::string>& SupportedArchitectures();

struct HfModelInfo {
  std::string dir;
  std::string architecture;  // config.json "architectures"[0]
  ModelConfig config;        // ours
  std::string torch_dtype;   // as config.json gives it ("" when absent)
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;  // config.json's, else generation_config.json's
  nlohmann::json hf_config;  // config.json as read
  // DeepSeek-V3: RoPE pairs (2i, 2i+1) in the checkpoint's q and k_pe rows;
  // LoadHfModel reorders those rows into our rotate-half pairs (i, i + d/2).
  bool rope_interleave = false;
};

// Reads and maps DIR/config.json (and generation_config.json's eos ids).
Result<HfModelInfo> ReadHfConfig(const std::string& dir);
// The same from a parsed config.json; `source` names it in errors.
Result<HfModelInfo> MapHfConfig(const nlohmann::json& config, const std::string& source);

// The Hugging Face name of one of our tensor names (layout params and the
// selection-bias buffers): the same name but for MTP modules, which DeepSeek
// stores as extra layers (model.mtp.J.block.X -> model.layers.(L+J).X).
std::string HfTensorName(const ModelConfig& cfg, const std::string& ours);

// A Hugging Face tensor (as read, or a gradient of it) into our layout of
// the same parameter p, where the two differ (DeepSeek-V3, docs/open-models.md):
// the RoPE rows of q and of k_pe de-interleaved (info.rope_interleave), and an
// MTP eh_proj's column halves swapped (DeepSeek's input is [embedding;
// hidden], ours [hidden; embedding]). Both are permutations; a no-op elsewhere.
void ToOurLayout(const HfModelInfo& info, const ParamInfo& p, std::vector<float>* v);
// The inverse: our layout of p back into the folder's (the export), with
// RoPE rows re-interleaved where info.rope_interleave.
// FromOurLayout(ToOurLayout(v)) == v bit for bit.
void FromOurLayout(const HfModelInfo& info, const ParamInfo& p, std::vector<float>* v);

// A folder's weights under our names, for loaders that place them
// themselves: LoadHfModel, and the trainer's train.init_from, where each
// rank copies its shard of every whole tensor. Open reads and maps the
// config (ReadHfConfig) and the weights (HfWeights) and checks that every
// tensor the model needs is there, that DeepSeek's MTP layers' own
// embedding and head copies equal the main ones (ours share them), and that
// the folder holds no tensor it does not use, each with one line naming it.
class HfModelReader {
 public:
  static Result<HfModelReader> Open(const std::string& dir);
  const HfModelInfo& info() const { return info_; }
  // Our parameter or selection-bias buffer `ours` (HfTensorName) with
  // `shape`, as fp32 in our layout (ToOurLayout); a selection bias the folder does not hold reads as
  // zeros (Qwen3-MoE has none). Const: safe from several threads.
  Result<std::vector<float>> Read(const std::string& ours, const std::vector<int64_t>& shape) const;

 private:
  HfModelReader(HfModelInfo info, HfWeights weights) : info_(std::move(info)), weights_(std::move(weights)) {}
  HfModelInfo info_;
  HfWeights weights_;
};

// The folder's model: config and every weight, converted to fp32 exactly.
Result<std::unique_ptr<Model>> LoadHfModel(const std::string& dir, HfModelInfo* info = nullptr);

}  // namespace myriad::hf
