#include "train/supervise/preflight.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "data/shards.h"
#include "data/test_util.h"

namespace myriad::supervise {
namespace {

namespace fs = std::filesystem;

// configs/tiny.toml, with data.dir and train.out_dir filled in per test.
constexpr const char* kTinyModel = R"([model]
vocab_size = 512
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
d_ff = 64
n_dense_layers = 1
n_routed_experts = 4
n_shared_experts = 1
top_k = 2
d_expert = 32
mtp_depth = 1
max_seq_len = 64

[train]
seq_len = 32
batch_size = 4
grad_accum = 2
steps = 20
)";

// A temp folder with tiny.toml, a data folder (train and val shards, a
// tokenizer file) and a place for the run's checkpoints.
class PreflightTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<TempDir>("preflight");
    data_ = tmp_->path() + "/data";
    out_ = tmp_->path() + "/runs/tiny";
    config_ = tmp_->path() + "/tiny.toml";
    fs::create_directories(data_);
    std::ofstream(config_) << kTinyModel << "out_dir = \"" << out_ << "\"\n\n[data]\ndir = \"" << data_ << "\"\n";
    WriteSplit("train", 4000);
    WriteSplit("val", 500);
    std::ofstream(data_ + "/tokenizer.model") << "not a real tokenizer, but a readable file";
  }
  void WriteSplit(const std::string& split, int tokens) {
    std::mt19937 rng(7);
    ShardWriter w(data_ + "/" + ShardFileName(split, 0), 512);
    std::vector<int32_t> doc;
    for (int i = 0; i < tokens; ++i) {
      doc.push_back(static_cast<int32_t>(rng() % 511));
      if (doc.size() == 50) {
        doc.push_back(511);  // eos
        ASSERT_TRUE(w.AppendDocument(doc).ok());
        doc.clear();
      }
    }
    if (!doc.empty()) {
      ASSERT_TRUE(w.AppendDocument(doc).ok());
    }
    ASSERT_TRUE(w.Finish().ok());
  }
  PreflightOptions Options(std::vector<std::string> overrides = {}) {
    PreflightOptions o;
    o.config_path = config_;
    o.overrides = std::move(overrides);
    return o;
  }
  static const PreflightItem& Item(const PreflightReport& r, const std::string& check) {
    const PreflightItem* it = r.Find(check);
    EXPECT_NE(it, nullptr) << "no item " << check << " in\n" << r.Format();
    static const PreflightItem kMissing{"missing", false, "missing"};
    return it ? *it : kMissing;
  }

  std::unique_ptr<TempDir> tmp_;
  std::string data_, out_, config_;
};

const std::vector<std::string> kAllChecks = {"config",         "layout",           "memory",
                                             "data.train",     "data.val",         "data.tokenizer",
                                             "checkpoint.write", "checkpoint.space", "launcher"};

TEST_F(PreflightTest, GoodSetupPassesEveryItem) {
  PreflightReport r = RunPreflight(Options());
  EXPECT_TRUE(r.ok()) << r.Format();
  ASSERT_EQ(r.items.size(), kAllChecks.size()) << r.Format();
  for (size_t i = 0; i < kAllChecks.size(); ++i) {
    EXPECT_EQ(r.items[i].check, kAllChecks[i]);
    EXPECT_TRUE(r.items[i].ok) << r.items[i].check << ": " << r.items[i].detail;
    EXPECT_FALSE(r.items[i].skipped || r.items[i].warn) << r.items[i].check << ": " << r.items[i].detail;
  }
  EXPECT_EQ(r.problems(), 0);
  EXPECT_GT(r.memory.total, 0);
  EXPECT_EQ(r.memory.total, r.memory.params + r.memory.grads + r.memory.optimizer + r.memory.activations +
                                r.memory.checkpoint + r.memory.buffers);
  EXPECT_GT(r.checkpoint_bytes, 3 * r.memory.params);  // weights + two moments (ZeRO-1, one rank: whole model)
  EXPECT_NE(Item(r, "launcher").detail.find("not needed"), std::string::npos);
  EXPECT_NE(Item(r, "data.train").detail.find("tokens"), std::string::npos);
  const std::string text = r.Format();
  EXPECT_NE(text.find("  ok    config"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("0 problems\n")) << text;
  const nlohmann::json j = r.ToJson();
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["items"].size(), kAllChecks.size());
  EXPECT_EQ(j["memory"]["total"].get<int64_t>(), r.memory.total);
  // The out_dir was created, and the probe file is gone.
  ASSERT_TRUE(fs::is_directory(out_));
  EXPECT_TRUE(fs::is_empty(out_));
}

