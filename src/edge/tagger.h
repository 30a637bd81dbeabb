// The on-device tagger for names, addresses and organisations: a tiny
// dense Myriad transformer over characters, trained by Myriad (DistTrainer
// on a world of one, AdamW) with a HeadObjective that reads BIO tags from
// the first kNumTags logits of each row in place of next-token loss.
//
// The model attends causally, so each character's tag is read `delay`
// positions later (the input is padded with `delay` filler tokens): the tag
// of character i sees characters [.., i + delay]. Long texts are tagged in
// windows that carry `context` characters of left context.
//
// Characters: each code point (full-width ASCII folded to ASCII) has an id
// from a vocabulary built from the training corpus (ASCII always in it);
// the rest fall into hash buckets, which training also exercises by
// replacing a few known characters by their bucket.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "edge/corpus.h"
#include "edge/redact.h"
#include "model/model.h"

namespace myriad::edge {

// BIO tags: O, then B-/I- for PERSON, ADDRESS, ORG.
constexpr int kNumTags = 7;
const char* TagName(int tag);  // "O", "B-PERSON", "I-PERSON", ...

// One row of the training objective: weight * -log softmax(logits[0..kNumTags))[label],
// d(that)/d(logits) added into dlogits[0..kNumTags) (null: none) and the
// tag probabilities into probs (null: none). A label outside [0, kNumTags)
// contributes nothing (probabilities only). The other logits of the row
// (the rest of the vocabulary) take no part.
double TagCrossEntropy(const float* logits, int label, double weight, float* dlogits, float* probs);

struct TaggerConfig {
  int64_t d_model = 96, n_layers = 2, n_heads = 4, d_ff = 256;
  int64_t window = 128;       // positions per sequence (characters + delay)
  int64_t delay = 4;          // D: the tag of character i is read at position i + D
  int64_t context = 32;       // left-context characters each later inference window re-reads
  int64_t max_chars = 1200;   // vocabulary: at most this many corpus characters (seen twice or more)
  int64_t hash_buckets = 64;  // ids for characters outside the vocabulary
};

struct TaggerTrainOptions {
  int64_t steps = 1600;
  int64_t batch = 16;      // sequences per step
  double lr = 3e-3;
  uint64_t seed = 1;
  int64_t log_every = 50;  // progress lines (0: none)
  double bucket_dropout = 0.03;  // fraction of known characters replaced by their hash bucket
  // Receives one progress line per log_every steps ("step 50/600 loss 0.41 tok/s 9100"); null: stderr.
  std::function<void(const std::string&)> progress;
};

class Tagger : public SpanTagger {
 public:
  // Spans of PERSON, ADDRESS and ORG (runs of characters inside an entity,
  // typed by their summed tag probabilities; tagger.cc); confidence = the
  // mean over the span's characters of the probability of its type (B + I). Thread-safe (one call at a time
  // runs the model).
  std::vector<Span> Tag(std::u32string_view text) const override;
  // Per character: the probabilities of the kNumTags tags [text.size(), kNumTags].
  std::vector<float> TagProbabilities(std::u32string_view text) const;
  // Per character: the argmax tag and its probability.
  void TagCharacters(std::u32string_view text, std::vector<int>* tags, std::vector<float>* probs) const;

  // dir/model.safetensors (the model's tensors under their names) and
  // dir/tagger.json (vocabulary, delay, window, tags, model config).
  Status Save(const std::string& dir) const;

  const TaggerConfig& config() const { return cfg_; }
  const ModelConfig& model_config() const { return model_->config(); }
  int64_t num_params() const { return model_->num_params(); }
  int64_t vocab_size() const { return model_->config().vocab_size; }

 private:
  friend Result<std::unique_ptr<Tagger>> TrainTagger(const std::vector<LabelledDoc>&, const TaggerConfig&,
                                                     const TaggerTrainOptions&);
  friend Result<std::unique_ptr<Tagger>> LoadTagger(const std::string& dir);
  Tagger() = default;
  int32_t CharId(char32_t c) const;
  std::vector<int32_t> Encode(std::u32string_view text) const;

  TaggerConfig cfg_;
  std::u32string chars_;  // vocabulary: id 1 + hash_buckets + i is chars_[i]; id 0 is the filler
  std::vector<std::pair<char32_t, int32_t>> char_ids_;  // sorted (code point, id)
  std::unique_ptr<Model> model_;
  mutable std::mutex mu_;
};

// Trains a tagger on `docs` (their PERSON, ADDRESS and ORG spans).
Result<std::unique_ptr<Tagger>> TrainTagger(const std::vector<LabelledDoc>& docs, const TaggerConfig& cfg,
                                            const TaggerTrainOptions& opt);
// A directory Save wrote; a missing or malformed one is one line naming it.
Result<std::unique_ptr<Tagger>> LoadTagger(const std::string& dir);

// The per-character BIO tags of a document's PERSON/ADDRESS/ORG spans.
std::vector<int> GoldTags(const LabelledDoc& d);

}  // namespace myriad::edge
