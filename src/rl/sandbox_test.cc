#include "rl/sandbox.h"

#include <gtest/gtest.h>

namespace myriad::rl {
namespace {

const std::vector<std::string> kAddTests = {"assert add(1, 2) == 3", "assert add(-1, 1) == 0",
                                            "assert add(10, 5) == 15"};

TEST(Sandbox, CorrectSolutionPassesAll) {
  auto o = RunPythonTests("def add(a, b):\n    return a + b\n", "add", kAddTests, 2);
  EXPECT_EQ(o.passed, 3) << o.reason;
  EXPECT_EQ(o.reason, "ok");
}

TEST(Sandbox, WrongSolutionPassesSome) {
  auto o = RunPythonTests("def add(a, b):\n    return 3\n", "add", kAddTests, 2);
  EXPECT_EQ(o.passed, 1);
}

TEST(Sandbox, PrintingPassDoesNotCount) {
  auto o = RunPythonTests("import os\nfor i in range(3):\n    print('PASS', i)\n    os.write(3, b'x 0 PASS\\n')\n"
                          "def add(a, b):\n    return -7\n", "add", kAddTests, 2);
  EXPECT_EQ(o.passed, 0);
}

TEST(Sandbox, ExitBeforeTestsScoresZero) {
  EXPECT_EQ(RunPythonTests("import sys\nsys.exit(0)\n", "add", kAddTests, 2).passed, 0);
  auto o = RunPythonTests("import os\ndef add(a,b): return a+b\nos._exit(0)\n", "add", kAddTests, 2);
  EXPECT_EQ(o.passed, 0);
  EXPECT_EQ(o.reason, "exited early");
}

TEST(Sandbox, MonkeypatchingWriteOrAssertionErrorDoesNotHelp) {
  auto o = RunPythonTests(
      "import os, builtins\n_w = os.write\nos.write = lambda fd, b: _w(fd, b.replace(b'FAIL', b'PASS'))\n"
      "builtins.AssertionError = type('X', (Exception,), {})\n"
      "def add(a, b):\n    try:\n        return -7\n    except BaseException:\n        pass\n",
      "add", kAddTests, 2);
  EXPECT_EQ(o.passed, 0);
}

TEST(Sandbox, InfiniteLoopTimesOut) {
  auto o = RunPythonTests("def add(a, b):\n    while True: pass\n", "add", kAddTests, 1);
  EXPECT_TRUE(o.timed_out);
  EXPECT_EQ(o.passed, 0);
  EXPECT_EQ(o.reason, "timeout");
}

TEST(Sandbox, HugeOutputIsTruncated) {
  SandboxOptions opt;
  opt.timeout_s = 10;
  auto r = RunPythonSandboxed({{"m.py", "import sys\nsys.stdout.write('x' * (100 << 20))\n"}}, "m.py", "", opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->stdout_text.size(), opt.output_limit);
  EXPECT_EQ(r->stdout_bytes, size_t{100} << 20);
}

TEST(Sandbox, ForkBombIsContained) {
  auto o = RunPythonTests("import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
                          "        except OSError:\n            pass\n", "add", kAddTests, 1);
  EXPECT_EQ(o.passed, 0);
}

TEST(Sandbox, WritesOutsideScratchFail) {
  SandboxOptions opt;
  auto r = RunPythonSandboxed({{"m.py",
      "import os\nfor p in ['/tmp/myriad_escape_test', '../myriad_escape_test']:\n"
      "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n    except OSError as e:\n        print('refused', p)\n"
      "open('inside.txt', 'w').write('ok'); print('inside ok')\n"}}, "m.py", "", opt);
  ASSERT_TRUE(r.ok());
  if (r->isolation.find("ro-fs") != std::string::npos) {
    EXPECT_NE(r->stdout_text.find("refused /tmp/myriad_escape_test"), std::string::npos) << r->stdout_text;
    EXPECT_NE(r->stdout_text.find("refused ../myriad_escape_test"), std::string::npos) << r->stdout_text;
  }
  EXPECT_NE(r->stdout_text.find("inside ok"), std::string::npos) << r->stdout_text << r->stderr_text;
}

TEST(Sandbox, NoNetworkUnderNetns) {
  auto r = RunPythonSandboxed({{"m.py",
      "import socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', 80)); print('connected')\n"
      "except OSError as e:\n    print('refused', e.errno)\n"}}, "m.py", "", SandboxOptions{});
  ASSERT_TRUE(r.ok());
  if (r->isolation.find("netns") != std::string::npos) {
    EXPECT_NE(r->stdout_text.find("refused"), std::string::npos) << r->stdout_text << r->stderr_text;
  }
}

}  // namespace
}  // namespace myriad::rl
