#include "train/supervise/preflight.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "data/loader.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "model/params.h"
#include "train/parallel/mesh.h"
#include "train/trainer.h"

namespace myriad::supervise {

namespace fs = std::filesystem;

namespace {

PreflightItem Pass(const std::string& check, std::string detail) { return {check, true, std::move(detail)}; }
PreflightItem Fail(const std::string& check, std::string detail) { return {check, false, std::move(detail)}; }
PreflightItem Warn(const std::string& check, std::string detail) {
  PreflightItem it{check, true, std::move(detail)};
  it.warn = true;
  return it;
}
PreflightItem Skip(const std::string& check, const std::string& reason) {
  PreflightItem it{check, false, "skipped: " + reason};
  it.skipped = true;
  return it;
}

std::string Errno(int e) { return std::strerror(e); }

// `path` if it exists, else its nearest existing parent ("." for a relative
// path none of whose parents exist).
std::string NearestExisting(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) {
    fs::path parent = p.parent_path();
    if (parent == p) break;
    p = parent;
  }
  return p.empty() ? "." : p.string();
}

std::string Plural(int64_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

}  // namespace

int64_t EstimateCheckpointBytes(const ModelConfig& m) {
  const ParamLayout layout(m);
  const int64_t tensors = static_cast<int64_t>(layout.params().size());
  // Weights + exp_avg + exp_avg_sq in fp32; ~160 bytes of safetensors header
  // per tensor entry (3 per parameter), the expert-bias buffers, and 64 KiB
  // for the manifest and the `latest` file.
  const int64_t biases = 4 * m.n_routed_experts * (m.n_layers + m.mtp_depth);
  return 12 * layout.total() + 3 * 160 * tensors + biases + (64 << 10);
}

bool PreflightReport::ok() const {
  for (const auto& it : items)
    if (!it.ok) return false;
  return true;
}

int PreflightReport::problems() const {
  int n = 0;
  for (const auto& it : items) n += !it.ok && !it.skipped;
  return n;
}

int PreflightReport::skipped() const {
  int n = 0;
  for (const auto& it : items) n += it.skipped;
  return n;
}

const PreflightItem* PreflightReport::Find(const std::string& check) const {
  for (const auto& it : items)
    if (it.check == check) return &it;
  return nullptr;
}

std::string PreflightReport::Format() const {
  size_t width = 0;
  for (const auto& it : items) width = std::max(width, it.check.size());
  std::ostringstream out;
  for (const auto& it : items) {
    const char* mark = it.skipped ? "SKIP" : !it.ok ? "FAIL" : it.warn ? "warn" : "ok";
    out << "  " << mark << std::string(6 - std::strlen(mark), ' ') << it.check
        << std::string(width + 2 - it.check.size(), ' ') << it.detail << "\n";
  }
  const int p = problems(), s = skipped();
  out << Plural(p, "problem");
  if (s > 0) out << ", " << Plural(s, "check") << " skipped";
  out << "\n";
  return out.str();
}

nlohmann::json PreflightReport::ToJson() const {
  nlohmann::json items_json = nlohmann::json::array();
  for (const auto& it : items)
    items_json.push_back(
        {{"check", it.check}, {"ok", it.ok}, {"skipped", it.skipped}, {"warn", it.warn}, {"detail", it.detail}});
  return {{"ok", ok()},
          {"problems", problems()},
          {"skipped", skipped()},
          {"items", std::move(items_json)},
          {"memory", memory.ToJson()},
          {"checkpoint_bytes", checkpoint_bytes}};
}

namespace {

PreflightItem CheckLayout(const PreflightOptions& o, const ModelConfig& mc, const TrainConfig& tc) {
  const ParallelDims& dims = tc.parallel;
  Status st = tc.ValidateLayout(mc, o.ranks);
  if (st.ok()) {
    const BatchPlan bp = PlanBatches(tc, dims, tc.parallel.pipeline_microbatches());
    if (dims.trivial()) return Pass("layout", "single rank, " + std::to_string(bp.per_rank) + " sequences per step");
    return Pass("layout", dims.ToString() + " over " + Plural(o.ranks, "rank") + ", ZeRO-" +
                              std::to_string(tc.parallel.zero) + ", " + std::to_string(bp.per_rank) +
                              " sequences per rank per step");
  }
  std::string detail = st.message();
  // A rank-count mismatch hides the layout's own problems: check those too,
  // against the world size the layout itself asks for.
  if (dims.world() != o.ranks && dims.world() >= 1) {
    Status own = tc.ValidateLayout(mc, dims.world());
    if (!own.ok()) detail += "; also " + own.message();
  }
  return Fail("layout", detail);
}

PreflightItem CheckMemory(const PreflightOptions& o, const MemoryEstimate& e) {
  const int64_t ranks = std::max(1, o.ranks);
  const int64_t here = o.ranks_per_host > 0 ? std::min<int64_t>(o.ranks_per_host, ranks) : ranks;
  const int64_t avail = o.mem_available_bytes >= 0 ? o.mem_available_bytes : MemAvailableBytes();
  if (avail < 0)
    return Warn("memory", e.ToString() + " per rank; MemAvailable unknown (/proc/meminfo unreadable): not compared");
  const Status fits = CheckMemoryFits(e, here, avail);
  if (!fits.ok())
    return Fail("memory", fits.message() + (here > 1 ? "; or put fewer ranks on a host" : ""));
  return Pass("memory", e.ToString() + " per rank; " + FormatBytes(e.total) + " per rank x " + Plural(here, "rank") +
                            (here < ranks ? " on this host" : "") + " = " + FormatBytes(e.HostBytes(here)) + ", " +
                            FormatBytes(avail) + " available");
}

void CheckData(const ModelConfig& mc, const TrainConfig& tc, std::vector<PreflightItem>* items) {
  const std::string& dir = tc.data_dir;
  const int T = static_cast<int>(tc.seq_len);
  auto train = DataLoader::Open(dir, "train", T, tc.seed);
  if (!train.ok()) {
    items->push_back(Fail("data.train", "data.dir=" + dir + ": " + train.status().message()));
  } else if (static_cast<int64_t>(train.value()->vocab_size()) > mc.vocab_size) {
    items->push_back(Fail("data.train", dir + ": tokenizer has " + std::to_string(train.value()->vocab_size()) +
                                            " tokens but model.vocab_size=" + std::to_string(mc.vocab_size) +
                                            " (hint: set model.vocab_size >= the tokenizer's size)"));
  } else {
    const auto& l = *train.value();
    items->push_back(Pass("data.train", dir + ": " + std::to_string(l.num_tokens()) + " tokens in " +
                                            Plural(static_cast<int64_t>(l.num_shards()), "shard") + ", " +
                                            std::to_string(l.num_rows()) + " rows of seq_len " +
                                            std::to_string(T) + ", vocab " + std::to_string(l.vocab_size())));
  }
  auto val = DataLoader::Open(dir, "val", T, tc.seed);
  if (!val.ok())
    items->push_back(Warn("data.val", "no validation split (" + val.status().message() +
                                          "); the run trains without evaluation"));
  else
    items->push_back(Pass("data.val", dir + ": " + std::to_string(val.value()->num_tokens()) + " tokens"));

  const std::string tok = PreparedTokenizerPath(dir);
  struct stat sb;
  if (::stat(tok.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) {  // an open model's folder (prepare --tokenizer)
    auto t = Tokenizer::Load(tok);
    items->push_back(t.ok() ? Pass("data.tokenizer", tok + " (vocab " + std::to_string(t->vocab_size()) + ")")
                            : Fail("data.tokenizer", t.status().message()));
  } else if (::stat(tok.c_str(), &sb) != 0) {
    const int e = errno;
    items->push_back(Fail("data.tokenizer", tok + ": " + Errno(e) +
                                                " (hint: `myriad prepare --out " + dir +
                                                "` writes the tokenizer beside the shards)"));
  } else if (!S_ISREG(sb.st_mode)) {
    items->push_back(Fail("data.tokenizer", tok + ": not a regular file"));
  } else if (sb.st_size == 0) {
    items->push_back(Fail("data.tokenizer", tok + ": empty file (hint: run `myriad prepare` again)"));
  } else {
    const int fd = ::open(tok.c_str(), O_RDONLY | O_CLOEXEC);
    char c;
    if (fd < 0 || ::read(fd, &c, 1) != 1) {
      const int e = errno;
      items->push_back(Fail("data.tokenizer", tok + ": cannot read: " + Errno(e) + " (hint: check its permissions)"));
    } else {
      items->push_back(Pass("data.tokenizer", tok + " (" + FormatBytes(sb.st_size) + ")"));
    }
    if (fd >= 0) ::close(fd);
  }
}

// Creates `dir`, writes and deletes a probe file there.
PreflightItem CheckWritable(const std::string& dir) {
  const std::string key = "train.out_dir=" + dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return Fail("checkpoint.write", key + ": cannot create the folder: " + ec.message() +
                                        " (hint: choose a writable train.out_dir, e.g. under runs/)");
  if (!fs::is_directory(dir, ec))
    return Fail("checkpoint.write", key + ": exists and is not a folder (hint: choose another train.out_dir)");
  const std::string probe = dir + "/.preflight_probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    return Fail("checkpoint.write", key + ": cannot write " + probe + ": " + Errno(e) +
                                        " (hint: check the folder's permissions and that its disk is mounted "
                                        "read-write)");
  }
  static const char kProbe[] = "myriad preflight probe\n";
  bool wrote = ::write(fd, kProbe, sizeof(kProbe) - 1) == static_cast<ssize_t>(sizeof(kProbe) - 1);
  int e = wrote ? 0 : errno;
  if (wrote && ::fsync(fd) != 0) { wrote = false; e = errno; }
  ::close(fd);
  if (::unlink(probe.c_str()) != 0 && wrote) {
    const int ue = errno;
    return Fail("checkpoint.write", key + ": cannot delete the probe file " + probe + ": " + Errno(ue) +
                                        " (hint: the checkpointer replaces and deletes files there)");
  }
  if (!wrote) return Fail("checkpoint.write", key + ": writing " + probe + " failed: " + Errno(e));
  std::string detail = dir + " is writable";
  std::error_code ec2;
  if (fs::exists(dir + "/latest", ec2)) detail += " (it holds a checkpoint: `myriad train` will resume from it)";
  return Pass("checkpoint.write", detail);
}

PreflightItem CheckSpace(const PreflightOptions& o, const TrainConfig& tc, int64_t ckpt) {
  const std::string at = NearestExisting(tc.out_dir);
  int64_t avail = o.disk_free_bytes;
  if (avail < 0) {
    struct statvfs sv;
    if (::statvfs(at.c_str(), &sv) != 0) {
      const int e = errno;
      return Fail("checkpoint.space", "train.out_dir=" + tc.out_dir + ": statvfs of " + at + " failed: " + Errno(e));
    }
    avail = static_cast<int64_t>(sv.f_bavail) * static_cast<int64_t>(sv.f_frsize);
  }
  const int64_t need = ckpt > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max() : 2 * ckpt;
  const std::string nums = "2 checkpoints x " + FormatBytes(ckpt) + " = " + FormatBytes(need) + ", " +
                           FormatBytes(avail) + " free at " + at;
  if (need > avail)
    return Fail("checkpoint.space", "train.out_dir=" + tc.out_dir + ": needs " + nums +
                                        " (hint: free disk space or point train.out_dir at a larger disk)");
  std::string detail = nums;
  if (tc.keep_last > 2)
    detail += " (train.keep_last=" + std::to_string(tc.keep_last) + " keeps up to " +
              FormatBytes(tc.keep_last * ckpt) + ")";
  return Pass("checkpoint.space", detail);
}

// The executable `name` on PATH (or `name` itself when it holds a '/'); "" if none.
std::string FindOnPath(const std::string& name, int* searched) {
  auto executable = [](const std::string& p) {
    struct stat sb;
    return ::stat(p.c_str(), &sb) == 0 && S_ISREG(sb.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  *searched = 0;
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t pos = 0;
  while (true) {
    const size_t colon = dirs.find(':', pos);
    std::string dir = dirs.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (dir.empty()) dir = ".";
    ++*searched;
    const std::string cand = dir + "/" + name;
    if (executable(cand)) return cand;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return "";
}

PreflightItem CheckLauncher(const PreflightOptions& o) {
  if (o.ranks <= 1) return Pass("launcher", "not needed (" + Plural(std::max(o.ranks, 1), "rank") + ")");
  int searched = 0;
  const std::string found = FindOnPath(o.launcher, &searched);
  if (!found.empty()) return Pass("launcher", o.launcher + " is " + found);
  if (o.launcher.find('/') != std::string::npos)
    return Fail("launcher", "launcher " + o.launcher + " is not an executable file (hint: check the path)");
  return Fail("launcher", "launcher \"" + o.launcher + "\" not found on PATH (" + Plural(searched, "folder") +
                              " searched) for " + Plural(o.ranks, "rank") +
                              " (hint: install OpenMPI, e.g. apt-get install openmpi-bin, or name the "
                              "launcher's path)");
}

}  // namespace

PreflightReport RunPreflight(const PreflightOptions& o) {
  PreflightReport r;
  ModelConfig mc;
  TrainConfig tc;
  const Status cfg = LoadRunConfig(o.config_path, o.overrides, &mc, &tc);
  if (cfg.ok()) {
    r.items.push_back(Pass("config", o.config_path + ": " + std::to_string(ParamLayout(mc).total()) +
                                         " parameters; seq_len " + std::to_string(tc.seq_len) + ", batch_size " +
                                         std::to_string(tc.batch_size) + " x grad_accum " +
                                         std::to_string(tc.grad_accum) + ", " + std::to_string(tc.steps) +
                                         " steps"));
  } else {
    r.items.push_back(Fail("config", cfg.message()));
  }
  const std::string no_config = "the config did not load (see config)";

  if (cfg.ok()) {
    r.items.push_back(CheckLayout(o, mc, tc));
    r.memory = EstimateRankMemory(mc, tc, o.ranks);
    r.items.push_back(CheckMemory(o, r.memory));
    CheckData(mc, tc, &r.items);
    r.checkpoint_bytes = EstimateCheckpointBytes(mc);
    const PreflightItem write = CheckWritable(tc.out_dir);
    r.items.push_back(write);
    r.items.push_back(CheckSpace(o, tc, r.checkpoint_bytes));
  } else {
    for (const char* c : {"layout", "memory", "data.train", "data.val", "data.tokenizer", "checkpoint.write",
                          "checkpoint.space"})
      r.items.push_back(Skip(c, no_config));
  }
  r.items.push_back(CheckLauncher(o));
  return r;
}

}  // namespace myriad::supervise
