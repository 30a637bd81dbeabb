#include "train/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <sstream>

#include "core/checksum.h"
#include "core/fault_env.h"
#include "train/checkpoint/manifest.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

// Test model: values derived from the step so checkpoints differ.
struct Fixture {
  std::vector<float> embed, norm, bias, embed_m, embed_v, norm_m, norm_v;
  std::vector<uint16_t> bf16;
  int64_t opt_step = 0;
  CheckpointData data;

  explicit Fixture(int64_t step) {
    for (int i = 0; i < 32; ++i) embed.push_back(std::sin(0.1f * i + step));
    norm = {1.0f, 2.0f, 3.0f, 4.0f};  // mean 2.5, std sqrt(1.25), absmax 4
    bias = {0.0f, -0.5f, 0.25f, static_cast<float>(step)};
    bf16 = {0x3f80, 0x4000, 0xc040};  // 1, 2, -3
    for (float v : embed) embed_m.push_back(0.1f * v), embed_v.push_back(0.01f * v * v);
    for (float v : norm) norm_m.push_back(-v), norm_v.push_back(v * v);
    opt_step = step;
    data.meta = {
        {"model_config", {{"d_model", 4}, {"vocab", 8}, {"n_layers", 1}}},
        {"train_config", {{"lr", 3e-4}, {"batch", 2}}},
        {"data_cursor", {{"shard", 3}, {"offset", 1000 + step}}},
        {"rng", {{"seed", 1234}, {"counter", step * 7}}},
        {"parallel", {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"ep", 1}, {"cp", 1}}},
        {"tokenizer", "data/tok.model"},
    };
    data.model = {
        {"model.embed_tokens.weight", "F32", {8, 4}, embed.data(), embed.size() * 4},
        {"model.norm.weight", "F32", {4}, norm.data(), norm.size() * 4},
        {"model.layers.0.mlp.gate.e_score_correction_bias", "F32", {4}, bias.data(), 16},
        {"model.scale_bf16", "BF16", {3}, bf16.data(), 6},
    };
    data.optimizer = {
        {"model.embed_tokens.weight.exp_avg", "F32", {8, 4}, embed_m.data(), 128},
        {"model.embed_tokens.weight.exp_avg_sq", "F32", {8, 4}, embed_v.data(), 128},
        {"model.norm.weight.exp_avg", "F32", {4}, norm_m.data(), 16},
        {"model.norm.weight.exp_avg_sq", "F32", {4}, norm_v.data(), 16},
        {"step", "I64", {}, &opt_step, 8},
    };
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    base_ = (fs::path(::testing::TempDir()) /
             ("myriad_ckpt_" + std::to_string(::getpid()) + "_" + info->name()))
                .string();
    fs::remove_all(base_);
    fs::create_directories(base_);
    root_ = base_ + "/runs/x";
  }
  void TearDown() override { fs::remove_all(base_); }

  std::string Save(int64_t step, int keep_last = 3) {
    Fixture f(step);
    auto r = SaveCheckpoint(env_, root_, step, f.data, keep_last);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::string();
  }
  std::string Dir(int64_t step) const { return root_ + "/" + CheckpointDirName(step); }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static void Spit(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  std::string LoadError(const std::string& path, bool verify = true) {
    auto r = LoadCheckpoint(env_, path, verify);
    EXPECT_FALSE(r.ok()) << "loaded " << path << " unexpectedly";
    return r.ok() ? std::string() : r.status().message();
  }
  std::vector<std::string> Listed() {
    auto r = ListCheckpoints(env_, root_);
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::vector<std::string>{};
  }
  // Expects a loadable checkpoint at `step` that equals Fixture(step) bitwise.
  void ExpectCheckpoint(const std::string& path, int64_t step) {
    auto r = LoadCheckpoint(env_, path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->step, step);
    EXPECT_EQ(r->dir, Dir(step));
    Fixture f(step);
    for (const auto& [views, file] :
         {std::pair{&f.data.model, &r->model}, std::pair{&f.data.optimizer, &*r->optimizer}}) {
      ASSERT_EQ(file->tensors().size(), views->size());
      for (const TensorView& want : *views) {
        const TensorView* got = file->Find(want.name);
        ASSERT_NE(got, nullptr) << want.name;
        EXPECT_EQ(got->dtype, want.dtype);
        EXPECT_EQ(got->shape, want.shape);
        ASSERT_EQ(got->nbytes, want.nbytes);
        EXPECT_EQ(std::memcmp(got->data, want.data, want.nbytes), 0) << want.name;
      }
    }
    for (const char* key : {"model_config", "train_config", "data_cursor", "rng", "parallel",
                            "tokenizer"}) {
      EXPECT_EQ(r->manifest[key], f.data.meta[key]) << key;
    }
  }

  Env* env_ = Env::Default();
  std::string base_, root_;
};

