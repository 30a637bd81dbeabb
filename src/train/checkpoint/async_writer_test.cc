#include "train/checkpoint/async_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/fault_env.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

// Tensors derived from the step, so checkpoints differ.
struct Source {
  std::vector<float> embed, norm, m, v;
  int64_t opt_step = 0;
  nlohmann::json meta;

  explicit Source(int64_t step) {
    for (int i = 0; i < 64; ++i) embed.push_back(std::sin(0.37f * i + static_cast<float>(step)));
    norm = {1.0f, -2.5f, 3.25f, static_cast<float>(step)};
    for (float x : embed) m.push_back(0.1f * x), v.push_back(x * x);
    opt_step = step;
    meta = {{"model_config", {{"d_model", 4}, {"vocab", 16}}},
            {"train_config", {{"lr", 3e-4}}},
            {"data_cursor", {{"shard", 1}, {"offset", 500 + step}}},
            {"rng", {{"seed", 7}}},
            {"parallel", {{"dp", 1}, {"tp", 1}, {"pp", 1}, {"ep", 1}, {"cp", 1}}}};
  }
  std::unique_ptr<CheckpointSnapshot> Snapshot(int64_t step) const {
    auto s = std::make_unique<CheckpointSnapshot>();
    s->step = step;
    s->meta = meta;
    s->AddModel("model.embed_tokens.weight", {16, 4}, embed.data(), 64);
    s->AddModel("model.norm.weight", {4}, norm.data(), 4);
    s->AddOptimizer("model.embed_tokens.weight.exp_avg", {16, 4}, m.data(), 64);
    s->AddOptimizer("model.embed_tokens.weight.exp_avg_sq", {16, 4}, v.data(), 64);
    s->AddOptimizer(TensorView{"step", "I64", {}, &opt_step, 8});
    return s;
  }
};

class AsyncWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    base_ = (fs::path(::testing::TempDir()) /
             ("myriad_async_" + std::to_string(::getpid()) + "_" + info->name()))
                .string();
    fs::remove_all(base_);
    root_ = base_ + "/runs/x";
  }
  void TearDown() override { fs::remove_all(base_); }

  std::string Dir(int64_t step) const { return root_ + "/" + CheckpointDirName(step); }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::vector<std::string> Listed() {
    auto r = ListCheckpoints(Env::Default(), root_);
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::vector<std::string>{};
  }
  // Expects `path` to load as Source(step), bit for bit.
  void ExpectCheckpoint(const std::string& path, int64_t step) {
    auto r = LoadCheckpoint(Env::Default(), path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->step, step);
    const bool step_dir = ParseCheckpointDirName(fs::path(path).filename().string()) >= 0;
    EXPECT_EQ(r->dir, step_dir ? path : Dir(step));
    Source src(step);
    auto want = src.Snapshot(step);
    const CheckpointData data = want->View();
    ASSERT_TRUE(r->optimizer.has_value());
    for (const auto& [views, file] :
         {std::pair{&data.model, &r->model}, std::pair{&data.optimizer, &*r->optimizer}}) {
      ASSERT_EQ(file->tensors().size(), views->size());
      for (const TensorView& w : *views) {
        const TensorView* got = file->Find(w.name);
        ASSERT_NE(got, nullptr) << w.name;
        EXPECT_EQ(got->dtype, w.dtype) << w.name;
        EXPECT_EQ(got->shape, w.shape) << w.name;
        ASSERT_EQ(got->nbytes, w.nbytes) << w.name;
        EXPECT_EQ(std::memcmp(got->data, w.data, w.nbytes), 0) << w.name;
      }
    }
    for (auto it = src.meta.begin(); it != src.meta.end(); ++it) {
      EXPECT_EQ(r->manifest[it.key()], it.value()) << it.key();
    }
  }

  std::string base_, root_;
};

