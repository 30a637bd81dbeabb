// hf_parity: our side of the open-model parity test (tests/hf/import_parity.sh).
//
//   hf_parity (--hf HF_DIR | --ckpt RUN_DIR) --ref REF.safetensors [--tol 1e-4]
//
// Loads the model from a Hugging Face folder (hf::LoadHfModel) or from the
// run directory `myriad import` wrote (the checkpoint path), and holds it to
// the independent PyTorch reference's output (tests/hf/hf_reference.py):
//   - the training forward (Model::Step) on the reference's tokens [B, T]:
//     logits of positions 0..T-2 and the mean next-token loss;
//   - the KV-cached inference path (InferenceSession), one token at a time:
//     logits at every position;
//   - greedy decoding from greedy_prompt: greedy_ids exactly.
// Errors are max|ours - ref| / max(1, max|ref|) over each tensor (the loss:
// relative). Prints one line per check; exits 1 when any is above --tol or
// any greedy id differs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/hf/hf_model.h"
#include "model/inference.h"
#include "model/model.h"
#include "train/checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace {

using myriad::Model;

template <class T>
std::vector<T> Read(const myriad::SafetensorsFile& f, const std::string& name, const char* dtype) {
  const myriad::TensorView* v = f.Find(name);
  if (!v) {
    std::fprintf(stderr, "hf_parity: %s has no tensor %s\n", f.path().c_str(), name.c_str());
    std::exit(2);
  }
  if (v->dtype != dtype) {
    std::fprintf(stderr, "hf_parity: %s: %s is %s, not %s\n", f.path().c_str(), name.c_str(), v->dtype.c_str(),
                 dtype);
    std::exit(2);
  }
  std::vector<T> out(v->nbytes / sizeof(T));
  std::memcpy(out.data(), v->data, v->nbytes);
  return out;
}

double MaxRelDiff(const float* ours, const float* ref, size_t n) {
  double diff = 0, scale = 1;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(ours[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
    if (!std::isfinite(ours[i])) return INFINITY;
  }
  return diff / scale;
}

int32_t ArgMax(const float* v, int64_t n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

}  // namespace

int main(int argc, char** argv) {
  std::string hf, ckpt, ref_path;
  double tol = 1e-4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--hf") hf = argv[i + 1];
    else if (a == "--ckpt") ckpt = argv[i + 1];
    else if (a == "--ref") ref_path = argv[i + 1];
    else if (a == "--tol") tol = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "hf_parity: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (ref_path.empty() || hf.empty() == ckpt.empty()) {
    std::fprintf(stderr, "usage: hf_parity (--hf HF_DIR | --ckpt RUN_DIR) --ref REF.safetensors [--tol 1e-4]\n");
    return 2;
  }
  std::unique_ptr<Model> model;
  if (!hf.empty()) {
    auto m = myriad::hf::LoadHfModel(hf);
    if (!m.ok()) {
      std::fprintf(stderr, "hf_parity: %s\n", m.status().message().c_str());
      return 1;
    }
    model = std::move(m).value();
  } else {
    auto ck = myriad::LoadCheckpoint(myriad::Env::Default(), ckpt);
    if (!ck.ok()) {
      std::fprintf(stderr, "hf_parity: %s\n", ck.status().message().c_str());
      return 1;
    }
    auto mc = myriad::ModelConfig::FromJson(ck->manifest["model_config"]);
    if (!mc.ok()) {
      std::fprintf(stderr, "hf_parity: %s\n", mc.status().message().c_str());
      return 1;
    }
    model = std::make_unique<Model>(*mc);
    if (auto st = myriad::RestoreModel(*ck, model.get()); !st.ok()) {
      std::fprintf(stderr, "hf_parity: %s\n", st.message().c_str());
      return 1;
    }
  }
  auto ref = myriad::SafetensorsFile::Open(ref_path);
  if (!ref.ok()) {
    std::fprintf(stderr, "hf_parity: %s\n", ref.status().message().c_str());
    return 2;
  }
  const myriad::ModelConfig& cfg = model->config();
  const int64_t V = cfg.vocab_size;
  const auto* tv = ref->Find("tokens");
  if (!tv || tv->shape.size() != 2) {
    std::fprintf(stderr, "hf_parity: %s: no tokens [B, T]\n", ref_path.c_str());
    return 2;
  }
  const int B = static_cast<int>(tv->shape[0]), T = static_cast<int>(tv->shape[1]);
  const std::vector<int32_t> tokens = Read<int32_t>(*ref, "tokens", "I32");
  const std::vector<float> ref_logits = Read<float>(*ref, "logits", "F32");
  const float ref_loss = Read<float>(*ref, "loss", "F32")[0];
  if (ref_logits.size() != static_cast<size_t>(B) * T * V) {
    std::fprintf(stderr, "hf_parity: reference logits are not [%d, %d, %lld]\n", B, T, static_cast<long long>(V));
    return 2;
  }
  bool ok = true;
  auto report = [&](const char* what, double err) {
    const bool pass = err <= tol;
    ok &= pass;
    std::printf("%-28s %.3e %s\n", what, err, pass ? "ok" : "FAIL");
  };

  // Training forward: rows of T tokens are [B, (T-1)+1] inputs with targets.
  myriad::LossParts loss = model->Step(tokens.data(), B, T - 1, /*backward=*/false);
  const std::vector<float> train_logits = model->logits();  // [B*(T-1), V]
  double train_err = 0;
  for (int b = 0; b < B; ++b)
    train_err = std::max(train_err, MaxRelDiff(train_logits.data() + static_cast<size_t>(b) * (T - 1) * V,
                                               ref_logits.data() + static_cast<size_t>(b) * T * V,
                                               static_cast<size_t>(T - 1) * V));
  report("train forward logits", train_err);
  report("train loss (relative)", std::fabs(loss.main - ref_loss) / std::max(1e-12, std::fabs(double(ref_loss))));

  // The KV-cached path, one token at a time.
  double infer_err = 0;
  for (int b = 0; b < B; ++b) {
    myriad::InferenceSession session(*model, T);
    for (int t = 0; t < T; ++t) {
      const float* lg = session.Forward(&tokens[static_cast<size_t>(b) * T + t], 1);
      infer_err = std::max(infer_err, MaxRelDiff(lg, ref_logits.data() + (static_cast<size_t>(b) * T + t) * V, V));
    }
  }
  report("decode logits (KV cache)", infer_err);

  // Greedy decoding: prefill the prompt at once, then one token at a time.
  if (ref->Find("greedy_ids")) {
    const std::vector<int32_t> prompt = Read<int32_t>(*ref, "greedy_prompt", "I32");
    const std::vector<int32_t> want = Read<int32_t>(*ref, "greedy_ids", "I32");
    myriad::InferenceSession session(*model, static_cast<int64_t>(prompt.size() + want.size()) + 1);
    const float* lg = session.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
    size_t same = 0;
    for (; same < want.size(); ++same) {
      const int32_t next = ArgMax(lg, V);
      if (next != want[same]) {
        std::printf("greedy: token %zu is %d, the reference's %d\n", same, next, want[same]);
        break;
      }
      lg = session.Forward(&next, 1);
    }
    const bool pass = same == want.size();
    ok &= pass;
    std::printf("%-28s %zu/%zu %s\n", "greedy ids identical", same, want.size(), pass ? "ok" : "FAIL");
  }
  return ok ? 0 : 1;
}