TEST_F(PreflightTest, UnknownKeyIsReportedAndLaterChecksAreSkippedWithReason) {
  PreflightReport r = RunPreflight(Options({"model.d_modle=32"}));
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.items.size(), kAllChecks.size()) << r.Format();
  const PreflightItem& cfg = Item(r, "config");
  EXPECT_FALSE(cfg.ok);
  EXPECT_FALSE(cfg.skipped);
  EXPECT_NE(cfg.detail.find("unknown key model.d_modle"), std::string::npos) << cfg.detail;
  EXPECT_NE(cfg.detail.find("did you mean model.d_model"), std::string::npos) << cfg.detail;
  for (const char* c : {"layout", "memory", "data.train", "data.val", "data.tokenizer", "checkpoint.write",
                        "checkpoint.space"}) {
    const PreflightItem& it = Item(r, c);
    EXPECT_TRUE(it.skipped) << c;
    EXPECT_FALSE(it.ok) << c;
    EXPECT_NE(it.detail.find("config did not load"), std::string::npos) << c << ": " << it.detail;
  }
  EXPECT_TRUE(Item(r, "launcher").ok);  // needs no config
  EXPECT_EQ(r.problems(), 1);
  EXPECT_EQ(r.skipped(), 7);
  const std::string text = r.Format();
  EXPECT_NE(text.find("  FAIL  config"), std::string::npos) << text;
  EXPECT_NE(text.find("  SKIP  layout"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("1 problem, 7 checks skipped\n")) << text;
  EXPECT_FALSE(fs::exists(out_));  // nothing was created from a config that did not load
}

TEST_F(PreflightTest, BadValueIsReported) {
  PreflightReport r = RunPreflight(Options({"model.n_heads=5"}));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(Item(r, "config").detail.find("n_heads=5 does not divide d_model=32"), std::string::npos)
      << Item(r, "config").detail;
  EXPECT_TRUE(Item(r, "memory").skipped);
  PreflightReport missing = RunPreflight([&] {
    PreflightOptions o = Options();
    o.config_path = tmp_->path() + "/nope.toml";
    return o;
  }());
  EXPECT_NE(Item(missing, "config").detail.find("nope.toml: cannot open config"), std::string::npos);
  EXPECT_TRUE(Item(missing, "data.train").skipped);
}

TEST_F(PreflightTest, RanksNotMatchingTheLayoutNameBoth) {
  PreflightOptions o = Options({"parallel.dp=2"});
  o.ranks = 3;
  o.launcher = "sh";
  PreflightReport r = RunPreflight(o);
  const PreflightItem& layout = Item(r, "layout");
  EXPECT_FALSE(layout.ok);
  EXPECT_NE(layout.detail.find("dp*ep*tp*pp*cp = 2 (dp2)"), std::string::npos) << layout.detail;
  EXPECT_NE(layout.detail.find("there are 3 ranks"), std::string::npos) << layout.detail;
  EXPECT_EQ(r.problems(), 1) << r.Format();

  // The layout's own problems are reported beside the mismatch.
  o.overrides = {"parallel.tp=3"};
  o.ranks = 2;
  r = RunPreflight(o);
  EXPECT_NE(Item(r, "layout").detail.find("= 3"), std::string::npos) << Item(r, "layout").detail;
  EXPECT_NE(Item(r, "layout").detail.find("not divisible by parallel.tp=3"), std::string::npos)
      << Item(r, "layout").detail;

  // A matching layout passes.
  o.overrides = {"parallel.dp=2", "parallel.zero=2"};
  o.ranks = 2;
  r = RunPreflight(o);
  EXPECT_TRUE(r.ok()) << r.Format();
  EXPECT_NE(Item(r, "layout").detail.find("dp2 over 2 ranks, ZeRO-2"), std::string::npos) << Item(r, "layout").detail;
}