// A FaultEnv whose SyncDir of a step_*.tmp directory blocks until opened: a
// persist that is provably still running.
class GateEnv : public FaultEnv {
 public:
  Status SyncDir(const std::string& path) override {
    if (path.ends_with(".tmp")) {
      std::unique_lock<std::mutex> lock(mu_);
      reached_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    return FaultEnv::SyncDir(path);
  }
  void WaitReached() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, open_ = false;
};

TEST_F(AsyncWriterTest, SnapshotHoldsOwnedCopies) {
  Source src(3);
  auto s = src.Snapshot(3);
  EXPECT_EQ(s->bytes(), (64 + 4 + 64 + 64) * 4 + 8);
  const CheckpointData data = s->View();
  ASSERT_EQ(data.model.size(), 2u);
  ASSERT_EQ(data.optimizer.size(), 3u);
  EXPECT_NE(data.model[0].data, static_cast<const void*>(src.embed.data()));
  EXPECT_EQ(data.model[0].nbytes, 256u);
  EXPECT_EQ(data.model[0].dtype, "F32");
  EXPECT_EQ(data.optimizer[2].dtype, "I64");
  EXPECT_EQ(data.meta, src.meta);
  // CopyOf copies every view of a CheckpointData.
  auto copy = CheckpointSnapshot::CopyOf(3, data);
  EXPECT_EQ(copy->step, 3);
  EXPECT_EQ(copy->bytes(), s->bytes());
  const CheckpointData again = copy->View();
  ASSERT_EQ(again.model.size(), 2u);
  EXPECT_NE(again.model[0].data, data.model[0].data);
  EXPECT_EQ(std::memcmp(again.model[0].data, src.embed.data(), 256), 0);
}

TEST_F(AsyncWriterTest, PersistedSnapshotLoadsBitIdentical) {
  AsyncCheckpointWriter writer(Env::Default(), root_, 3);
  Source src(10);
  ASSERT_TRUE(writer.Submit(src.Snapshot(10), 0.01).ok());
  Status s = writer.Wait();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(writer.busy());
  ExpectCheckpoint(root_, 10);
  EXPECT_EQ(Slurp(root_ + "/latest"), "step_00000010\n");
}

// The shared-memory mirror: written by the persist thread before the main
// root, the same checkpoint bit for bit, keeping its own keep_last; a mirror
// that fails (here its disk fills) is turned off and removed while the main
// root is still written; an adopted vector is held without a copy.
TEST_F(AsyncWriterTest, MirrorIsWrittenFirstAndTurnedOffWhenItFails) {
  const std::string mirror = base_ + "/shm";
  {
    AsyncCheckpointWriter writer(Env::Default(), root_, 3);
    writer.SetMirror(Env::Default(), mirror, 2);
    for (int64_t step : {10, 20, 30}) {
      ASSERT_TRUE(writer.Submit(Source(step).Snapshot(step), 0.0).ok());
      ASSERT_TRUE(writer.Wait().ok());
    }
    for (int64_t step : {20, 30}) ExpectCheckpoint(mirror + "/" + CheckpointDirName(step), step);
    EXPECT_FALSE(fs::exists(mirror + "/" + CheckpointDirName(10))) << "mirror keeps 2";
    for (int64_t step : {10, 20, 30}) ExpectCheckpoint(Dir(step), step);
    const std::vector<SaveRecord> recs = writer.records();
    ASSERT_EQ(recs.size(), 3u);
    for (const SaveRecord& r : recs) {
      EXPECT_GT(r.mirror_s, 0.0);
      EXPECT_LE(r.mirror_s, r.persist_s);
    }
  }
  FaultEnv full;
  full.SetEnospcAfterBytes(100);
  AsyncCheckpointWriter writer(Env::Default(), root_, 3);
  writer.SetMirror(&full, mirror, 2);
  ASSERT_TRUE(writer.Submit(Source(40).Snapshot(40), 0.0).ok());
  ASSERT_TRUE(writer.Wait().ok()) << "a failed mirror is not the save's error";
  EXPECT_EQ(writer.mirror(), "");
  EXPECT_FALSE(fs::exists(mirror));
  ExpectCheckpoint(Dir(40), 40);
  ASSERT_TRUE(writer.Submit(Source(50).Snapshot(50), 0.0).ok());
  ASSERT_TRUE(writer.Wait().ok());
  EXPECT_FALSE(fs::exists(mirror)) << "off stays off";
  ExpectCheckpoint(Dir(50), 50);

  // Adopt: the snapshot owns the vector's buffer itself (no copy).
  CheckpointSnapshot snap;
  std::vector<float> data = {1.f, 2.f, 3.f};
  const float* before = data.data();
  const float* held = snap.Adopt(std::move(data));
  EXPECT_EQ(held, before);
  snap.AddModelView("w", {3}, held, 3);
  EXPECT_EQ(snap.bytes(), 12);
  ASSERT_EQ(snap.View().model.size(), 1u);
  EXPECT_EQ(snap.View().model[0].data, before);

  // A pooled snapshot's adopted buffers come back to the pool when it is
  // destroyed, and the next Take reuses them (same pages).
  auto pool = std::make_shared<SnapshotBufferPool>();
  const float* first = nullptr;
  {
    CheckpointSnapshot pooled;
    pooled.ReturnAdoptedTo(pool);
    std::vector<float> v = pool->Take(1000);
    ASSERT_EQ(v.size(), 1000u);
    first = pooled.Adopt(std::move(v));
  }
  std::vector<float> again = pool->Take(1000);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(again.size(), 1000u);
  EXPECT_NE(pool->Take(1000).data(), first) << "a buffer is lent once";
  // The smallest buffer that fits is lent: staging and whole-model sizes
  // each find their own.
  SnapshotBufferPool sizes;
  std::vector<float> big(1000), small(100);
  const float* big_p = big.data();
  const float* small_p = small.data();
  sizes.Give(std::move(big));
  sizes.Give(std::move(small));
  EXPECT_EQ(sizes.Take(50).data(), small_p);
  EXPECT_EQ(sizes.Take(50).data(), big_p);
}

// WaitMirror returns only once the last snapshot is on the mirror (a gated
// mirror write holds it), records the wait, and returns at once after that
// or without a mirror; the main root is written after the mirror.
TEST_F(AsyncWriterTest, WaitMirrorReturnsOnceTheMirrorHoldsTheSnapshot) {
  const std::string mirror = base_ + "/shm";
  GateEnv gate;
  AsyncCheckpointWriter writer(Env::Default(), root_, 3);
  writer.WaitMirror();  // nothing handed over: returns
  writer.SetMirror(&gate, mirror, 2);
  ASSERT_TRUE(writer.Submit(Source(10).Snapshot(10), 0.0).ok());
  gate.WaitReached();  // the mirror write is held inside its tmp directory
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    writer.WaitMirror();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(returned.load()) << "WaitMirror returned before the mirror was written";
  EXPECT_FALSE(fs::exists(Dir(10))) << "the main root is written after the mirror";
  gate.Open();
  waiter.join();
  ExpectCheckpoint(mirror + "/" + CheckpointDirName(10), 10);
  ASSERT_TRUE(writer.Wait().ok());
  ExpectCheckpoint(Dir(10), 10);
  const std::vector<SaveRecord> recs = writer.records();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_GE(recs[0].mirror_wait_s, 0.09);
  const auto t0 = std::chrono::steady_clock::now();
  writer.WaitMirror();  // already on the mirror: at once
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.05);
}