TEST_F(CheckpointTest, DirNames) {
  EXPECT_EQ(CheckpointDirName(123), "step_00000123");
  EXPECT_EQ(CheckpointDirName(1234567890), "step_1234567890");
  EXPECT_EQ(ParseCheckpointDirName("step_00000123"), 123);
  EXPECT_EQ(ParseCheckpointDirName("step_1234567890"), 1234567890);
  EXPECT_EQ(ParseCheckpointDirName("step_00000123.tmp"), -1);
  EXPECT_EQ(ParseCheckpointDirName("step_"), -1);
  EXPECT_EQ(ParseCheckpointDirName("latest"), -1);
}

TEST_F(CheckpointTest, SaveLoadRoundTripIsBitwise) {
  const std::string dir = Save(10);
  EXPECT_EQ(dir, Dir(10));
  ExpectCheckpoint(root_, 10);
  ExpectCheckpoint(dir, 10);
  ExpectCheckpoint(root_ + "/", 10);
  EXPECT_EQ(Slurp(root_ + "/latest"), "step_00000010\n");
  EXPECT_FALSE(fs::exists(dir + ".tmp"));

  // The manifest's file list matches the bytes on disk (checked independently).
  auto manifest = nlohmann::json::parse(Slurp(dir + "/manifest.json"));
  EXPECT_EQ(manifest["format_version"], 2);
  EXPECT_EQ(manifest["manifest_xxhash64"], ManifestChecksum(manifest));
  EXPECT_EQ(manifest["step"], 10);
  ASSERT_EQ(manifest["files"].size(), 2u);
  for (const auto& f : manifest["files"]) {
    const std::string bytes = Slurp(dir + "/" + f["name"].get<std::string>());
    EXPECT_EQ(f["size"].get<uint64_t>(), bytes.size());
    EXPECT_EQ(f["xxhash64"].get<std::string>(), ChecksumHex(Checksum64(bytes)));
  }
  // model.safetensors is a plain safetensors file with HF's "format" tag.
  auto model = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->metadata().at("format"), "pt");
  auto norm = ReadF32(*model, "model.norm.weight", {4});
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(*norm, (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(CheckpointTest, OptimizerIsOptional) {
  Fixture f(5);
  f.data.optimizer.clear();
  ASSERT_TRUE(SaveCheckpoint(env_, root_, 5, f.data).ok());
  auto r = LoadCheckpoint(env_, root_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->optimizer.has_value());
  EXPECT_EQ(r->model.tensors().size(), 4u);
}

TEST_F(CheckpointTest, LatestFollowsNewestAndOlderStaysLoadable) {
  Save(10);
  Save(20);
  EXPECT_EQ(Slurp(root_ + "/latest"), "step_00000020\n");
  ExpectCheckpoint(root_, 20);
  ExpectCheckpoint(Dir(10), 10);
  EXPECT_EQ(Listed(), (std::vector<std::string>{Dir(10), Dir(20)}));

  // Without `latest` (a crash before it was first written) the highest step wins.
  fs::remove(root_ + "/latest");
  ExpectCheckpoint(root_, 20);
}

TEST_F(CheckpointTest, KeepLastPrunesOldest) {
  for (int s = 1; s <= 5; ++s) Save(s * 100, /*keep_last=*/2);
  EXPECT_EQ(Listed(), (std::vector<std::string>{Dir(400), Dir(500)}));
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "latest" || n == "step_00000400" || n == "step_00000500") << n;
  }
  // 0 keeps all.
  for (int s = 6; s <= 9; ++s) Save(s * 100, /*keep_last=*/0);
  EXPECT_EQ(Listed().size(), 6u);
  // Saving a lower step (resumed from an older checkpoint) never prunes itself.
  Save(50, /*keep_last=*/1);
  EXPECT_EQ(Listed(), (std::vector<std::string>{Dir(50)}));
  ExpectCheckpoint(root_, 50);
}

