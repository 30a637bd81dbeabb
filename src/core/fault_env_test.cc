#include "core/fault_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace myriad {
namespace {

namespace fs = std::filesystem;

class FaultEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(::testing::TempDir()) /
            ("myriad_fault_" + std::to_string(::getpid()) + "_" + info->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Writes `chunks` to `name` through env, one Append each; returns the first
  // error's message ("" if all succeeded) and how many Appends succeeded.
  std::string Write(Env* env, const std::string& name, const std::vector<std::string>& chunks,
                    int* ok_appends = nullptr) {
    auto f = env->NewWritableFile(Path(name));
    EXPECT_TRUE(f.ok()) << f.status().message();
    if (!f.ok()) return f.status().message();
    std::string err;
    int ok = 0;
    for (const std::string& c : chunks) {
      Status s = (*f)->Append(c);
      if (!s.ok()) {
        if (err.empty()) err = s.message();
      } else {
        ++ok;
      }
    }
    EXPECT_TRUE((*f)->Close().ok());
    if (ok_appends) *ok_appends = ok;
    return err;
  }

  std::string dir_;
};

TEST_F(FaultEnvTest, UnarmedPassesEverythingThrough) {
  FaultEnv env;
  EXPECT_EQ(env.Armed(), "");
  EXPECT_EQ(Write(&env, "a", {"hello ", "world"}), "");
  EXPECT_EQ(Slurp(Path("a")), "hello world");
  EXPECT_EQ(env.appends(), 2);
  EXPECT_EQ(env.bytes_written(), 11);
  ASSERT_TRUE(env.RenameFile(Path("a"), Path("b")).ok());
  EXPECT_TRUE(env.FileExists(Path("b")));
  EXPECT_TRUE(env.SyncDir(dir_).ok());
  auto r = env.ReadFile(Path("b"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "hello world");
  auto names = env.ListDir(dir_);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"b"});
  EXPECT_EQ(env.faults_fired(), 0);
}

TEST_F(FaultEnvTest, EnospcTearsTheCrossingWriteAndStaysInForce) {
  FaultEnv env;
  ASSERT_TRUE(env.Arm("enospc:bytes=10").ok());
  EXPECT_EQ(env.Armed(), "enospc:bytes=10");
  int ok = 0;
  const std::string err = Write(&env, "f", {"0123", "4567", "89abcdef", "more"}, &ok);
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(err, Path("f") + ": write failed: No space left on device (injected fault)");
  // The crossing Append wrote what fitted (2 of 8 bytes); later ones nothing.
  EXPECT_EQ(Slurp(Path("f")), "0123456789");
  EXPECT_EQ(env.faults_fired(), 2);
  EXPECT_EQ(env.bytes_written(), 10);
  // A full disk stays full: another file gets nothing.
  EXPECT_NE(Write(&env, "g", {"x"}), "");
  EXPECT_EQ(Slurp(Path("g")), "");
  // Empty appends still succeed (nothing to write).
  EXPECT_EQ(Write(&env, "h", {""}), "");
}

// crash: the Append that crosses the budget (on a matching path; every
// write counts toward it) writes what fits, then the process dies by SIGKILL.
TEST_F(FaultEnvTest, CrashKillsTheProcessMidWrite) {
  FaultEnv probe;
  ASSERT_TRUE(probe.Arm("crash:bytes=10,path=step_").ok());
  EXPECT_EQ(probe.Armed(), "crash:bytes=10,path=step_");
  EXPECT_FALSE(probe.Arm("crash:bytes=-1").ok());
  EXPECT_EXIT(
      {
        FaultEnv env;
        (void)env.Arm("crash:bytes=10,path=step_");
        Write(&env, "other", {"0123"});           // counts, does not match
        Write(&env, "step_1", {"abcd", "efghij"});  // crosses at 10: "ef" fits
        std::_Exit(0);                            // not reached
      },
      ::testing::KilledBySignal(SIGKILL), "crash while writing .*step_1 \\(injected fault\\)");
  EXPECT_EQ(Slurp(Path("other")), "0123");
  EXPECT_EQ(Slurp(Path("step_1")), "abcdef");
}

TEST_F(FaultEnvTest, EnospcExactBudgetAndZero) {
  FaultEnv env;
  env.SetEnospcAfterBytes(8);
  EXPECT_EQ(Write(&env, "f", {"0123", "4567"}), "");  // exactly the budget: fine
  EXPECT_NE(Write(&env, "g", {"8"}), "");
  env.SetEnospcAfterBytes(0);  // re-arming restarts the count: nothing fits
  EXPECT_NE(Write(&env, "z", {"abc"}), "");
  EXPECT_EQ(Slurp(Path("z")), "");
}

