#include "rl/sandbox.h"

#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/strings.h"

namespace myriad::rl {
namespace {

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;
}

std::vector<std::string> MountPoints() {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string id, parent, dev, root, mp;
    ss >> id >> parent >> dev >> root >> mp;
    if (!mp.empty()) out.push_back(mp);
  }
  return out;
}

void WriteAll(int fd, const char* s) { ssize_t r = ::write(fd, s, std::strlen(s)); (void)r; }

void ReadInto(int fd, std::string& buf, size_t& total, size_t limit, bool& open) {
  char tmp[65536];
  ssize_t n = ::read(fd, tmp, sizeof tmp);
  if (n <= 0) { if (n == 0 || (errno != EAGAIN && errno != EINTR)) open = false; return; }
  total += n;
  if (buf.size() < limit) buf.append(tmp, std::min<size_t>(n, limit - buf.size()));
}

std::atomic<uint32_t> g_counter{0};

}  // namespace

Result<SandboxResult> RunPythonSandboxed(
    const std::vector<std::pair<std::string, std::string>>& files, const std::string& main_file,
    const std::string& fd4_input, const SandboxOptions& opt) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/myriad-sandbox-XXXXXX";
  std::vector<char> tbuf(tmpl.begin(), tmpl.end());
  tbuf.push_back('\0');
  if (!::mkdtemp(tbuf.data())) return Status::Error("[sandbox] mkdtemp failed: " + std::string(strerror(errno)));
  const std::string scratch(tbuf.data());
  struct Cleanup { std::string d; ~Cleanup() { ::nftw(d.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS); } } cleanup{scratch};

  const bool root = ::geteuid() == 0;
  // A fresh unprivileged uid per run, so RLIMIT_NPROC is enforced and counts only this run.
  const uid_t uid = 0x50000 + ((::getpid() * 7919u + g_counter++) % 0x10000);
  for (const auto& [name, content] : files) {
    std::ofstream f(scratch + "/" + name, std::ios::binary);
    f << content;
    if (!f) return Status::Error("[sandbox] cannot write " + scratch + "/" + name);
  }
  if (root && ::chown(scratch.c_str(), uid, uid) != 0)
    return Status::Error("[sandbox] chown failed: " + std::string(strerror(errno)));
  const std::vector<std::string> mounts = MountPoints();

  int out[2], err[2], res[2], in4[2], st[2];
  if (::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC) || ::pipe2(res, O_CLOEXEC) ||
      ::pipe2(in4, O_CLOEXEC) || ::pipe2(st, O_CLOEXEC))
    return Status::Error("[sandbox] pipe failed");
  const std::string py_main = main_file;
  const char* argv[] = {"python3", "-I", "-S", py_main.c_str(), nullptr};
  const char* envp[] = {"PATH=/usr/bin:/bin", nullptr};
  const rlim_t cpu = static_cast<rlim_t>(std::ceil(opt.timeout_s)) + 1;

  pid_t pid = ::fork();
  if (pid < 0) return Status::Error("[sandbox] fork failed");
  if (pid == 0) {
    // Intermediate: its own process group, then new namespaces for its child.
    ::setpgid(0, 0);
    const char* ns = "ns=none\n";
    if (root && ::unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID) == 0) ns = "ns=net,mnt,pid\n";
    else if (root && ::unshare(CLONE_NEWNET | CLONE_NEWNS) == 0) ns = "ns=net,mnt\n";
    WriteAll(st[1], ns);
    const bool mntns = std::strstr(ns, "mnt") != nullptr, pidns = std::strstr(ns, "pid") != nullptr;
    pid_t g = ::fork();
    if (g == 0) {
      if (mntns) {
        bool ok = ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
                  ::mount(scratch.c_str(), scratch.c_str(), nullptr, MS_BIND, nullptr) == 0;
        if (ok && pidns) ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
        bool all_ro = ok;
        for (const auto& mp : mounts) {
          if (mp == scratch || mp == "/proc") continue;
          if (::mount(nullptr, mp.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0 && mp == "/")
            all_ro = false;
        }
        if (all_ro) WriteAll(st[1], "ro-fs\n");
      }
      if (::chdir(scratch.c_str()) != 0) _exit(125);
      struct rlimit r;
      r = {cpu, cpu}; ::setrlimit(RLIMIT_CPU, &r);
      r = {opt.memory_bytes, opt.memory_bytes}; ::setrlimit(RLIMIT_AS, &r);
      r = {opt.max_file_bytes, opt.max_file_bytes}; ::setrlimit(RLIMIT_FSIZE, &r);
      r = {(rlim_t)opt.max_processes, (rlim_t)opt.max_processes}; ::setrlimit(RLIMIT_NPROC, &r);
      r = {0, 0}; ::setrlimit(RLIMIT_CORE, &r);
      r = {64, 64}; ::setrlimit(RLIMIT_NOFILE, &r);
      if (root) {
        if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) _exit(125);
        WriteAll(st[1], "uid\n");
      }
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0); ::dup2(out[1], 1); ::dup2(err[1], 2); ::dup2(res[1], 3); ::dup2(in4[0], 4);
      ::execve("/usr/bin/python3", const_cast<char* const*>(argv), const_cast<char* const*>(envp));
      WriteAll(st[1], "exec-failed\n");
      _exit(126);
    }
    ::close(out[1]); ::close(err[1]); ::close(res[1]); ::close(in4[0]); ::close(st[1]);
    if (g < 0) _exit(127);
    int status = 0;
    while (::waitpid(g, &status, 0) < 0 && errno == EINTR) {}
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  ::close(out[1]); ::close(err[1]); ::close(res[1]); ::close(in4[0]); ::close(st[1]);
  { ssize_t w = ::write(in4[1], fd4_input.data(), fd4_input.size()); (void)w; }
  ::close(in4[1]);

  SandboxResult r;
  std::string status_text, results;
  size_t res_total = 0, st_total = 0;
  bool open_out = true, open_err = true, open_res = true, open_st = true, exited = false;
  int wstatus = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opt.timeout_s);
  while (true) {
    if (!exited) {
      siginfo_t si{};
      if (::waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid) {
        exited = true;
        ::kill(-pid, SIGKILL);  // stragglers in the group (the leader is a zombie: no reuse)
      }
    }
    if (exited && !open_out && !open_err && !open_res) break;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      if (!exited) r.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      break;
    }
    struct pollfd fds[4] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {res[0], POLLIN, 0}, {st[0], POLLIN, 0}};
    bool open[4] = {open_out, open_err, open_res, open_st};
    for (int i = 0; i < 4; ++i) if (!open[i]) fds[i].fd = -1;
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count());
    ::poll(fds, 4, std::min(ms + 1, 20));
    if (fds[0].revents) ReadInto(out[0], r.stdout_text, r.stdout_bytes, opt.output_limit, open_out);
    if (fds[1].revents) ReadInto(err[0], r.stderr_text, r.stderr_bytes, opt.output_limit, open_err);
    if (fds[2].revents) ReadInto(res[0], results, res_total, opt.output_limit, open_res);
    if (fds[3].revents) ReadInto(st[0], status_text, st_total, 4096, open_st);
  }
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {}
  // What is left in the pipes after the processes are gone.
  for (int fd : {out[0], err[0], res[0], st[0]}) ::fcntl(fd, F_SETFL, O_NONBLOCK);
  for (bool o = true; o;) ReadInto(res[0], results, res_total, opt.output_limit, o);
  for (bool o = true; o;) ReadInto(st[0], status_text, st_total, 4096, o);
  for (int fd : {out[0], err[0], res[0], st[0]}) ::close(fd);
  r.exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  r.results_text = std::move(results);
  std::string iso;
  if (status_text.find("ns=net,mnt,pid") != std::string::npos) iso = "netns,mntns,pidns";
  else if (status_text.find("ns=net,mnt") != std::string::npos) iso = "netns,mntns";
  if (status_text.find("ro-fs") != std::string::npos) iso += ",ro-fs";
  if (status_text.find("uid") != std::string::npos) iso += ",uid";
  iso += iso.empty() ? "rlimits,pgroup" : ",rlimits,pgroup";
  r.isolation = iso;
  if (status_text.find("exec-failed") != std::string::npos)
    return Status::Error("[sandbox] exec /usr/bin/python3 failed");
  return r;
}

