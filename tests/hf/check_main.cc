// hf_check: our side of the Hugging Face tests (tests/hf/README.md): one
// program that loads a model, from a Hugging Face folder or from a run, and
// compares it.
//
//   hf_check parity (--hf DIR | --ckpt RUN_DIR) --ref REF.safetensors [--absorbed REF_ABS.safetensors]
//       (tests/hf/model_parity.sh) The model — a folder through LoadHfModel,
//       or the run `myriad import` wrote, through its checkpoint — against
//       the independent PyTorch reference tests/hf/hf_reference.py on the
//       same folder. REF is the reference's default run (--greedy N, and
//       --grads for the gradients); REF_ABS (MLA models) its --mla absorbed
//       run. Each figure is max |ours - theirs| / max |theirs| over the
//       tensor, at 1e-4 (fp32):
//         logits, loss   the training forward on the reference's tokens
//                        [B, T] (ours as Step over B sequences of T-1 inputs:
//                        the first T-1 positions' logits, the same B*(T-1)
//                        loss terms);
//         mtp_logits     with MTP modules: depth 1, its first T-2 rows (ours
//                        see T-1 positions); mtp_loss: ours is
//                        mtp_loss_weight times the reference's;
//         gradients      where REF has them (--grads): of every parameter,
//                        ours d(main + w * mtp)/dw against the reference's
//                        grad + w * mtp_grad (the MTP layers' embedding and
//                        head copies added to the main ones, which ours use),
//                        in our layout (hf::ToOurLayout, with the folder's
//                        layout: a run's is its import's hf/config.json);
//         greedy         the ids identical, and the logits they were chosen
//                        from, through InferenceSession (KV cache; MLA: the
//                        latent cache in the absorbed form), prompt at once;
//         decode         every position's logits of InferenceSession, one
//                        token at a time, against REF_ABS's logits (the
//                        absorbed reference), else REF's.
//       One line per figure; exit 1 when any is over its tolerance.
//   hf_check same A B
//       (tests/hf/export_roundtrip.sh) A and B are Hugging Face folders (B
//       exported from A): LoadHfModel reads the same architecture, the same
//       ModelConfig and bit-identical parameters and selection biases; every
//       tensor of A is in B with the same shape, and where its dtype is the
//       same, the same bytes (A's lm_head.weight aside when tied). One line,
//       exit 1 when not.
//   hf_check greedy SOURCE PROMPT N [LOGITS]
//       SOURCE is a Hugging Face folder or a checkpoint (run or step
//       directory); prints the N greedy ids (argmax, lowest id on ties)
//       after PROMPT (comma-separated ids) decoded with the KV cache, and
//       writes the logits each id was chosen from to LOGITS (raw
//       little-endian float32 [N, V]).
//   hf_check loss SOURCE DATA_DIR B T BATCHES
//       (tests/dist/hf_finetune.sh) prints the mean loss of SOURCE (a folder
//       or a checkpoint) over the first BATCHES validation batches [B, T+1]
//       of the prepared DATA_DIR (trainer.h's Evaluate, as `myriad eval`).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "data/loader.h"
#include "model/hf/hf_model.h"
#include "model/hf/hf_weights.h"
#include "model/inference.h"
#include "model/sampler.h"
#include "train/checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace myriad {
namespace {

int Fail(const std::string& m) {
  std::fprintf(stderr, "hf_check: %s\n", m.c_str());
  return 1;
}

// A Hugging Face folder (LoadHfModel) or a run's checkpoint, with the
// folder's layout: a folder's own, a run's import's (RUN_DIR/hf/config.json,
// the "hf" record `myriad import` writes), else ours.
Result<std::unique_ptr<Model>> LoadAny(const std::string& path, hf::HfModelInfo* info = nullptr) {
  if (std::filesystem::exists(path + "/config.json") && !std::filesystem::exists(path + "/manifest.json"))
    return hf::LoadHfModel(path, info);
  ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(Env::Default(), path));
  if (!ck.manifest.contains("model_config")) return Status::Error(ck.dir + ": no model_config in the manifest");
  ASSIGN_OR_RETURN(ModelConfig mc, ModelConfig::FromJson(ck.manifest["model_config"]));
  auto m = std::make_unique<Model>(mc);
  RETURN_IF_ERROR(RestoreModel(ck, m.get()));
  if (info) {
    info->config = mc;
    if (ck.manifest.contains("hf") && ck.manifest["hf"].is_object()) {
      const std::string dir = ck.manifest["hf"].value("dir", std::string());
      ASSIGN_OR_RETURN(hf::HfModelInfo folder, hf::ReadHfConfig(dir));
      if (folder.config.ToJson() != mc.ToJson())
        return Status::Error(ck.dir + ": the checkpoint's model_config differs from its import's " + dir +
                             "/config.json");
      *info = folder;
    }
  }
  return m;
}

