// hf_model_check: our side of tests/hf/export_roundtrip.sh and
// tests/hf/finetune.sh.
//
//   hf_model_check same A B
//       A and B are Hugging Face folders (B exported from A): LoadHfModel
//       reads the same architecture, the same ModelConfig and bit-identical
//       parameters and selection biases; every tensor of A is in B with the
//       same shape, and where its dtype is the same, the same bytes (A's
//       lm_head.weight aside when tied). One line, exit 1 when not.
//   hf_model_check greedy SOURCE PROMPT N [LOGITS]
//       SOURCE is a Hugging Face folder or a checkpoint (run or step
//       directory); prints the N greedy ids (argmax, lowest id on ties)
//       after PROMPT (comma-separated ids) decoded with the KV cache, and
//       writes the logits each id was chosen from to LOGITS (raw
//       little-endian float32 [N, V]).
//   hf_model_check loss SOURCE DATA_DIR B T BATCHES
//       prints the mean loss of SOURCE (a folder or a checkpoint) over the
//       first BATCHES validation batches [B, T+1] of the prepared DATA_DIR
//       (trainer.h's Evaluate, as `myriad eval`).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "model/hf/hf_model.h"
#include "model/hf/hf_weights.h"
#include "model/inference.h"
#include "data/loader.h"
#include "model/sampler.h"
#include "train/checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace myriad {
namespace {

int Fail(const std::string& m) {
  std::fprintf(stderr, "hf_model_check: %s\n", m.c_str());
  return 1;
}

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

Result<std::unique_ptr<Model>> LoadAny(const std::string& path) {
  if (std::filesystem::exists(path + "/config.json")) return hf::LoadHfModel(path);
  ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(Env::Default(), path));
  ASSIGN_OR_RETURN(ModelConfig mc, ModelConfig::FromJson(ck.manifest["model_config"]));
  auto m = std::make_unique<Model>(mc);
  RETURN_IF_ERROR(RestoreModel(ck, m.get()));
  return m;
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

}  // namespace
}  // namespace myriad

int main(int argc, char** argv) {
  if (argc == 4 && !std::strcmp(argv[1], "same")) return myriad::Same(argv[2], argv[3]);
  if ((argc == 5 || argc == 6) && !std::strcmp(argv[1], "greedy"))
    return myriad::Greedy(argv[2], argv[3], std::atoi(argv[4]), argc == 6 ? argv[5] : nullptr);
  if (argc == 7 && !std::strcmp(argv[1], "loss"))
    return myriad::Loss(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]));
  std::fprintf(stderr, "usage: %s same A B | greedy SOURCE PROMPT N [LOGITS] | loss SOURCE DATA B T BATCHES\n", argv[0]);
  return 2;
}