// DSA's layout rules are pre-flight's too (it used to pass tp2 x dp2 for a
// DSA model, which DistTrainer::Create then refused on every rank).
TEST_F(PreflightTest, DsaUnderTensorParallelismFailsTheLayoutCheck) {
  const std::vector<std::string> dsa = {"model.attention=\"dsa\"", "model.dsa_topk=8", "model.dsa_index_heads=2",
                                        "model.dsa_index_dim=16"};
  std::vector<std::string> over = dsa;
  over.push_back("parallel.tp=2");
  over.push_back("parallel.dp=2");
  PreflightOptions o = Options(over);
  o.ranks = 4;
  o.launcher = "sh";
  PreflightReport r = RunPreflight(o);
  const PreflightItem& layout = Item(r, "layout");
  EXPECT_FALSE(layout.ok);
  EXPECT_NE(layout.detail.find("parallel.tp=2: model.attention=\"dsa\" trains with data and expert parallelism"),
            std::string::npos)
      << layout.detail;
  EXPECT_EQ(r.problems(), 1) << r.Format();
  // dp2 x ep2 is what DSA trains with.
  over = dsa;
  over.push_back("parallel.ep=2");
  over.push_back("parallel.dp=2");
  o.overrides = over;
  r = RunPreflight(o);
  EXPECT_TRUE(r.ok()) << r.Format();
}

TEST_F(PreflightTest, MemoryThatDoesNotFitFailsWithTheNumbers) {
  PreflightOptions o = Options({"parallel.dp=4"});
  o.ranks = 4;
  o.launcher = "sh";
  o.mem_available_bytes = 1 << 20;  // 1 MiB
  PreflightReport r = RunPreflight(o);
  const PreflightItem& mem = Item(r, "memory");
  EXPECT_FALSE(mem.ok);
  const std::string want = "needs " + FormatBytes(r.memory.total) + " per rank x 4 ranks = " +
                           FormatBytes(r.memory.HostBytes(4)) + ", 1.0 MiB available";
  EXPECT_NE(mem.detail.find(want), std::string::npos) << mem.detail << "\nwanted: " << want;
  EXPECT_NE(mem.detail.find("hint"), std::string::npos);
  EXPECT_EQ(r.problems(), 1) << r.Format();

  // Two of the four ranks on this host: half the need, and it fits in 2.5x a rank.
  o.ranks_per_host = 2;
  o.mem_available_bytes = r.memory.total * 5 / 2;
  PreflightReport r2 = RunPreflight(o);
  EXPECT_TRUE(Item(r2, "memory").ok) << Item(r2, "memory").detail;
  EXPECT_NE(Item(r2, "memory").detail.find("x 2 ranks on this host"), std::string::npos) << Item(r2, "memory").detail;
  // ... but not all four.
  o.ranks_per_host = 0;
  EXPECT_FALSE(Item(RunPreflight(o), "memory").ok);
}

// Defects 4 and 6: sizes that wrap and counts that hang are problems of the
// config (before, the first passed with a negative size and the second with
// "0 problems").
TEST_F(PreflightTest, OverflowingSizesAndAbsurdCountsAreProblems) {
  for (const std::vector<std::string>& over :
       {std::vector<std::string>{"model.vocab_size=2147483647", "model.d_model=8589934592"},
        {"model.n_layers=1024", "model.n_dense_layers=1", "model.n_routed_experts=256", "model.d_model=1048576",
         "model.n_heads=4096", "model.n_kv_heads=4096", "model.d_expert=4194304"},
        {"train.threads=100000"},
        {"train.eval_batches=1000000000000"}}) {
    PreflightReport r = RunPreflight(Options(over));
    const std::string text = r.Format();
    EXPECT_FALSE(Item(r, "config").ok) << text;
    EXPECT_GE(r.problems(), 1) << text;
    EXPECT_NE(text.find(over.back().substr(0, over.back().find('='))), std::string::npos) << text;
    EXPECT_EQ(text.find("-9223372036854775808"), std::string::npos) << text;
    EXPECT_EQ(text.find("\n0 problems"), std::string::npos) << text;
  }
}

TEST_F(PreflightTest, MissingDataDirAndTokenizerAreBothReported) {
  const std::string nowhere = tmp_->path() + "/no-data";
  PreflightReport r = RunPreflight(Options({"data.dir=\"" + nowhere + "\""}));
  EXPECT_FALSE(r.ok());
  const PreflightItem& train = Item(r, "data.train");
  EXPECT_FALSE(train.ok);
  EXPECT_NE(train.detail.find("data.dir=" + nowhere), std::string::npos) << train.detail;
  const PreflightItem& tok = Item(r, "data.tokenizer");
  EXPECT_FALSE(tok.ok);
  EXPECT_NE(tok.detail.find(nowhere + "/tokenizer.model"), std::string::npos) << tok.detail;
  EXPECT_NE(tok.detail.find("myriad prepare"), std::string::npos) << tok.detail;
  const PreflightItem& val = Item(r, "data.val");  // warn only
  EXPECT_TRUE(val.ok);
  EXPECT_TRUE(val.warn);
  EXPECT_NE(val.detail.find("no validation split"), std::string::npos) << val.detail;
  EXPECT_EQ(r.problems(), 2) << r.Format();
  EXPECT_NE(r.Format().find("  warn  data.val"), std::string::npos);
}