// ---- parity ----------------------------------------------------------------

constexpr double kTol = 1e-4;
int failures = 0;

struct Ref {
  SafetensorsFile file;
  const TensorView& At(const std::string& name) const {
    const TensorView* t = file.Find(name);
    if (!t) {
      std::fprintf(stderr, "hf_check: %s: no tensor %s (hint: run hf_reference.py with --greedy)\n",
                   file.path().c_str(), name.c_str());
      std::exit(2);
    }
    return *t;
  }
  bool Has(const std::string& name) const { return file.Find(name) != nullptr; }
  template <class T>
  std::vector<T> Get(const std::string& name, const char* dtype) const {
    const TensorView& t = At(name);
    if (t.dtype != dtype) {
      std::fprintf(stderr, "hf_check: %s: %s is %s, not %s\n", file.path().c_str(), name.c_str(), t.dtype.c_str(), dtype);
      std::exit(2);
    }
    std::vector<T> v(t.nbytes / sizeof(T));
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
  std::vector<float> F32(const std::string& name) const { return Get<float>(name, "F32"); }
  std::vector<int32_t> I32(const std::string& name) const { return Get<int32_t>(name, "I32"); }
};

Ref OpenRef(const std::string& path) {
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "hf_check: %s\n", f.status().message().c_str());
    std::exit(2);
  }
  return Ref{std::move(*f)};
}