namespace {

std::string PyQuote(const std::string& s) {
  std::string o = "'";
  for (unsigned char c : s) {
    char b[8];
    if (c == '\\' || c == '\'') { o += '\\'; o += c; }
    else if (c < 32 || c >= 127) { std::snprintf(b, sizeof b, "\\x%02x", c); o += b; }
    else o += c;
  }
  return o + "'";
}

// Every name the harness needs is bound before the user module runs, so
// monkeypatching os/builtins afterwards does not change what it writes.
constexpr const char* kHarness = R"PY(
def _main(TESTS, ENTRY):
    import os, importlib.util
    _write, _read, _close = os.write, os.read, os.close
    _BaseException, _exec, _compile, _len, _str, _callable = BaseException, exec, compile, len, str, callable
    _enumerate, _vars, _dict = enumerate, vars, dict
    spec = importlib.util.spec_from_file_location("solution", "solution.py")
    mod = importlib.util.module_from_spec(spec)
    err = None
    try:
        spec.loader.exec_module(mod)
    except _BaseException as e:
        err = "import"
    nonce = _read(4, 64).decode().strip()
    _close(4)
    if err is None and not _callable(_vars(mod).get(ENTRY)):
        err = "entry"
    if err is not None:
        _write(3, (nonce + " ERROR " + err + "\n").encode())
        return
    g = _dict(_vars(mod))
    for i, t in _enumerate(TESTS):
        ok = True
        try:
            _exec(_compile(t, "<test>", "exec"), g)
        except _BaseException:
            ok = False
        _write(3, (nonce + " " + _str(i) + (" PASS\n" if ok else " FAIL\n")).encode())
    _write(3, (nonce + " DONE\n").encode())
)PY";

}  // namespace