TEST_F(AsyncWriterTest, SourceMayChangeRightAfterAddAndSubmit) {
  GateEnv env;  // holds the persist so the changes below happen while it runs
  AsyncCheckpointWriter writer(&env, root_, 3);
  Source src(10);
  auto snap = src.Snapshot(10);
  // Training goes on: the parameters change right after the snapshot ...
  for (float& x : src.embed) x += 1.0f;
  src.norm.assign(4, -1.0f);
  src.opt_step = 999;
  ASSERT_TRUE(writer.Submit(std::move(snap), 0).ok());
  env.WaitReached();
  // ... and while it is persisted.
  for (float& x : src.m) x = 0;
  env.Open();
  ASSERT_TRUE(writer.Wait().ok());
  ExpectCheckpoint(root_, 10);  // Source(10) as it was at the snapshot
}

TEST_F(AsyncWriterTest, SecondSubmitWaitsForTheFirstAndPruningWorks) {
  GateEnv env;
  AsyncCheckpointWriter writer(&env, root_, /*keep_last=*/2);
  ASSERT_TRUE(writer.Submit(Source(10).Snapshot(10), 0).ok());
  env.WaitReached();
  EXPECT_TRUE(writer.busy());

  std::atomic<bool> returned{false};
  std::thread second([&] {
    EXPECT_TRUE(writer.Submit(Source(20).Snapshot(20), 0).ok());
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(returned.load()) << "Submit did not wait for the persist in flight";
  env.Open();
  second.join();
  // When the second Submit returned, the first persist had finished.
  auto recs = writer.records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_TRUE(recs[0].done);
  EXPECT_TRUE(recs[0].ok) << recs[0].error;
  EXPECT_GE(recs[1].blocked_s, 0.02);  // it waited (thread start-up aside, ~0.2 s)
  ASSERT_TRUE(writer.Wait().ok());
  EXPECT_EQ(Listed(), (std::vector<std::string>{Dir(10), Dir(20)}));
  ExpectCheckpoint(Dir(10), 10);
  ExpectCheckpoint(root_, 20);

  // Back to back, without waiting: keep_last=2 keeps the newest two.
  for (int64_t step : {30, 40, 50}) ASSERT_TRUE(writer.Submit(Source(step).Snapshot(step), 0).ok());
  ASSERT_TRUE(writer.Wait().ok());
  EXPECT_EQ(Listed(), (std::vector<std::string>{Dir(40), Dir(50)}));
  ExpectCheckpoint(root_, 50);
  ExpectCheckpoint(Dir(40), 40);
  for (const SaveRecord& r : writer.records()) EXPECT_TRUE(r.done && r.ok) << r.step << ": " << r.error;
}

TEST_F(AsyncWriterTest, EnospcDuringPersistIsReportedAndLeavesThePreviousCheckpoint) {
  FaultEnv env;
  AsyncCheckpointWriter writer(&env, root_, 3);
  ASSERT_TRUE(writer.Submit(Source(10).Snapshot(10), 0).ok());
  ASSERT_TRUE(writer.Wait().ok());
  const std::string latest = Slurp(root_ + "/latest");

  // The disk fills up 300 bytes into the next checkpoint (a torn model file).
  ASSERT_TRUE(env.Arm("enospc:bytes=300,path=step_").ok());
  EXPECT_TRUE(writer.Submit(Source(20).Snapshot(20), 0).ok());  // nothing failed before
  Status s = writer.Wait();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("saving step 20 failed"), std::string::npos) << s.message();
  EXPECT_GE(env.faults_fired(), 1);
  EXPECT_TRUE(writer.Wait().ok()) << "an error is reported once";
  // The previous checkpoint and `latest` are intact and loadable.
  EXPECT_EQ(Slurp(root_ + "/latest"), latest);
  EXPECT_EQ(Listed(), std::vector<std::string>{Dir(10)});
  EXPECT_FALSE(fs::exists(Dir(20) + ".tmp"));
  ExpectCheckpoint(root_, 10);
  auto recs = writer.records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_TRUE(recs[1].done);
  EXPECT_FALSE(recs[1].ok);
  EXPECT_NE(recs[1].error.find("No space left on device"), std::string::npos);

  // Space again: the next save works.
  env.Disarm();
  EXPECT_TRUE(writer.Submit(Source(30).Snapshot(30), 0).ok());
  ASSERT_TRUE(writer.Wait().ok());
  ExpectCheckpoint(root_, 30);

  // A failure not collected by Wait is reported by the next Submit.
  ASSERT_TRUE(env.Arm("enospc:bytes=0,path=step_").ok());
  ASSERT_TRUE(writer.Submit(Source(40).Snapshot(40), 0).ok());
  while (writer.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  env.Disarm();
  s = writer.Submit(Source(50).Snapshot(50), 0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("saving step 40 failed"), std::string::npos) << s.message();
  ASSERT_TRUE(writer.Wait().ok());  // step 50 was still started, and worked
  ExpectCheckpoint(root_, 50);
  EXPECT_EQ(Listed(), (std::vector<std::string>{Dir(10), Dir(30), Dir(50)}));
}

TEST_F(AsyncWriterTest, FailedLatestUpdateKeepsTheStepAndReports) {
  FaultEnv env;
  AsyncCheckpointWriter writer(&env, root_, 3);
  ASSERT_TRUE(writer.Submit(Source(10).Snapshot(10), 0).ok());
  ASSERT_TRUE(writer.Wait().ok());
  ASSERT_TRUE(env.Arm("rename:suffix=/latest").ok());
  ASSERT_TRUE(writer.Submit(Source(20).Snapshot(20), 0).ok());
  Status s = writer.Wait();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("step 20 was saved as " + Dir(20)), std::string::npos) << s.message();
  EXPECT_EQ(Slurp(root_ + "/latest"), "step_00000010\n");
  ExpectCheckpoint(root_, 10);
  ExpectCheckpoint(Dir(20), 20);
}

TEST_F(AsyncWriterTest, ExceptionsInThePersistBecomeErrors) {
  AsyncCheckpointWriter writer(Env::Default(), root_, 3);
  ASSERT_TRUE(writer.Submit(Source(10).Snapshot(10), 0).ok());
  ASSERT_TRUE(writer.Wait().ok());
  auto bad = Source(20).Snapshot(20);
  bad->meta["note"] = std::string("\xff\xfe not UTF-8");  // the JSON dump throws
  ASSERT_TRUE(writer.Submit(std::move(bad), 0).ok());
  Status s = writer.Wait();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(root_ + ": saving step 20 failed: "), std::string::npos) << s.message();
  ExpectCheckpoint(root_, 10);
  // The next save still works (and clears what the failed one left).
  ASSERT_TRUE(writer.Submit(Source(30).Snapshot(30), 0).ok());
  ASSERT_TRUE(writer.Wait().ok());
  ExpectCheckpoint(root_, 30);
  EXPECT_FALSE(fs::exists(Dir(20) + ".tmp"));
}

