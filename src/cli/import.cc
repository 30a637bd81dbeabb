// myriad import HF_DIR --out RUN_DIR: a Hugging Face model folder as a
// Myriad run directory. RUN_DIR/step_00000000 is a checkpoint (written by
// SaveCheckpoint: model.safetensors in fp32 under our names, the manifest
// with model_config and an "hf" record); RUN_DIR/hf holds the folder's side
// files (config.json, generation_config.json, tokenizer files, chat
// template), which generate, serve and eval use from there.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/verbs.h"
#include "core/env.h"
#include "data/tokenizer.h"
#include "model/hf/hf_export.h"
#include "model/hf/hf_model.h"
#include "train/checkpoint/checkpoint.h"

namespace myriad::cli {

namespace {

// The files of a Hugging Face folder besides its weights that Myriad keeps:
// its configs, and the tokenizer files (the export's list).
std::vector<std::string> SideFiles() {
  std::vector<std::string> v = {"config.json", "generation_config.json"};
  for (const std::string& t : hf::TokenizerFileNames()) v.push_back(t);
  return v;
}

}  // namespace

int RunImport(int argc, char** argv) {
  CLI::App app{"Import a Hugging Face model folder as a Myriad run directory (docs/open-models.md)", "myriad import"};
  std::string src, out;
  bool force = false;
  app.add_option("hf_dir", src, "the Hugging Face folder: config.json, model.safetensors or shards + index")
      ->required();
  app.add_option("--out,-o", out, "the run directory to write")->required();
  app.add_flag("--force", force, "replace RUN_DIR/step_00000000 and RUN_DIR/hf if they exist");
  CLI11_PARSE(app, argc, argv);
  namespace fs = std::filesystem;
  Env* env = Env::Default();
  const auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "myriad import: %s\n", msg.c_str());
    return 1;
  };
  std::error_code ec;
  if (fs::exists(fs::path(out) / CheckpointDirName(0), ec) && !force)
    return fail(out + " already holds an imported model (" + CheckpointDirName(0) +
                ") (hint: another --out, or --force to replace it)");

  const auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "myriad import: reading %s\n", src.c_str());
  hf::HfModelInfo info;
  auto model = hf::LoadHfModel(src, &info);
  if (!model.ok()) return fail(model.status().message());
  const ModelConfig& cfg = info.config;
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "myriad import: %s, %lld parameters (%s weights), read in %.1f s\n", info.architecture.c_str(),
               static_cast<long long>((*model)->num_params()),
               info.torch_dtype.empty() ? "unstated" : info.torch_dtype.c_str(), load_s);

  // Side files first: a tokenizer that does not load is refused before
  // anything is written.
  const fs::path hf_out = fs::absolute(fs::path(out) / "hf");
  const bool has_tokenizer =
      fs::exists(fs::path(src) / "tokenizer.json", ec) || fs::exists(fs::path(src) / "tokenizer.model", ec);
  if (has_tokenizer) {
    auto tok = Tokenizer::Load(src);
    if (!tok.ok()) return fail(tok.status().message());
    if (tok->vocab_size() > cfg.vocab_size)
      return fail(src + ": the tokenizer has " + std::to_string(tok->vocab_size()) + " ids but config.json's "
                  "vocab_size is " + std::to_string(cfg.vocab_size) + " (hint: a tokenizer of another model?)");
  } else {
    std::fprintf(stderr, "myriad import: warning: %s has no tokenizer (tokenizer.json or tokenizer.model); generate "
                 "and serve will need --tokenizer\n", src.c_str());
  }
  if (force && fs::exists(hf_out, ec)) {
    if (Status st = env->RemoveAll(hf_out.string()); !st.ok()) return fail(st.message());
  }
  if (Status st = env->CreateDirs(hf_out.string()); !st.ok()) return fail(st.message());
  for (const std::string& name : SideFiles()) {
    const fs::path from = fs::path(src) / name;
    if (!fs::exists(from, ec)) continue;
    auto bytes = env->ReadFile(from.string());
    if (!bytes.ok()) return fail(bytes.status().message());
    if (Status st = WriteFileAtomic(env, (hf_out / name).string(), *bytes); !st.ok()) return fail(st.message());
  }
  if (Status st = env->SyncDir(hf_out.string()); !st.ok()) return fail(st.message());

  // The checkpoint: every parameter (a tied head once) and the selection biases.
  const std::vector<float> host = (*model)->ParamsToHost();
  CheckpointData data;
  for (const ParamInfo& p : (*model)->layout().params()) {
    if (cfg.tie_embeddings && p.name == "lm_head.weight") continue;
    data.model.push_back({p.name, "F32", p.shape, host.data() + p.offset, static_cast<size_t>(p.numel) * 4});
  }
  const auto& bias_names = (*model)->layout().bias_names();
  for (size_t i = 0; i < bias_names.size(); ++i) {
    const auto& b = (*model)->biases()[i];
    data.model.push_back({bias_names[i], "F32", {static_cast<int64_t>(b.size())}, b.data(), b.size() * 4});
  }
  nlohmann::json hf_meta = {{"architecture", info.architecture}, {"source", fs::absolute(src).string()},
                            {"dir", hf_out.string()}, {"torch_dtype", info.torch_dtype},
                            {"bos_token_id", info.bos_token_id}, {"eos_token_ids", info.eos_token_ids}};
  data.meta = {{"model_config", cfg.ToJson()},
               {"parallel", {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"ep", 1}, {"cp", 1}}},
               {"hf", hf_meta}};
  if (has_tokenizer) data.meta["tokenizer"] = hf_out.string();
  auto saved = SaveCheckpoint(env, out, 0, data, /*keep_last=*/0);
  if (!saved.ok()) return fail(saved.status().message());
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "myriad import: wrote %s (and %s) in %.1f s\n", saved->c_str(), hf_out.string().c_str(),
               total_s);
  std::printf("%s\n", fs::absolute(out).string().c_str());
  return 0;
}

}  // namespace myriad::cli