TEST_F(CheckpointTest, ResavingAStepReplacesIt) {
  Save(10);
  Fixture other(77);  // different contents, saved under step 10
  ASSERT_TRUE(SaveCheckpoint(env_, root_, 10, other.data).ok());
  auto r = LoadCheckpoint(env_, root_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->manifest["data_cursor"]["offset"], 1077);
  EXPECT_FALSE(fs::exists(Dir(10) + ".deleting"));
}

TEST_F(CheckpointTest, FlippedByteGivesChecksumMismatch) {
  Save(5);
  Save(10);
  const std::string file = Dir(10) + "/model.safetensors";
  std::string bytes = Slurp(file);
  bytes[bytes.size() - 3] ^= 0x40;  // inside the tensor data: still parses
  Spit(file, bytes);
  const std::string m = LoadError(root_);
  EXPECT_EQ(m.rfind(file + ": checksum mismatch (expected ", 0), 0u) << m;
  EXPECT_NE(m.find("— the file is corrupt (hint: use an earlier checkpoint: " + Dir(5) + ")"),
            std::string::npos)
      << m;
  // Without verification the damaged file still loads (the caller opted out).
  EXPECT_TRUE(LoadCheckpoint(env_, root_, /*verify_checksums=*/false).ok());
}

TEST_F(CheckpointTest, TruncatedFileGivesSizeMismatch) {
  Save(10);
  const std::string file = Dir(10) + "/optimizer.safetensors";
  const auto size = fs::file_size(file);
  fs::resize_file(file, size - 100);
  const std::string m = LoadError(Dir(10), /*verify=*/false);
  EXPECT_NE(m.find(file + ": size is " + std::to_string(size - 100) + " bytes but manifest.json says " +
                   std::to_string(size) + " — the file is truncated"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("hint: no earlier checkpoint in " + root_), std::string::npos) << m;
}

TEST_F(CheckpointTest, MissingAndDamagedManifest) {
  Save(10);
  const std::string manifest = Dir(10) + "/manifest.json";
  const std::string good = Slurp(manifest);

  fs::remove(manifest);
  std::string m = LoadError(Dir(10));
  EXPECT_EQ(m.rfind(manifest + ": missing (hint: the checkpoint is incomplete", 0), 0u) << m;
  // A step directory without a manifest is not complete: not listed.
  EXPECT_TRUE(Listed().empty());

  Spit(manifest, "{\"format_version\": 1, \"step\": 10, \"files\": [");
  m = LoadError(root_);
  EXPECT_EQ(m.rfind(manifest + ": not a valid JSON object", 0), 0u) << m;

  auto j = nlohmann::json::parse(good);
  j["format_version"] = 99;
  Spit(manifest, j.dump());
  m = LoadError(root_);
  EXPECT_NE(m.find(manifest + ": format_version 99 is not supported; this build reads version 2"),
            std::string::npos)
      << m;

  j = nlohmann::json::parse(good);
  j["files"][0]["name"] = "../../etc/passwd";
  j["manifest_xxhash64"] = ManifestChecksum(j);  // re-signed: the name check itself
  Spit(manifest, j.dump());
  m = LoadError(root_);
  EXPECT_NE(m.find("is not a plain file name"), std::string::npos) << m;

  Spit(manifest, good);
  fs::remove(Dir(10) + "/optimizer.safetensors");
  m = LoadError(root_);
  EXPECT_EQ(m.rfind(Dir(10) + "/optimizer.safetensors: listed in manifest.json but missing", 0), 0u)
      << m;
}

// Every byte of the manifest that decides a resume is covered by its own
// checksum: an edited step, data cursor or config is refused with the
// manifest named, and loading falls back to the checkpoint before; a
// reformatted (re-indented, reordered) manifest still loads.
TEST_F(CheckpointTest, EditedManifestIsRefusedAndFallsBack) {
  Save(10);
  Save(20);
  const std::string manifest = Dir(20) + "/manifest.json";
  const std::string good = Slurp(manifest);
  const auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    auto j = nlohmann::json::parse(good);
    f(j);
    Spit(manifest, j.dump(2));
  };
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> edits = {
      {"step", [](nlohmann::json& j) { j["step"] = 21; }},
      {"data cursor", [](nlohmann::json& j) { j["data_cursor"]["offset"] = 1; }},
      {"train config", [](nlohmann::json& j) { j["train_config"] = {{"lr", 1.0}}; }},
      {"a file size", [](nlohmann::json& j) { j["files"][0]["size"] = 1; }},
      {"the checksum removed", [](nlohmann::json& j) { j.erase("manifest_xxhash64"); }},
      {"the checksum changed", [](nlohmann::json& j) { j["manifest_xxhash64"] = "0123456789abcdef"; }},
      {"a key added", [](nlohmann::json& j) { j["extra"] = true; }},
  };
  for (const auto& [what, f] : edits) {
    SCOPED_TRACE(what);
    edit(f);
    const std::string m = LoadError(Dir(20));
    EXPECT_EQ(m.rfind(manifest + ": ", 0), 0u) << m;
    EXPECT_TRUE(m.find("checksum mismatch") != std::string::npos ||
                m.find("has no manifest_xxhash64") != std::string::npos)
        << m;
    EXPECT_NE(m.find("use an earlier checkpoint: " + Dir(10)), std::string::npos) << m;
    std::vector<std::string> skipped;
    auto r = LoadNewestValidCheckpoint(env_, root_, &skipped);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->step, 10);
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_NE(skipped[0].find(manifest), std::string::npos) << skipped[0];
  }
  // A step directory renamed to another step (a consistent manifest in the
  // wrong place) is refused too.
  Spit(manifest, good);
  fs::rename(Dir(20), Dir(30));
  const std::string m = LoadError(Dir(30));
  EXPECT_NE(m.find("says step 20 but its directory is step 30"), std::string::npos) << m;
  fs::rename(Dir(30), Dir(20));
  // Whitespace and key order do not matter.
  auto j = nlohmann::json::parse(good);
  Spit(manifest, j.dump());
  auto r = LoadCheckpoint(env_, Dir(20));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step, 20);
}