TEST_F(FaultEnvTest, EnospcOnlyHitsMatchingPathsButCountsAllBytes) {
  FaultEnv env;
  ASSERT_TRUE(env.Arm("enospc:bytes=6,path=step_").ok());
  EXPECT_EQ(env.Armed(), "enospc:bytes=6,path=step_");
  // Writes elsewhere succeed, and use up the budget.
  EXPECT_EQ(Write(&env, "metrics", {"abcd"}), "");
  const std::string err = Write(&env, "step_1", {"0123"});
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_EQ(Slurp(Path("step_1")), "01");
  EXPECT_EQ(Write(&env, "metrics2", {"still fine"}), "");
  EXPECT_EQ(Slurp(Path("metrics2")), "still fine");
  EXPECT_EQ(env.faults_fired(), 1);
}

TEST_F(FaultEnvTest, FailsTheNthAppendOnce) {
  FaultEnv env;
  ASSERT_TRUE(env.Arm("append:n=3").ok());
  int ok = 0;
  const std::string err = Write(&env, "f", {"a", "b", "c", "d", "e"}, &ok);
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(err, Path("f") + ": write failed: Input/output error (injected fault: append #3)");
  EXPECT_EQ(Slurp(Path("f")), "abde");  // the failed Append wrote nothing
  EXPECT_EQ(env.faults_fired(), 1);
  EXPECT_EQ(env.appends(), 5);
  // Counted per arming, across files.
  env.SetFailAppend(2);
  EXPECT_EQ(Write(&env, "g", {"x"}), "");
  EXPECT_NE(Write(&env, "h", {"y"}), "");
  EXPECT_EQ(Write(&env, "i", {"z"}), "");
  EXPECT_EQ(env.faults_fired(), 2);
}

TEST_F(FaultEnvTest, AppendFaultWithPathCountsOnlyMatchingFiles) {
  FaultEnv env;
  ASSERT_TRUE(env.Arm("append:n=2,path=latest").ok());
  EXPECT_EQ(Write(&env, "other", {"1", "2", "3"}), "");
  EXPECT_EQ(Write(&env, "latest", {"a"}), "");
  EXPECT_NE(Write(&env, "latest.tmp", {"b"}), "");
  EXPECT_EQ(env.faults_fired(), 1);
}

TEST_F(FaultEnvTest, FailsRenamesToSuffix) {
  FaultEnv env;
  ASSERT_TRUE(env.Arm("rename:suffix=latest").ok());
  ASSERT_EQ(Write(&env, "latest.tmp", {"x"}), "");
  ASSERT_EQ(Write(&env, "other", {"y"}), "");
  Status s = env.RenameFile(Path("latest.tmp"), Path("latest"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), Path("latest.tmp") + ": rename to " + Path("latest") +
                             " failed: Input/output error (injected fault)");
  EXPECT_TRUE(fs::exists(Path("latest.tmp")));  // nothing moved
  EXPECT_FALSE(fs::exists(Path("latest")));
  EXPECT_FALSE(env.RenameFile(Path("latest.tmp"), Path("latest")).ok());  // every time
  EXPECT_TRUE(env.RenameFile(Path("other"), Path("other2")).ok());
  // The source's suffix does not matter, only the target's.
  EXPECT_TRUE(env.RenameFile(Path("latest.tmp"), Path("moved")).ok());
  EXPECT_EQ(env.faults_fired(), 2);
}

TEST_F(FaultEnvTest, FailsSyncDirOfSuffix) {
  FaultEnv env;
  fs::create_directories(Path("step_1.tmp"));
  ASSERT_TRUE(env.Arm("syncdir:suffix=.tmp").ok());
  Status s = env.SyncDir(Path("step_1.tmp"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), Path("step_1.tmp") + ": fsync directory failed: Input/output error (injected fault)");
  EXPECT_TRUE(env.SyncDir(dir_).ok());
  EXPECT_EQ(env.faults_fired(), 1);
}

