// hf_model_parity: a Hugging Face folder imported by Myriad (LoadHfModel)
// against the outputs of the independent PyTorch reference
// tests/hf/hf_reference.py on the same folder (tests/hf/README.md lists
// them). Used by tests/hf/model_parity.sh.
//
//   hf_model_parity --model DIR --ref REF.safetensors [--absorbed REF_ABS.safetensors]
//
// REF is the reference's default (unabsorbed) run with --greedy N and
// --grads; REF_ABS (MLA models) its --mla absorbed run. Checked, each as
// max |ours - theirs| / max |theirs| over the tensor, at 1e-4 (fp32):
//   logits, loss   the training forward on the reference's tokens [B, T]
//                  (ours as Step over B sequences of T-1 inputs: the first
//                  T-1 positions' logits, the same B*(T-1) loss terms);
//   mtp_logits     MTP depth 1, its first T-2 rows (ours see T-1 positions);
//   mtp_loss       ours is mtp_loss_weight times the reference's;
//   gradients      of every parameter, ours d(main + w * mtp)/dw against the
//                  reference's grad + w * mtp_grad (the MTP layer's embedding
//                  and head copies added to the main ones, which ours use),
//                  in our layout (hf::ToOurLayout);
//   greedy         the ids identical, and the logits they were chosen from,
//                  through InferenceSession (KV cache; MLA: the latent cache
//                  in the absorbed form);
//   absorbed       MLA: every position's logits of InferenceSession, one token
//                  at a time, against REF_ABS's logits.
// Prints one line per figure; exits 1 when any is over its tolerance.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/hf/hf_model.h"
#include "model/inference.h"

namespace myriad {
namespace {

constexpr double kTol = 1e-4;
int failures = 0;

struct Ref {
  SafetensorsFile file;
  const TensorView& At(const std::string& name) const {
    const TensorView* t = file.Find(name);
    if (!t) {
      std::fprintf(stderr, "%s: no tensor %s (hint: run hf_reference.py with --greedy and --grads)\n",
                   file.path().c_str(), name.c_str());
      std::exit(2);
    }
    return *t;
  }
  bool Has(const std::string& name) const { return file.Find(name) != nullptr; }
  std::vector<float> F32(const std::string& name) const {
    const TensorView& t = At(name);
    std::vector<float> v(t.nbytes / 4);
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
  std::vector<int32_t> I32(const std::string& name) const {
    const TensorView& t = At(name);
    std::vector<int32_t> v(t.nbytes / 4);
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
};

Ref OpenRef(const std::string& path) {
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().message().c_str());
    std::exit(2);
  }
  return Ref{std::move(*f)};
}

// max |a - b| / max |b| (a, b of n values).
double RelErr(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
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

int Run(const std::string& dir, const std::string& ref_path, const std::string& abs_path) {
  hf::HfModelInfo info;
  auto loaded = hf::LoadHfModel(dir, &info);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().message().c_str());
    return 1;
  }
  Model& model = **loaded;
  const ModelConfig& cfg = model.config();
  const int64_t V = cfg.vocab_size;
  const Ref ref = OpenRef(ref_path);
  const TensorView& tok_view = ref.At("tokens");
  const int B = static_cast<int>(tok_view.shape[0]), T = static_cast<int>(tok_view.shape[1]);
  const std::vector<int32_t> tokens = ref.I32("tokens");  // [B, T] = our [B, (T-1) + 1]

  // The training forward and backward.
  model.ZeroGrads();
  const LossParts loss = model.Step(tokens.data(), B, T - 1, /*backward=*/false);
  const std::vector<float> logits = model.logits();  // [B*(T-1), V]
  const std::vector<float> ref_logits = ref.F32("logits");  // [B, T, V]
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
    for (const ParamInfo& p : model.layout().params()) {
      const std::string hf = hf::HfTensorName(cfg, p.name);
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
      if (e > worst) worst = e, worst_name = p.name;
    }
    Report("gradients (worst: " + worst_name + ")", worst);
  }

  // Greedy decoding through the KV cache.
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
  std::printf("%-40s %d of %zu\n", "greedy ids identical", same, ids.size());
  if (same != static_cast<int>(ids.size())) ++failures;
  Report("greedy logits", greedy_err);

  if (!abs_path.empty()) {
    // Every position through the latent cache, one token at a time.
    const Ref abs = OpenRef(abs_path);
    const std::vector<float> want = abs.F32("logits");  // [B, T, V]
    std::vector<float> got(want.size());
    for (int b = 0; b < B; ++b) {
      session.Reset();
      for (int t = 0; t < T; ++t) {
        const float* l = session.Forward(&tokens[b * T + t], 1);
        std::memcpy(got.data() + (b * T + t) * V, l, V * sizeof(float));
      }
    }
    Report("logits (absorbed, latent cache)", RelErr(got.data(), want.data(), want.size()));
  }
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace myriad

int main(int argc, char** argv) {
  std::string dir, ref, abs;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") dir = argv[i + 1];
    else if (a == "--ref") ref = argv[i + 1];
    else if (a == "--absorbed") abs = argv[i + 1];
    else return std::fprintf(stderr, "unknown argument %s\n", a.c_str()), 2;
  }
  if (dir.empty() || ref.empty()) {
    std::fprintf(stderr, "usage: hf_model_parity --model DIR --ref REF.safetensors [--absorbed REF_ABS.safetensors]\n");
    return 2;
  }
  return myriad::Run(dir, ref, abs);
}