TEST_F(CheckpointTest, LatestPointingAtMissingDir) {
  Save(10);
  Spit(root_ + "/latest", "step_00000099\n");
  std::string m = LoadError(root_);
  EXPECT_EQ(m, root_ + "/latest: points to step_00000099, which does not exist (hint: the newest "
                       "complete one is " + Dir(10) + "; pass it explicitly or write its name "
                       "into latest)");
  Spit(root_ + "/latest", "../../elsewhere");
  m = LoadError(root_);
  EXPECT_NE(m.find("not a checkpoint directory name"), std::string::npos) << m;
}

TEST_F(CheckpointTest, MissingPath) {
  std::string m = LoadError(base_ + "/runs/nope");
  EXPECT_EQ(m.rfind(base_ + "/runs/nope: no checkpoint found (hint: ", 0), 0u) << m;
  fs::create_directories(root_);
  m = LoadError(root_);
  EXPECT_EQ(m.rfind(root_ + ": no checkpoint found (hint: ", 0), 0u) << m;
  EXPECT_TRUE(Listed().empty());
  auto none = ListCheckpoints(env_, base_ + "/runs/nope");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// Counts the writes of one save so every failure point can be tried.
int CountAppends(const std::string& root, int64_t step) {
  FaultEnv counting;
  Fixture f(step);
  EXPECT_TRUE(SaveCheckpoint(&counting, root, step, f.data).ok());
  return static_cast<int>(counting.appends());
}

TEST_F(CheckpointTest, FailedSaveLeavesPreviousCheckpointAndLatest) {
  Save(10);
  const std::string latest = Slurp(root_ + "/latest");
  const int total_appends = CountAppends(base_ + "/count", 20);
  ASSERT_GE(total_appends, 4);
  const int64_t total_bytes = [&] {
    int64_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(base_ + "/count")) {
      if (e.is_regular_file() && e.path().filename() != "latest") n += e.file_size();
    }
    return n;
  }();

  auto check_untouched = [&](const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(Slurp(root_ + "/latest"), latest);
    EXPECT_EQ(Listed(), std::vector<std::string>{Dir(10)});
    EXPECT_FALSE(fs::exists(Dir(20) + ".tmp")) << "partial save not cleaned up";
    ExpectCheckpoint(root_, 10);
  };
  auto expect_failure = [&](FaultEnv& env, const std::string& what) {
    Fixture f(20);
    auto r = SaveCheckpoint(&env, root_, 20, f.data);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().message().rfind(root_ + ": saving step 20 failed: ", 0), 0u)
        << r.status().message();
    EXPECT_NE(r.status().message().find("the previous checkpoint and 'latest' are untouched"),
              std::string::npos);
    // "free space" is the hint for a full disk only, never for other errors.
    const bool full = r.status().message().find("No space left on device") != std::string::npos;
    EXPECT_EQ(r.status().message().find("(hint: free space under ") != std::string::npos, full)
        << r.status().message();
    check_untouched(what);
  };

  // The last write is `latest` itself (tested below); all before it come
  // before the step directory is renamed into place.
  for (int n = 1; n < total_appends; ++n) {
    FaultEnv env;
    env.SetFailAppend(n);
    expect_failure(env, "append #" + std::to_string(n));
  }
  for (int64_t b : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{300},
                    total_bytes / 2, total_bytes - 1}) {
    FaultEnv env;
    env.SetEnospcAfterBytes(b);
    expect_failure(env, "ENOSPC after " + std::to_string(b) + " bytes");
  }
  for (const char* target : {"/model.safetensors", "/optimizer.safetensors", "/manifest.json",
                             "/step_00000020"}) {
    FaultEnv env;
    env.SetFailRename(target);
    expect_failure(env, std::string("rename to ") + target);
  }
  {
    FaultEnv env;
    env.SetFailSyncDir("step_00000020.tmp");
    expect_failure(env, "fsync of the tmp dir");
  }

  // Once the step directory is in place, a failure to update `latest` (its
  // write or its rename) leaves `latest` as it was; the new checkpoint is
  // complete, and the error says so.
  for (int mode = 0; mode < 2; ++mode) {
    FaultEnv env;
    if (mode == 0) env.SetFailAppend(total_appends);
    if (mode == 1) env.SetFailRename("/latest");
    Fixture f(20);
    auto r = SaveCheckpoint(&env, root_, 20, f.data);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("step 20 was saved as " + Dir(20)), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("latest"), std::string::npos) << r.status().message();
    EXPECT_EQ(Slurp(root_ + "/latest"), latest);
    EXPECT_FALSE(fs::exists(root_ + "/latest.tmp"));
    ExpectCheckpoint(root_, 10);
    ExpectCheckpoint(Dir(20), 20);
    fs::remove_all(Dir(20));
  }

  // And a healthy save afterwards works normally.
  Save(30);
  ExpectCheckpoint(root_, 30);
}