TEST_F(FaultEnvTest, SeveralFaultsInOneSpecAndDisarm) {
  FaultEnv env;
  ASSERT_TRUE(env.Arm(" enospc:bytes=0 ; rename:suffix=latest ").ok());
  EXPECT_EQ(env.Armed(), "enospc:bytes=0;rename:suffix=latest");
  ASSERT_TRUE(env.Arm("syncdir:suffix=.tmp").ok());  // other kinds stay armed
  EXPECT_EQ(env.Armed(), "enospc:bytes=0;rename:suffix=latest;syncdir:suffix=.tmp");
  ASSERT_TRUE(env.Arm("enospc:bytes=5").ok());  // the same kind is replaced
  EXPECT_EQ(env.Armed(), "enospc:bytes=5;rename:suffix=latest;syncdir:suffix=.tmp");
  EXPECT_NE(Write(&env, "f", {"123456"}), "");
  const int64_t fired = env.faults_fired();

  env.Disarm();
  EXPECT_EQ(env.Armed(), "");
  EXPECT_EQ(Write(&env, "g", {"123456", "789"}), "");
  EXPECT_EQ(Slurp(Path("g")), "123456789");
  EXPECT_TRUE(env.RenameFile(Path("g"), Path("latest")).ok());
  fs::create_directories(Path("d.tmp"));
  EXPECT_TRUE(env.SyncDir(Path("d.tmp")).ok());
  EXPECT_EQ(env.faults_fired(), fired);  // kept across Disarm

  // Setters with their "off" value disarm one kind.
  env.SetFailRename("latest");
  env.SetFailAppend(1);
  env.SetFailRename("");
  env.SetFailAppend(0);
  env.SetEnospcAfterBytes(-1);
  EXPECT_EQ(env.Armed(), "");
}

TEST_F(FaultEnvTest, BadSpecsAreRejectedNamingTheBadPart) {
  FaultEnv env;
  ASSERT_TRUE(env.Arm("rename:suffix=keep").ok());
  struct Case {
    const char* spec;
    const char* names;
  };
  for (const Case& c : std::vector<Case>{
           {"", "is empty"},
           {"   ", "is empty"},
           {"diskfull:bytes=1", "unknown fault kind \"diskfull\" (expected enospc, append, rename, syncdir or crash)"},
           {"enospc:bytez=1", "unknown key \"bytez\" for enospc (expected bytes, path)"},
           {"enospc:bytes=12x", "enospc bytes=\"12x\" is not a non-negative integer"},
           {"enospc:bytes=-1", "enospc bytes=\"-1\" is not a non-negative integer"},
           {"enospc:path=step_", "enospc needs bytes=BYTES"},
           {"enospc", "enospc needs bytes=BYTES"},
           {"append:n=0", "append n=\"0\" is not a positive integer"},
           {"append:n", "\"n\" in append is not key=value (expected keys: n, path)"},
           {"append:n=1,n=2", "key \"n\" is given twice for append"},
           {"rename:suffix=", "rename suffix is empty"},
           {"rename:to=latest", "unknown key \"to\" for rename (expected suffix)"},
           {"syncdir:", "\"\" in syncdir is not key=value"},
           {"append:n=1;;rename:suffix=x", "has an empty fault (a stray ';')"},
           {"append:n=1;append:n=2", "append is given twice"},
           // All or nothing: the valid first part is not armed either.
           {"append:n=1;bogus", "unknown fault kind \"bogus\""},
       }) {
    Status s = env.Arm(c.spec);
    ASSERT_FALSE(s.ok()) << c.spec;
    const std::string prefix = std::string("fault spec \"") + c.spec + "\": ";
    EXPECT_EQ(s.message().rfind(prefix, 0), 0u) << s.message();
    EXPECT_NE(s.message().find(c.names), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("(hint: "), std::string::npos) << s.message();
  }
  EXPECT_EQ(env.Armed(), "rename:suffix=keep");  // unchanged by the rejected specs
}

TEST_F(FaultEnvTest, ConcurrentWritersShareOneBudget) {
  FaultEnv env;
  env.SetEnospcAfterBytes(1000);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto f = env.NewWritableFile(Path("t" + std::to_string(t)));
      ASSERT_TRUE(f.ok());
      for (int i = 0; i < 100; ++i) ok[t] += (*f)->Append(std::string(10, 'x')).ok();
      (void)(*f)->Close();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok[0] + ok[1] + ok[2] + ok[3], 100);
  EXPECT_EQ(env.bytes_written(), 1000);
  EXPECT_EQ(env.appends(), 400);
  EXPECT_EQ(env.faults_fired(), 300);
  int64_t on_disk = 0;
  for (int t = 0; t < 4; ++t) on_disk += static_cast<int64_t>(fs::file_size(Path("t" + std::to_string(t))));
  EXPECT_EQ(on_disk, 1000);
}

}  // namespace
}  // namespace myriad
