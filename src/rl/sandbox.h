// Runs untrusted Python (/usr/bin/python3 -I -S) in a subprocess with bounded
// time, memory, output, files and processes. See docs/rl-rewards.md for what
// isolation applies and the threat model. Thread-safe: each call has its own
// scratch directory and pipes (all O_CLOEXEC).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"

namespace myriad::rl {

struct SandboxOptions {
  double timeout_s = 2.0;                  // wall clock; the group is SIGKILLed after it
  size_t memory_bytes = 512ull << 20;      // RLIMIT_AS
  size_t max_file_bytes = 16ull << 20;     // RLIMIT_FSIZE
  int max_processes = 16;                  // RLIMIT_NPROC (enforced for the dropped uid)
  size_t output_limit = 64 << 10;          // per stream; the rest is read and discarded
};

struct SandboxResult {
  int exit_code = -1;      // the program's exit status, 128+signal if killed
  bool timed_out = false;
  std::string stdout_text, stderr_text;
  std::string results_text;  // what the program wrote to fd 3
  size_t stdout_bytes = 0, stderr_bytes = 0;  // before truncation
  std::string isolation;   // e.g. "netns,mntns,pidns,ro-fs,uid,rlimits"
};

// Writes `files` (name, content) into a fresh scratch directory, runs
// `python3 -I -S main_file` there, and writes `fd4_input` to the program's fd 4
// (then closes it). fd 3 is a pipe only this process reads.
Result<SandboxResult> RunPythonSandboxed(
    const std::vector<std::pair<std::string, std::string>>& files, const std::string& main_file,
    const std::string& fd4_input, const SandboxOptions& options);

struct PythonTestOutcome {
  int passed = 0, total = 0;
  bool timed_out = false;
  std::string reason;  // "ok", "timeout", "import error", "exited early", ...
};

// Imports `source` as a module, checks `entry` is defined, runs each test in
// the module's namespace, and reports per-test results on fd 3 tagged with a
// random per-run nonce that exists in the process only after the import.
PythonTestOutcome RunPythonTests(const std::string& source, const std::string& entry,
                                 const std::vector<std::string>& tests, double timeout_s);

}  // namespace myriad::rl