TEST_F(CheckpointTest, LeftoverTmpDirIsIgnoredAndCleaned) {
  Save(10);
  // A crashed save of step 30: partial files, even a manifest.
  const std::string tmp = Dir(30) + ".tmp";
  fs::create_directories(tmp);
  Spit(tmp + "/model.safetensors", "garbage");
  Spit(tmp + "/manifest.json", "{}");
  fs::create_directories(Dir(5) + ".deleting");  // a crashed prune
  EXPECT_EQ(Listed(), std::vector<std::string>{Dir(10)});
  ExpectCheckpoint(root_, 10);
  EXPECT_NE(LoadError(tmp).find("an incomplete checkpoint"), std::string::npos);

  Save(20);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(Dir(5) + ".deleting"));
  EXPECT_EQ(Listed(), (std::vector<std::string>{Dir(10), Dir(20)}));
}

TEST_F(CheckpointTest, InspectReportsManifestFilesAndTensorStats) {
  Save(10);
  std::ostringstream out;
  Status s = InspectCheckpoint(root_, out);
  const std::string text = out.str();
  ASSERT_TRUE(s.ok()) << s.message() << "\n" << text;
  EXPECT_NE(text.find("checkpoint " + Dir(10)), std::string::npos) << text;
  EXPECT_NE(text.find("step            10"), std::string::npos) << text;
  EXPECT_NE(text.find("\"d_model\":4"), std::string::npos) << text;
  EXPECT_NE(text.find("\"offset\":1010"), std::string::npos) << text;
  EXPECT_NE(text.find("model.safetensors"), std::string::npos);
  EXPECT_EQ(text.find("FAILED"), std::string::npos) << text;
  // norm = {1,2,3,4}: mean 2.5, population std sqrt(1.25) = 1.118, absmax 4.
  const size_t row = text.find("model.norm.weight ");
  ASSERT_NE(row, std::string::npos) << text;
  const std::string line = text.substr(row, text.find('\n', row) - row);
  EXPECT_NE(line.find("F32"), std::string::npos) << line;
  EXPECT_NE(line.find("[4]"), std::string::npos) << line;
  EXPECT_NE(line.find(" 2.5 "), std::string::npos) << line;
  EXPECT_NE(line.find(" 1.118 "), std::string::npos) << line;
  EXPECT_NE(line.find(" 4 "), std::string::npos) << line;
  // BF16 {1, 2, -3}: mean 0, absmax 3.
  const size_t bf = text.find("model.scale_bf16");
  ASSERT_NE(bf, std::string::npos);
  EXPECT_NE(text.substr(bf, text.find('\n', bf) - bf).find(" 3 "), std::string::npos) << text;
  // 32 + 4 + 4 + 3 model elements.
  EXPECT_NE(text.find("parameters (incl. buffers): 43"), std::string::npos) << text;

  // A corrupt file is reported, and the report still prints.
  const std::string file = Dir(10) + "/optimizer.safetensors";
  std::string bytes = Slurp(file);
  bytes.back() ^= 1;
  Spit(file, bytes);
  std::ostringstream out2;
  s = InspectCheckpoint(Dir(10), out2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(out2.str().find("FAILED"), std::string::npos) << out2.str();
  EXPECT_NE(out2.str().find("checksum mismatch"), std::string::npos) << out2.str();
  EXPECT_NE(out2.str().find("model.norm.weight "), std::string::npos);
}

// Every file and directory under `dir` with its bytes ("<dir>" for
// directories): to prove that loading changed nothing.
std::map<std::string, std::string> TreeOf(const std::string& dir) {
  std::map<std::string, std::string> tree;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_directory()) {
      tree[e.path().string()] = "<dir>";
    } else {
      std::ifstream in(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      tree[e.path().string()] = ss.str();
    }
  }
  return tree;
}

