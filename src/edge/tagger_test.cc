// The tagger learns names, addresses and organisations it never saw (the
// held-out lexicons) well above the all-O baseline, and survives a save/load
// round trip bit for bit; malformed directories are refused with one line.
#include "edge/tagger.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "data/test_util.h"
#include "edge/redact_eval.h"

namespace myriad::edge {
namespace {

const std::vector<EntityType> kTypes = {EntityType::kPerson, EntityType::kAddress, EntityType::kOrg};

Tagger& Trained() {
  static std::unique_ptr<Tagger> t = [] {
    // One thread: ctest runs another test beside this one, and OpenMP's
    // threads waiting on a busy core made this training 30x slower.
    omp_set_num_threads(1);
    TaggerConfig cfg;
    cfg.d_model = 64;
    cfg.d_ff = 128;
    cfg.window = 96;
    TaggerTrainOptions opt;
    opt.steps = 400;
    opt.batch = 16;
    opt.log_every = 0;
    auto r = TrainTagger(GenerateCorpus(1, Split::kTrain, 400), cfg, opt);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }();
  return *t;
}

EvalReport HeldOut(const Tagger& t, int64_t n) {
  EvalOptions eo;
  eo.types = kTypes;
  return EvaluateDetector(GenerateCorpus(2, Split::kHeldOut, n),
                          [&](std::string_view s) { return t.Tag(DecodeUtf8(s)); }, eo);
}

TEST(Tagger, CrossEntropyGradientMatchesFiniteDifferences) {
  // Ten logits (the row is wider than the tags); only the first kNumTags matter.
  float z[10] = {0.3f, -1.2f, 2.0f, 0.1f, -0.4f, 1.1f, 0.7f, 5.0f, -3.0f, 9.0f};
  float d[10] = {0};
  float probs[kNumTags];
  const double loss = TagCrossEntropy(z, 2, 0.5, d, probs);
  // By hand: softmax over z[0..7), label 2.
  double sum = 0;
  for (int k = 0; k < kNumTags; ++k) sum += std::exp(static_cast<double>(z[k]));
  EXPECT_NEAR(loss, -0.5 * (z[2] - std::log(sum)), 1e-6);
  for (int k = 0; k < kNumTags; ++k) {
    EXPECT_NEAR(probs[k], std::exp(static_cast<double>(z[k])) / sum, 1e-6);
    float zp[10], zm[10];
    std::copy(z, z + 10, zp);
    std::copy(z, z + 10, zm);
    const float h = 1e-2f;
    zp[k] += h;
    zm[k] -= h;
    const double fd = (TagCrossEntropy(zp, 2, 0.5, nullptr, nullptr) - TagCrossEntropy(zm, 2, 0.5, nullptr, nullptr)) / (2 * h);
    EXPECT_NEAR(d[k], fd, 1e-4) << k;
  }
  for (int k = kNumTags; k < 10; ++k) EXPECT_EQ(d[k], 0.0f);
  EXPECT_EQ(TagCrossEntropy(z, -1, 0.5, d, nullptr), 0.0);
}

TEST(Tagger, BeatsAllOBaselineOnHeldOut) {
  const EvalReport r = HeldOut(Trained(), 60);
  EvalOptions eo;
  eo.types = kTypes;
  const EvalReport zero =
      EvaluateDetector(GenerateCorpus(2, Split::kHeldOut, 60), [](std::string_view) { return std::vector<Span>{}; }, eo);
  EXPECT_DOUBLE_EQ(zero.micro.f1, 0.0);
  std::printf("%s", FormatEvalTable(r).c_str());
  EXPECT_GT(r.micro.f1, 0.6);
  for (EntityType t : kTypes) {
    ASSERT_TRUE(r.per_type.count(t));
    EXPECT_GT(r.per_type.at(t).f1, 0.3) << EntityTypeName(t);
  }
}

TEST(Tagger, SpansAreWellFormed) {
  const LabelledDoc d = GenerateDoc(2, Split::kHeldOut, 3);
  const std::u32string text = DecodeUtf8(d.text);
  for (const Span& s : Trained().Tag(text)) {
    EXPECT_LT(s.start, s.end);
    EXPECT_LE(s.end, static_cast<int64_t>(text.size()));
    EXPECT_TRUE(s.type == EntityType::kPerson || s.type == EntityType::kAddress || s.type == EntityType::kOrg);
    EXPECT_GT(s.confidence, 0.0f);
    EXPECT_LE(s.confidence, 1.0f);
  }
  EXPECT_TRUE(Trained().Tag(U"").empty());
}

TEST(Tagger, SaveLoadRoundTrip) {
  TempDir tmp("tagger_rt");
  const std::string dir = tmp.path() + "/tagger";
  ASSERT_TRUE(Trained().Save(dir).ok());
  auto loaded = LoadTagger(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ((*loaded)->num_params(), Trained().num_params());
  for (int64_t i = 0; i < 8; ++i) {
    const std::u32string text = DecodeUtf8(GenerateDoc(2, Split::kHeldOut, i).text);
    const auto a = Trained().Tag(text), b = (*loaded)->Tag(text);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k], b[k]);
      EXPECT_EQ(a[k].confidence, b[k].confidence);
    }
  }
}

