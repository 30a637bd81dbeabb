// myriad export SOURCE --hf OUT: a run's checkpoint (or a Hugging Face
// folder) as a Hugging Face model folder (model/hf/hf_export.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "cli/ckpt_util.h"
#include "cli/verbs.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "model/hf/hf_export.h"
#include "model/hf/hf_model.h"

namespace myriad::cli {
namespace {

// The model to export, with its tokenizer and bos/eos ids.
struct Source {
  std::unique_ptr<Model> model;
  std::string tokenizer;  // "" none
  int64_t bos = -1;
  std::vector<int64_t> eos;
  bool rope_interleave = true;  // DeepSeek-V3's RoPE row layout: the source folder's, else DeepSeek's own
};

bool IsHfFolder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / "config.json", ec) && !fs::exists(fs::path(path) / "manifest.json", ec);
}

Result<Source> LoadSource(const std::string& path) {
  ASSIGN_OR_RETURN(LoadedModel lm, IsHfFolder(path) ? LoadModelFromHf(path) : LoadModelFromCheckpoint(path));
  LOG_INFO("export: read %s%s", lm.dir.c_str(), lm.architecture.empty() ? "" : (" (" + lm.architecture + ")").c_str());
  Source src;
  src.model = std::move(lm.model);
  src.eos = lm.eos_token_ids;
  src.tokenizer = lm.tokenizer_path;
  if (!lm.hf_dir.empty()) {
    // A Hugging Face model (direct, imported or fine-tuned from one): its
    // config.json's bos id, and a tokenizer only where the folder has one.
    if (auto info = hf::ReadHfConfig(lm.hf_dir); info.ok()) {
      src.bos = info->bos_token_id;
      if (info->config.mla()) src.rope_interleave = info->rope_interleave;
      if (src.eos.empty()) src.eos = info->eos_token_ids;
    }
    namespace fs = std::filesystem;
    std::error_code ec;
    if (src.tokenizer == lm.hf_dir) {
      bool any = false;
      for (const std::string& name : hf::TokenizerFileNames()) any |= fs::exists(fs::path(lm.hf_dir) / name, ec);
      if (!any) src.tokenizer.clear();
    }
  }
  return src;
}

}  // namespace

int RunExport(int argc, char** argv) {
  CLI::App app{"Write a run's checkpoint (or a Hugging Face folder) as a Hugging Face model folder: config.json in "
               "the family's keys, safetensors, generation_config.json and the tokenizer files",
               "myriad export"};
  std::string source, out, dtype = "f32", tokenizer;
  uint64_t max_shard = 5'000'000'000;
  bool force = false, drop_mtp = false, no_tokenizer = false;
  app.add_option("source", source, "run directory (follows latest), step directory, or Hugging Face folder")->required();
  app.add_option("--hf", out, "output folder")->required();
  app.add_option("--dtype", dtype, "f32, or bf16 / f16 when every weight is exactly such a value (an imported model)")
      ->capture_default_str()->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_option("--max-shard-size", max_shard, "largest shard, as transformers' max_shard_size (5GB, 500MB, bytes)")
      ->transform(CLI::AsSizeValue(true));
  app.add_option("--tokenizer", tokenizer, "tokenizer file or folder to copy (default: the run's or the folder's)");
  app.add_flag("--no-tokenizer", no_tokenizer, "copy no tokenizer files");
  app.add_flag("--drop-mtp", drop_mtp, "export without the MTP modules (no family but DeepSeek-V3 has them)");
  app.add_flag("--force", force, "replace OUT if it exists and is not empty");
  CLI11_PARSE(app, argc, argv);
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "myriad export: %s\n", m.c_str());
    return 1;
  };
  auto src = LoadSource(source);
  if (!src.ok()) return fail(src.status().message());
  hf::HfExportOptions opt;
  opt.dtype = dtype == "bf16" ? "BF16" : dtype == "f16" ? "F16" : "F32";
  opt.max_shard_bytes = max_shard;
  opt.drop_mtp = drop_mtp;
  opt.rope_interleave = src->rope_interleave;
  opt.overwrite = force;
  opt.bos_token_id = src->bos;
  opt.eos_token_ids = src->eos;
  opt.tokenizer_from = no_tokenizer ? "" : tokenizer.empty() ? src->tokenizer : tokenizer;
  if (!opt.tokenizer_from.empty()) {
    auto tok = Tokenizer::Load(opt.tokenizer_from);
    if (!tok.ok())
      return fail(tok.status().message() + " (hint: --tokenizer PATH names another, --no-tokenizer exports without one)");
    // A run's ids come from its tokenizer (a Hugging Face folder's from its config).
    if (opt.bos_token_id < 0 && tok->bos_id() >= 0) opt.bos_token_id = tok->bos_id();
    if (opt.eos_token_ids.empty() && tok->eos_id() >= 0) opt.eos_token_ids = {tok->eos_id()};
    if (tok->kind() == TokenizerKind::kMyriad)
      LOG_WARN("export: the tokenizer is Myriad's own (%s), copied as tokenizer.model: Myriad reads it back exactly; "
               "transformers' SentencePiece tokenizers would not split newlines and spaces as it does",
               opt.tokenizer_from.c_str());
  } else if (!no_tokenizer) {
    LOG_WARN("export: %s has no tokenizer; the folder will have none", source.c_str());
  }
  Status s = hf::ExportHfModel(*src->model, out, opt);
  if (!s.ok()) return fail(s.message());
  return 0;
}

}  // namespace myriad::cli