class FallbackLoadTest : public CheckpointTest {
 protected:
  // LoadNewestValidCheckpoint(root_), checking that nothing under base_
  // changed and that the loaded checkpoint equals Fixture(want_step).
  std::vector<std::string> LoadExpecting(int64_t want_step) {
    const auto before = TreeOf(base_);
    std::vector<std::string> skipped;
    auto r = LoadNewestValidCheckpoint(env_, root_, &skipped);
    EXPECT_EQ(TreeOf(base_), before) << "loading modified the checkpoint root";
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return skipped;
    EXPECT_EQ(r->step, want_step);
    EXPECT_EQ(r->dir, Dir(want_step));
    Fixture f(want_step);
    for (const TensorView& want : f.data.model) {
      const TensorView* got = r->model.Find(want.name);
      EXPECT_NE(got, nullptr) << want.name;
      if (got == nullptr) continue;
      EXPECT_EQ(got->nbytes, want.nbytes);
      EXPECT_EQ(std::memcmp(got->data, want.data, std::min(got->nbytes, want.nbytes)), 0) << want.name;
    }
    EXPECT_EQ(r->manifest["data_cursor"], f.data.meta["data_cursor"]);
    return skipped;
  }
  std::string LoadFailing(std::vector<std::string>* skipped) {
    const auto before = TreeOf(base_);
    auto r = LoadNewestValidCheckpoint(env_, root_, skipped);
    EXPECT_EQ(TreeOf(base_), before) << "loading modified the checkpoint root";
    EXPECT_FALSE(r.ok()) << "loaded " << r->dir << " unexpectedly";
    return r.ok() ? std::string() : r.status().message();
  }
};