TEST_F(AsyncWriterTest, RecordsReportTimes) {
  AsyncCheckpointWriter writer(Env::Default(), root_, 3);
  EXPECT_TRUE(writer.records().empty());
  ASSERT_TRUE(writer.Submit(Source(10).Snapshot(10), 0.25).ok());
  ASSERT_TRUE(writer.Submit(Source(20).Snapshot(20), 0.5).ok());
  ASSERT_TRUE(writer.Wait().ok());
  auto recs = writer.records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].step, 10);
  EXPECT_EQ(recs[1].step, 20);
  EXPECT_EQ(recs[0].snapshot_s, 0.25);
  EXPECT_EQ(recs[1].snapshot_s, 0.5);
  for (const SaveRecord& r : recs) {
    EXPECT_TRUE(r.done);
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_TRUE(r.error.empty());
    EXPECT_GT(r.persist_s, 0.0);
    EXPECT_GE(r.blocked_s, 0.0);
    EXPECT_LT(r.blocked_s, 60.0);
  }
  EXPECT_EQ(recs[1].dir, Dir(20));
}

TEST_F(AsyncWriterTest, NullSnapshotIsAnError) {
  AsyncCheckpointWriter writer(Env::Default(), root_, 3);
  Status s = writer.Submit(nullptr, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no snapshot"), std::string::npos) << s.message();
  EXPECT_TRUE(writer.records().empty());
  EXPECT_FALSE(writer.busy());
}

TEST_F(AsyncWriterTest, DestructorWaitsForThePersist) {
  {
    GateEnv env;
    std::thread opener;
    {
      AsyncCheckpointWriter writer(&env, root_, 3);
      ASSERT_TRUE(writer.Submit(Source(10).Snapshot(10), 0).ok());
      env.WaitReached();
      opener = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        env.Open();
      });
    }  // the destructor blocks until the persist finished
    EXPECT_TRUE(fs::exists(Dir(10)));
    opener.join();
  }
  ExpectCheckpoint(root_, 10);
  // Without any Submit the destructor returns at once.
  { AsyncCheckpointWriter idle(Env::Default(), root_, 3); }
}

}  // namespace
}  // namespace myriad
