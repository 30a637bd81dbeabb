// One writer per run directory (run_lock.h): a second launch or train on a
// folder in use is refused naming the holder; a supervised rank is not
// refused by its own supervisor; a job left by a dead supervisor is named;
// a stale lock file is taken over with a warning naming the old pid. flock
// locks of two open files conflict within one process too, so one test
// process plays every holder.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "train/supervise/heartbeat.h"
#include "train/supervise/run_lock.h"

namespace myriad::supervise {
namespace {

// A run directory of its own per test (not created: the locks create it).
class RunLockTest : public ::testing::Test {
 protected:
  RunLockTest() : dir_(testing::TempDir() + "myriad-runlock-" + std::to_string(getpid())) {
    std::filesystem::remove_all(dir_);
  }
  ~RunLockTest() override { std::filesystem::remove_all(dir_); }
  std::string Read(const char* name) {
    std::ifstream f(dir_ + "/" + name);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  void Write(const char* name, const std::string& text) {
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/" + name) << text;
  }
  // A pid that was this machine's and is no more.
  static pid_t DeadPid() {
    const pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, nullptr, 0);
    return p;
  }
  std::string me() const { return "pid " + std::to_string(getpid()) + " on host " + MachineName(); }
  std::string dir_;
};

TEST_F(RunLockTest, ASecondLaunchOrTrainIsRefusedNamingTheHolder) {
  auto first = RunLock::ForLaunch(dir_);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_NE(Read(kLaunchLockFile).find("\"pid\":" + std::to_string(getpid())), std::string::npos);

  auto second = RunLock::ForLaunch(dir_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(), dir_ + " is in use: myriad launch " + me() + " holds " + dir_ +
                                           "/launch.lock (hint: stop it first, or set train.out_dir to another folder)");
  // A bare train (no supervisor) is refused by the launch's lock ...
  auto bare = RunLock::ForTrain(dir_, 0);
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("myriad launch " + me() + " holds " + dir_ + "/launch.lock"),
            std::string::npos);
  // ... the launch's own rank 0 is not, and then holds train.lock.
  auto rank0 = RunLock::ForTrain(dir_, getpid());
  ASSERT_TRUE(rank0.ok()) << rank0.status().message();
  auto another = RunLock::ForTrain(dir_, getpid());
  ASSERT_FALSE(another.ok());
  EXPECT_NE(another.status().message().find("myriad train " + me() + " holds " + dir_ + "/train.lock (under myriad "
                                            "launch pid " + std::to_string(getpid()) + ")"),
            std::string::npos)
      << another.status().message();

  // Released: emptied, and free for the next one.
  rank0->reset();
  first->reset();
  EXPECT_EQ(Read(kLaunchLockFile), "");
  EXPECT_EQ(Read(kTrainLockFile), "");
  EXPECT_TRUE(RunLock::ForTrain(dir_, 0).ok());
  EXPECT_TRUE(RunLock::ForLaunch(dir_).ok());
}

TEST_F(RunLockTest, ALaunchFindsTheJobADeadSupervisorLeftRunning) {
  const pid_t dead = DeadPid();
  auto orphan = RunLock::ForTrain(dir_, dead);  // rank 0 of a launch that is gone
  ASSERT_TRUE(orphan.ok()) << orphan.status().message();
  auto launch = RunLock::ForLaunch(dir_);
  ASSERT_FALSE(launch.ok());
  EXPECT_NE(launch.status().message().find("myriad train " + me() + " holds " + dir_ + "/train.lock (left running "
                                           "by myriad launch pid " + std::to_string(dead) + ", which is gone)"),
            std::string::npos)
      << launch.status().message();
  EXPECT_EQ(Read(kLaunchLockFile), "");  // the refused launch left nothing behind
}

TEST_F(RunLockTest, AStaleLockIsTakenOverWithAWarningNamingTheOldPid) {
  const pid_t dead = DeadPid();
  Write(kLaunchLockFile, "{\"pid\":" + std::to_string(dead) + ",\"host\":\"" + MachineName() +
                             "\",\"role\":\"launch\",\"supervisor\":0}\n");
  ::testing::internal::CaptureStderr();
  auto lock = RunLock::ForLaunch(dir_);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(lock.ok()) << lock.status().message();
  EXPECT_NE(log.find(dir_ + "/launch.lock: taking over a stale lock: myriad launch pid " + std::to_string(dead) +
                     " on host " + MachineName() + " is no longer running"),
            std::string::npos)
      << log;
  EXPECT_NE(Read(kLaunchLockFile).find("\"pid\":" + std::to_string(getpid())), std::string::npos);
}

// A damaged lock file (wrong types, not JSON) is taken over, never thrown on.
TEST_F(RunLockTest, ADamagedLockFileIsTakenOver) {
  for (const char* text : {"{\"pid\":\"12\",\"host\":7,\"role\":[1],\"supervisor\":\"x\"}", "not json", ""}) {
    SCOPED_TRACE(text);
    Write(kLaunchLockFile, text);
    auto lock = RunLock::ForLaunch(dir_);
    ASSERT_TRUE(lock.ok()) << lock.status().message();
    EXPECT_NE(Read(kLaunchLockFile).find("\"pid\":" + std::to_string(getpid())), std::string::npos);
  }
}

TEST_F(RunLockTest, AnUnwritableFolderIsAClearError) {
  Write("blocker", "x");
  auto lock = RunLock::ForLaunch(dir_ + "/blocker/run");
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.status().message().find(dir_ + "/blocker/run: cannot create the run directory"), std::string::npos)
      << lock.status().message();
}

}  // namespace
}  // namespace myriad::supervise