TEST_F(FallbackLoadTest, HealthyLoadsLatestAndSkipsNothing) {
  Save(10);
  Save(20);
  EXPECT_TRUE(LoadExpecting(20).empty());
  // A null `skipped` is allowed.
  auto r = LoadNewestValidCheckpoint(env_, root_ + "/", nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step, 20);
}

TEST_F(FallbackLoadTest, TornLatestFallsBackToThePreviousStep) {
  Save(10);
  Save(20);
  Save(30);
  const std::string file = Dir(30) + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);
  const auto skipped = LoadExpecting(20);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].rfind(Dir(30) + ": " + file + ": size is ", 0), 0u) << skipped[0];
  EXPECT_NE(skipped[0].find("the file is truncated"), std::string::npos) << skipped[0];
  EXPECT_EQ(skipped[0].find("(hint: "), std::string::npos) << skipped[0];
}

TEST_F(FallbackLoadTest, FlippedByteFallsBackToThePreviousStep) {
  Save(10);
  Save(20);
  const std::string file = Dir(20) + "/optimizer.safetensors";
  std::string bytes = Slurp(file);
  bytes[bytes.size() - 5] ^= 0x10;
  Spit(file, bytes);
  const auto skipped = LoadExpecting(10);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].rfind(Dir(20) + ": " + file + ": checksum mismatch", 0), 0u) << skipped[0];
}