// max |a - b| / max |b| (a, b of n values); a non-finite value of ours fails.
double RelErr(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

void Report(const std::string& what, double err, double tol = kTol) {
  const bool ok = err <= tol;
  std::printf("%-40s %.3e %s\n", what.c_str(), err, ok ? "ok" : "FAIL");
  if (!ok) ++failures;
}

int ArgMax(const float* v, int64_t n) {  // lowest id on exact ties
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<int>(best);
}

int Parity(const std::string& source, bool is_hf, const std::string& ref_path, const std::string& abs_path) {
  hf::HfModelInfo info;
  auto loaded = is_hf ? hf::LoadHfModel(source, &info) : LoadAny(source, &info);
  if (!loaded.ok()) return Fail(loaded.status().message());
  Model& model = **loaded;
  const ModelConfig& cfg = model.config();
  const int64_t V = cfg.vocab_size;
  const Ref ref = OpenRef(ref_path);
  const TensorView& tok_view = ref.At("tokens");
  if (tok_view.shape.size() != 2) return Fail(ref_path + ": tokens are not [B, T]");
  const int B = static_cast<int>(tok_view.shape[0]), T = static_cast<int>(tok_view.shape[1]);
  const std::vector<int32_t> tokens = ref.I32("tokens");  // [B, T] = our [B, (T-1) + 1]
  const std::vector<float> ref_logits = ref.F32("logits");  // [B, T, V]
  if (ref_logits.size() != static_cast<size_t>(B) * T * V)
    return Fail(ref_path + ": logits are not [" + std::to_string(B) + ", " + std::to_string(T) + ", " +
                std::to_string(V) + "]");

  // The training forward and backward.
  model.ZeroGrads();
  const LossParts loss = model.Step(tokens.data(), B, T - 1, /*backward=*/false);
  const std::vector<float> logits = model.logits();  // [B*(T-1), V]
  std::vector<float> ref_rows;
  for (int b = 0; b < B; ++b)
    ref_rows.insert(ref_rows.end(), ref_logits.begin() + b * T * V, ref_logits.begin() + (b * T + T - 1) * V);
  Report("logits (training forward)", RelErr(logits.data(), ref_rows.data(), ref_rows.size()));
  const float ref_loss = ref.F32("loss")[0];
  const float our_loss = static_cast<float>(loss.main);
  Report("loss", RelErr(&our_loss, &ref_loss, 1));
  if (cfg.mtp_depth > 0) {
    const std::vector<float> mtp = model.mtp_logits(0);  // [B*(T-2), V]
    const std::vector<float> ref_mtp = ref.F32("mtp_logits");  // [B, T-1, V]
    std::vector<float> rows;
    for (int b = 0; b < B; ++b)
      rows.insert(rows.end(), ref_mtp.begin() + b * (T - 1) * V, ref_mtp.begin() + (b * (T - 1) + T - 2) * V);
    Report("mtp_logits (depth 1)", RelErr(mtp.data(), rows.data(), rows.size()));
    const float ref_mtp_loss = static_cast<float>(cfg.mtp_loss_weight * ref.F32("mtp_loss")[0]);
    const float our_mtp_loss = static_cast<float>(loss.mtp);
    Report("mtp_loss (times mtp_loss_weight)", RelErr(&our_mtp_loss, &ref_mtp_loss, 1));
  }
  if (ref.Has("grad.model.embed_tokens.weight")) {
    model.ZeroGrads();
    model.Step(tokens.data(), B, T - 1, /*backward=*/true);
    const std::vector<float> grads = model.GradsToHost();
    const double w = cfg.mtp_loss_weight;
    double worst = 0;
    std::string worst_name;
    int n = 0;
    for (const ParamInfo& p : model.layout().params()) {
      const std::string hf = hf::HfTensorName(cfg, p.name);
      // Tied: the reference's gradient of the one shared tensor is the embedding's.
      if (cfg.tie_embeddings && p.name == "lm_head.weight" && !ref.Has("grad." + hf)) continue;
      std::vector<float> want = ref.F32("grad." + hf);
      auto add = [&](const std::string& name) {
        if (!ref.Has(name)) return;
        const std::vector<float> g = ref.F32(name);
        for (size_t i = 0; i < want.size(); ++i) want[i] += static_cast<float>(w * g[i]);
      };
      add("mtp_grad." + hf);
      for (int64_t j = 0; j < cfg.mtp_depth; ++j) {  // the MTP layers' copies are ours too
        const std::string layer = "model.layers." + std::to_string(cfg.n_layers + j) + ".";
        if (p.name == "model.embed_tokens.weight") add("mtp_grad." + layer + "embed_tokens.weight");
        if (p.name == (cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"))
          add("mtp_grad." + layer + "shared_head.head.weight");
      }
      hf::ToOurLayout(info, p, &want);
      const double e = RelErr(grads.data() + p.offset, want.data(), p.numel);
      if (e > worst || n == 0) worst = e, worst_name = p.name;
      ++n;
    }
    Report("gradients of " + std::to_string(n) + " (worst: " + worst_name + ")", worst);
  }

  // Greedy decoding through the KV cache: the prompt at once, then one token at a time.
  InferenceSession session(model, cfg.max_seq_len, WeightFormat::kF32);
  const std::vector<int32_t> prompt = ref.I32("greedy_prompt"), ids = ref.I32("greedy_ids");
  const std::vector<float> greedy_logits = ref.F32("greedy_logits");
  const float* out = session.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
  int same = 0;
  double greedy_err = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ArgMax(out, V);
    same += id == ids[i];
    greedy_err = std::max(greedy_err, RelErr(out, greedy_logits.data() + i * V, V));
    if (i + 1 < ids.size()) out = session.Forward(&ids[i], 1);  // the reference's id, so one miss stays one
  }
  std::printf("%-40s %d of %zu %s\n", "greedy ids identical", same, ids.size(),
              same == static_cast<int>(ids.size()) ? "ok" : "FAIL");
  if (same != static_cast<int>(ids.size())) ++failures;
  Report("greedy logits", greedy_err);

  // Every position through the KV cache (MLA: the latent cache), one token at a time.
  std::vector<float> abs_logits;
  if (!abs_path.empty()) abs_logits = OpenRef(abs_path).F32("logits");
  const std::vector<float>& want = abs_path.empty() ? ref_logits : abs_logits;  // [B, T, V]
  if (want.size() != ref_logits.size()) return Fail(abs_path + ": logits are not those of REF's tokens");
  std::vector<float> got(want.size());
  for (int b = 0; b < B; ++b) {
    session.Reset();
    for (int t = 0; t < T; ++t) {
      const float* l = session.Forward(&tokens[b * T + t], 1);
      std::memcpy(got.data() + (b * T + t) * V, l, V * sizeof(float));
    }
  }
  Report(abs_path.empty() ? "decode logits (KV cache, per position)" : "decode logits (absorbed, latent cache)",
         RelErr(got.data(), want.data(), want.size()));
  return failures ? 1 : 0;
}

// ---- same, greedy, loss ------------------------------------------------------

int Same(const std::string& a_dir, const std::string& b_dir) {
  hf::HfModelInfo ia, ib;
  auto a = hf::LoadHfModel(a_dir, &ia);
  if (!a.ok()) return Fail(a.status().message());
  auto b = hf::LoadHfModel(b_dir, &ib);
  if (!b.ok()) return Fail(b.status().message());
  if (ia.architecture != ib.architecture) return Fail(ia.architecture + " became " + ib.architecture);
  if ((*a)->config().ToJson() != (*b)->config().ToJson())
    return Fail("configs differ:\n" + (*a)->config().ToJson().dump() + "\n" + (*b)->config().ToJson().dump());
  const std::vector<float> pa = (*a)->ParamsToHost(), pb = (*b)->ParamsToHost();
  if (pa.size() != pb.size() || std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) != 0)
    return Fail("parameters differ");
  if ((*a)->biases() != (*b)->biases()) return Fail("selection biases differ");
  auto wa = hf::HfWeights::Open(a_dir), wb = hf::HfWeights::Open(b_dir);
  if (!wa.ok() || !wb.ok()) return Fail("cannot open the weights");
  int same_bytes = 0, widened = 0;
  for (const std::string& name : wa->names()) {
    if (ia.config.tie_embeddings && name == "lm_head.weight") continue;
    const TensorView* ta = wa->Find(name);
    const TensorView* tb = wb->Find(name);
    if (!tb) return Fail(b_dir + " has no tensor " + name);
    if (ta->shape != tb->shape) return Fail(name + ": shape " + ShapeString(ta->shape) + " became " + ShapeString(tb->shape));
    if (ta->dtype != tb->dtype) {
      ++widened;
      continue;
    }
    if (ta->nbytes != tb->nbytes || std::memcmp(ta->data, tb->data, ta->nbytes) != 0) return Fail(name + ": bytes differ");
    ++same_bytes;
  }
  if (wb->names().size() != static_cast<size_t>(same_bytes + widened)) return Fail(b_dir + " has extra tensors");
  std::printf("same: %s, %zu parameters bit-identical; %d tensors byte-identical, %d in another dtype\n",
              ia.architecture.c_str(), pa.size(), same_bytes, widened);
  return 0;
}

int Greedy(const std::string& source, const std::string& prompt_text, int n, const char* logits_path) {
  auto m = LoadAny(source);
  if (!m.ok()) return Fail(m.status().message());
  std::vector<int32_t> prompt;
  std::stringstream ss(prompt_text);
  for (std::string v; std::getline(ss, v, ',');) prompt.push_back(std::stoi(v));
  const Model& model = **m;
  InferenceSession session(model, model.config().max_seq_len);
  SamplingParams greedy;
  greedy.temperature = 0;
  const float* logits = session.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
  std::string out;
  std::vector<float> rows;
  const int64_t V = model.config().vocab_size;
  for (int i = 0; i < n; ++i) {
    rows.insert(rows.end(), logits, logits + V);
    int32_t next = SampleToken(logits, model.config().vocab_size, greedy, nullptr);
    out += (i ? "," : "") + std::to_string(next);
    if (i + 1 < n) logits = session.Forward(&next, 1);
  }
  if (logits_path) {
    FILE* f = std::fopen(logits_path, "wb");
    if (!f || std::fwrite(rows.data(), sizeof(float), rows.size(), f) != rows.size() || std::fclose(f) != 0)
      return Fail(std::string(logits_path) + ": cannot write");
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

int Loss(const std::string& source, const std::string& data, int B, int T, int batches) {
  auto m = LoadAny(source);
  if (!m.ok()) return Fail(m.status().message());
  auto val = DataLoader::Open(data, "val", T, 0);
  if (!val.ok()) return Fail(val.status().message());
  const EvalResult r = Evaluate(**m, **val, B, T, batches);
  std::printf("%.9g\n", r.loss);
  return 0;
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s parity (--hf DIR | --ckpt RUN_DIR) --ref REF.safetensors [--absorbed REF_ABS.safetensors]\n"
               "       %s same A B | greedy SOURCE PROMPT N [LOGITS] | loss SOURCE DATA B T BATCHES\n",
               argv0, argv0);
  return 2;
}

int ParityMain(int argc, char** argv) {
  std::string hf, ckpt, ref, abs;
  for (int i = 2; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Usage(argv[0]);
    if (a == "--hf") hf = argv[i + 1];
    else if (a == "--ckpt") ckpt = argv[i + 1];
    else if (a == "--ref") ref = argv[i + 1];
    else if (a == "--absorbed") abs = argv[i + 1];
    else return Fail("parity: unknown argument " + a), 2;
  }
  if (ref.empty() || hf.empty() == ckpt.empty()) return Usage(argv[0]);
  if (!ckpt.empty() && std::filesystem::exists(ckpt + "/config.json") && !std::filesystem::exists(ckpt + "/manifest.json"))
    return Fail(ckpt + " is a Hugging Face folder (hint: --hf)");
  return Parity(hf.empty() ? ckpt : hf, !hf.empty(), ref, abs);
}

}  // namespace
}  // namespace myriad

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "parity") return myriad::ParityMain(argc, argv);
  if (argc == 4 && cmd == "same") return myriad::Same(argv[2], argv[3]);
  if ((argc == 5 || argc == 6) && cmd == "greedy")
    return myriad::Greedy(argv[2], argv[3], std::atoi(argv[4]), argc == 6 ? argv[5] : nullptr);
  if (argc == 7 && cmd == "loss")
    return myriad::Loss(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]));
  return myriad::Usage(argv[0]);
}