TEST(Tagger, TrainingIsDeterministicInTheSeed) {
  TaggerConfig cfg;
  omp_set_num_threads(1);  // as Trained(): beside another test, fast
  cfg.d_model = 32;
  cfg.d_ff = 64;
  cfg.window = 64;
  TaggerTrainOptions opt;
  opt.steps = 20;
  opt.batch = 4;
  opt.log_every = 0;
  const auto docs = GenerateCorpus(1, Split::kTrain, 40);
  auto a = TrainTagger(docs, cfg, opt), b = TrainTagger(docs, cfg, opt);
  opt.seed = 2;
  auto c = TrainTagger(docs, cfg, opt);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const std::u32string text = DecodeUtf8(GenerateDoc(2, Split::kHeldOut, 0).text);
  const std::vector<float> pa = (*a)->TagProbabilities(text), pb = (*b)->TagProbabilities(text),
                           pc = (*c)->TagProbabilities(text);
  ASSERT_EQ(pa.size(), text.size() * kNumTags);
  EXPECT_EQ(pa, pb);
  EXPECT_NE(pa, pc);
}

TEST(Tagger, MalformedDirectoriesAreRefused) {
  TempDir tmp("tagger_bad");
  const std::string base = tmp.path();
  auto missing = LoadTagger(base + "/nowhere");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nowhere"), std::string::npos);
  EXPECT_EQ(missing.status().message().find('\n'), std::string::npos);

  ASSERT_TRUE(Trained().Save(base).ok());
  auto write = [&](const std::string& name, const std::string& body) {
    FILE* f = std::fopen((base + "/" + name).c_str(), "w");
    std::fputs(body.c_str(), f);
    std::fclose(f);
  };
  // The model file cut short.
  write("model.safetensors", "short");
  auto cut = LoadTagger(base);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("model.safetensors"), std::string::npos) << cut.status().message();
  // tagger.json not JSON, or with a vocabulary that disagrees with the model.
  write("tagger.json", "{not json");
  auto garbled = LoadTagger(base);
  ASSERT_FALSE(garbled.ok());
  EXPECT_NE(garbled.status().message().find("tagger.json"), std::string::npos);
  ASSERT_TRUE(Trained().Save(base).ok());
  std::string json;
  {
    FILE* f = std::fopen((base + "/tagger.json").c_str(), "r");
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) json.append(buf, n);
    std::fclose(f);
  }
  const size_t at = json.find("\"chars\": \"");
  ASSERT_NE(at, std::string::npos);
  json.insert(at + 10, "\\u4e00\\u4e01");  // two characters more than the model has ids for
  write("tagger.json", json);
  auto mismatch = LoadTagger(base);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("vocab_size"), std::string::npos) << mismatch.status().message();
}

}  // namespace
}  // namespace myriad::edge