TEST_F(FallbackLoadTest, AllCorruptFailsNamingEveryOne) {
  Save(10);
  Save(20);
  Save(30);
  fs::resize_file(Dir(30) + "/model.safetensors", 10);
  std::string bytes = Slurp(Dir(20) + "/model.safetensors");
  bytes.back() ^= 1;
  Spit(Dir(20) + "/model.safetensors", bytes);
  fs::remove(Dir(10) + "/optimizer.safetensors");
  std::vector<std::string> skipped;
  const std::string m = LoadFailing(&skipped);
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_EQ(skipped[0].rfind(Dir(30) + ": ", 0), 0u) << skipped[0];
  EXPECT_EQ(skipped[1].rfind(Dir(20) + ": ", 0), 0u) << skipped[1];
  EXPECT_EQ(skipped[2].rfind(Dir(10) + ": ", 0), 0u) << skipped[2];
  EXPECT_NE(skipped[2].find("listed in manifest.json but missing"), std::string::npos) << skipped[2];
  EXPECT_EQ(m.rfind(root_ + ": no checkpoint loads; skipped 3: ", 0), 0u) << m;
  for (const std::string& s : skipped) EXPECT_NE(m.find(s), std::string::npos) << m;
  EXPECT_NE(m.find("(hint: "), std::string::npos) << m;
}

TEST_F(FallbackLoadTest, LatestNamingADeletedDirIsSkipped) {
  Save(10);
  Save(20);
  fs::remove_all(Dir(20));
  const auto skipped = LoadExpecting(10);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0], Dir(20) + ": named by " + root_ + "/latest but does not exist");

  // A `latest` holding no checkpoint name is skipped too.
  Spit(root_ + "/latest", "../../elsewhere\n");
  const auto skipped2 = LoadExpecting(10);
  ASSERT_EQ(skipped2.size(), 1u);
  EXPECT_EQ(skipped2[0], root_ + "/latest: holds \"../../elsewhere\", not a checkpoint directory name");

  // And no `latest` at all: the highest complete step, nothing skipped.
  fs::remove(root_ + "/latest");
  EXPECT_TRUE(LoadExpecting(10).empty());
}

TEST_F(FallbackLoadTest, LatestIsTriedFirstThenDescendingSteps) {
  Save(10);
  Save(20);
  Save(5, /*keep_last=*/0);  // resumed from an older checkpoint: latest = step 5
  EXPECT_EQ(Slurp(root_ + "/latest"), "step_00000005\n");
  EXPECT_TRUE(LoadExpecting(5).empty());
  fs::resize_file(Dir(5) + "/model.safetensors", 100);
  auto skipped = LoadExpecting(20);
  ASSERT_EQ(skipped.size(), 1u);  // step 5 is not tried twice
  EXPECT_EQ(skipped[0].rfind(Dir(5) + ": ", 0), 0u) << skipped[0];
  // Incomplete directories (no manifest) and leftovers are never candidates.
  fs::create_directories(Dir(40) + ".tmp");
  fs::create_directories(Dir(50));
  Spit(Dir(50) + "/model.safetensors", "partial");
  skipped = LoadExpecting(20);
  EXPECT_EQ(skipped.size(), 1u);
}

TEST_F(FallbackLoadTest, NothingToLoad) {
  std::vector<std::string> skipped;
  auto r = LoadNewestValidCheckpoint(env_, base_ + "/runs/nope", &skipped);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(base_ + "/runs/nope: no checkpoint found (hint: ", 0), 0u)
      << r.status().message();
  EXPECT_TRUE(skipped.empty());
  fs::create_directories(root_);
  const std::string m = LoadFailing(&skipped);
  EXPECT_EQ(m.rfind(root_ + ": no checkpoint found (hint: ", 0), 0u) << m;
}

TEST_F(FallbackLoadTest, AStepDirectoryIsLoadedWithoutFallback) {
  Save(10);
  Save(20);
  auto r = LoadNewestValidCheckpoint(env_, Dir(10), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step, 10);
  fs::resize_file(Dir(10) + "/model.safetensors", 100);
  std::vector<std::string> skipped;
  auto bad = LoadNewestValidCheckpoint(env_, Dir(10), &skipped);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("truncated"), std::string::npos) << bad.status().message();
  EXPECT_TRUE(skipped.empty());
}

}  // namespace
}  // namespace myriad