TEST_F(PreflightTest, MissingTokenizerAloneAndMissingValSplit) {
  fs::remove(data_ + "/tokenizer.model");
  fs::remove(data_ + "/" + ShardFileName("val", 0));
  PreflightReport r = RunPreflight(Options());
  EXPECT_TRUE(Item(r, "data.train").ok) << Item(r, "data.train").detail;
  EXPECT_TRUE(Item(r, "data.val").ok);
  EXPECT_TRUE(Item(r, "data.val").warn);
  EXPECT_FALSE(Item(r, "data.tokenizer").ok);
  EXPECT_EQ(r.problems(), 1) << r.Format();
}

TEST_F(PreflightTest, DataVocabLargerThanModelIsReported) {
  PreflightReport r = RunPreflight(Options({"model.vocab_size=256"}));
  const PreflightItem& train = Item(r, "data.train");
  EXPECT_FALSE(train.ok);
  EXPECT_NE(train.detail.find("model.vocab_size=256"), std::string::npos) << train.detail;
}

TEST_F(PreflightTest, UnwritableOutDirIsReported) {
  const std::string file = tmp_->path() + "/a-file";
  std::ofstream(file) << "x";
  const std::string bad = file + "/run";
  PreflightReport r = RunPreflight(Options({"train.out_dir=\"" + bad + "\""}));
  const PreflightItem& w = Item(r, "checkpoint.write");
  EXPECT_FALSE(w.ok);
  EXPECT_NE(w.detail.find("train.out_dir=" + bad), std::string::npos) << w.detail;
  EXPECT_NE(w.detail.find("hint"), std::string::npos) << w.detail;
  EXPECT_TRUE(Item(r, "checkpoint.space").ok) << Item(r, "checkpoint.space").detail;  // still measured
  EXPECT_EQ(r.problems(), 1) << r.Format();
}

TEST_F(PreflightTest, TooLittleDiskIsReported) {
  PreflightOptions o = Options();
  o.disk_free_bytes = 1000;
  PreflightReport r = RunPreflight(o);
  const PreflightItem& s = Item(r, "checkpoint.space");
  EXPECT_FALSE(s.ok);
  const std::string want = "2 checkpoints x " + FormatBytes(r.checkpoint_bytes) + " = " +
                           FormatBytes(2 * r.checkpoint_bytes) + ", 1000 B free";
  EXPECT_NE(s.detail.find(want), std::string::npos) << s.detail << "\nwanted: " << want;
  EXPECT_EQ(r.problems(), 1) << r.Format();
  o.disk_free_bytes = 2 * r.checkpoint_bytes;
  EXPECT_TRUE(Item(RunPreflight(o), "checkpoint.space").ok);
}

TEST_F(PreflightTest, MissingLauncherIsReported) {
  PreflightOptions o = Options({"parallel.dp=2"});
  o.ranks = 2;
  o.launcher = "definitely-not-a-launcher";
  PreflightReport r = RunPreflight(o);
  const PreflightItem& l = Item(r, "launcher");
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.detail.find("\"definitely-not-a-launcher\" not found on PATH"), std::string::npos) << l.detail;
  EXPECT_EQ(r.problems(), 1) << r.Format();
  // A path is checked as given; a found one passes.
  o.launcher = tmp_->path() + "/tiny.toml";  // exists, not executable
  EXPECT_FALSE(Item(RunPreflight(o), "launcher").ok);
  o.launcher = "sh";
  EXPECT_TRUE(Item(RunPreflight(o), "launcher").ok) << Item(RunPreflight(o), "launcher").detail;
}

// ---- EstimateCheckpointBytes (the memory estimate's tests: train/memory_estimate_test.cc)

TEST(PreflightMemory, CheckpointSize) {
  const ModelConfig m;  // the defaults: an MoE of 4 layers
  TrainConfig t;
  t.seq_len = 64;
  const MemoryEstimate one = EstimateRankMemory(m, t, 1);
  const int64_t ckpt = EstimateCheckpointBytes(m);
  EXPECT_GE(ckpt, 3 * one.params);
  EXPECT_LT(ckpt, 3 * one.params + (1 << 20));
}

}  // namespace
}  // namespace myriad::supervise