PythonTestOutcome RunPythonTests(const std::string& source, const std::string& entry,
                                 const std::vector<std::string>& tests, double timeout_s) {
  PythonTestOutcome o;
  o.total = static_cast<int>(tests.size());
  unsigned char raw[16];
  if (::getrandom(raw, sizeof raw, 0) != sizeof raw) { o.reason = "sandbox: no randomness"; return o; }
  std::string nonce;
  for (unsigned char c : raw) nonce += StrFormat("%02x", c);
  std::string tests_py = "[";
  for (const auto& t : tests) tests_py += PyQuote(t) + ",";
  tests_py += "]";
  std::string main_py = std::string(kHarness) + "_main(" + tests_py + ", " + PyQuote(entry) + ")\n";
  SandboxOptions opt;
  opt.timeout_s = timeout_s;
  auto r = RunPythonSandboxed({{"main.py", main_py}, {"solution.py", source}}, "main.py", nonce + "\n", opt);
  if (!r.ok()) { o.reason = r.status().message(); return o; }
  o.timed_out = r->timed_out;
  std::vector<int> seen(tests.size(), 0);
  bool done = false, tampered = false;
  std::string error;
  std::istringstream lines(r->results_text);
  std::string line;
  size_t next = 0;
  while (std::getline(lines, line)) {
    if (line.compare(0, nonce.size() + 1, nonce + " ") != 0) continue;  // not the harness's
    std::string rest = line.substr(nonce.size() + 1);
    if (rest == "DONE") { done = true; continue; }
    if (rest.rfind("ERROR ", 0) == 0) { error = rest.substr(6); continue; }
    size_t sp = rest.find(' ');
    size_t idx = std::strtoul(rest.substr(0, sp).c_str(), nullptr, 10);
    // Lines come in order, once each; anything else means the nonce leaked.
    if (idx != next || idx >= tests.size() || sp == std::string::npos) { tampered = true; break; }
    ++next;
    seen[idx] = rest.substr(sp + 1) == "PASS";
  }
  if (tampered) { o.passed = 0; o.reason = "tampered results"; return o; }
  for (int s : seen) o.passed += s;
  if (!error.empty()) o.reason = error == "entry" ? "entry '" + entry + "' not defined" : "import error";
  else if (o.timed_out) o.reason = "timeout";
  else if (!done) o.reason = "exited early";
  else o.reason = "ok";
  if (!done) o.passed = std::min(o.passed, static_cast<int>(next));
  return o;
}

}  // namespace myriad::rl
