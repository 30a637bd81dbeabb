// Fuzz over config values (issue 15): random types and magnitudes for every
// key of [model], [train] and [parallel] on the tiny config, given as --set
// overrides or written into the TOML file. The only acceptable outcomes:
//   - a one-line error that names a key the case changed (LoadRunConfig, the
//     layout check for one rank, or the memory check `myriad train` makes:
//     CheckRunMemory), or
//   - a config that validates and whose memory estimate fits this machine;
//     for a few of those (small enough to train a step in a second or two)
//     `myriad train` itself runs one step in a subprocess, and must finish,
//     or stop with one line naming a key (e.g. a vocabulary below the
//     tokenizer's).
// Never a signal, an abort, a hang, or an allocation past the machine's
// memory (the in-process part allocates nothing a config asks for: a crash
// there fails the test binary). Deterministic: seed 15, or MYRIAD_FUZZ_SEED;
// every failure prints the seed, the case number and the values
// (MYRIAD_FUZZ_VERBOSE=1 prints every case's outcome).
//
// Not fuzzed: the path keys (train.out_dir, train.metrics_file,
// train.snapshot_dir, data.dir): a random path would write outside the
// test's folder. They point into it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <toml++/toml.h>

#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data/test_util.h"
#include "model/flops.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

const char* const kKeys[] = {
    "model.vocab_size", "model.d_model", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.d_ff",
    "model.n_dense_layers", "model.n_routed_experts", "model.n_shared_experts", "model.top_k", "model.d_expert",
    "model.score_func", "model.aux_loss_weight", "model.bias_update_rate", "model.mtp_depth",
    "model.mtp_loss_weight", "model.tie_embeddings", "model.rope_theta", "model.norm_eps", "model.max_seq_len",
    "model.init_std", "model.attention", "model.dsa_topk", "model.dsa_index_heads", "model.dsa_index_dim",
    "model.dsa_index_share", "model.dsa_warmup_steps", "model.dsa_index_precision", "model.dsa_index_rope_dim",
    "train.seq_len", "train.batch_size", "train.grad_accum", "train.steps", "train.lr", "train.min_lr",
    "train.warmup_steps", "train.weight_decay", "train.beta1", "train.beta2", "train.adam_eps", "train.grad_clip",
    "train.seed", "train.log_every", "train.eval_every", "train.eval_batches", "train.ckpt_every",
    "train.keep_last", "train.threads", "train.precision", "train.async_checkpoint", "train.health_check",
    "train.loss_spike_factor", "parallel.dp", "parallel.tp", "parallel.pp", "parallel.ep", "parallel.cp",
    "parallel.zero", "parallel.microbatches", "parallel.pp_layers", "parallel.ranks_per_node",
    "parallel.hierarchical", "parallel.compression",
};

// A random value as TOML text: every type TOML has, magnitudes from 0 to
// beyond 64 bits. `set` (a --set override) leaves out what --set refuses
// (arrays, tables, dates) and may give digits TOML cannot hold (they arrive
// as a string); a file gets only valid TOML.
std::string RandomValue(std::mt19937_64& rng, bool set) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  for (;;) {
    switch (pick(14)) {
      case 0: return std::to_string(pick(20) - 3);                    // small, some negative
      case 1: return std::to_string(pick(4097));                      // plausible sizes
      case 2: {                                                       // powers of two, +-1, either sign
        const int k = pick(63);
        int64_t v = (int64_t{1} << k) + (pick(3) - 1);
        return std::to_string(pick(4) == 0 ? -v : v);
      }
      case 3: {
        static const char* kEdges[] = {"9223372036854775807", "-9223372036854775808", "4294967297", "2147483648",
                                       "2147483647", "1000000000000", "100000", "65536", "0"};
        return kEdges[pick(9)];
      }
      case 4:
        if (!set) continue;
        return pick(2) ? "99999999999999999999" : "-123456789012345678901234";  // past int64
      case 5: {  // floats of any magnitude
        char buf[64];
        const double mant = std::uniform_real_distribution<double>(1, 10)(rng);
        std::snprintf(buf, sizeof buf, "%s%.3fe%d", pick(4) == 0 ? "-" : "", mant, pick(601) - 300);
        return buf;
      }
      case 6: {
        static const char* kSpecial[] = {"inf", "-inf", "+inf", "nan", "-nan", "0.0", "-0.0", "1e12", "2.5", "1e-9"};
        return kSpecial[pick(10)];
      }
      case 7: {
        static const char* kStrings[] = {"\"\"", "\"abc\"", "\"dsa\"", "\"dense\"", "\"sigmoid\"", "\"softmax\"",
                                         "\"1e3\"", "\"99\"", "\"true\"", "\"fp32\"", "\"int8\"", "\"bf16\"",
                                         "\"auto\"", "\"none\"", "\"3,2\"", "\"\\u00e9t\\u00e9\""};
        return kStrings[pick(16)];
      }
      case 8: return pick(2) ? "true" : "false";
      case 9:
        if (set) continue;
        return pick(2) ? "[1, 2]" : "[]";
      case 10:
        if (set) continue;
        return pick(2) ? "{ a = 1 }" : "[\"x\", \"y\"]";
      case 11:
        if (set) continue;
        return pick(2) ? "1979-05-27" : "07:32:00";
      case 12: return set ? "not-toml" : "\"not a number\"";  // --set: a bare string
      default: return std::to_string(1 + pick(8));              // small positive counts
    }
  }
}

// Half the values are of the key's own type (so that magnitudes, not only
// types, reach the checks), half of any type.
enum class Type { kInt, kFloat, kString, kBool };
Type TypeOf(const std::string& key) {
  static const char* kFloats[] = {"aux_loss_weight", "bias_update_rate", "mtp_loss_weight", "rope_theta", "norm_eps",
                                  "init_std", "lr", "min_lr", "weight_decay", "beta1", "beta2", "adam_eps",
                                  "grad_clip", "loss_spike_factor"};
  static const char* kStrings[] = {"score_func", "attention", "dsa_index_precision", "precision", "pp_layers",
                                   "compression"};
  static const char* kBools[] = {"tie_embeddings", "async_checkpoint", "health_check", "hierarchical"};
  const std::string leaf = key.substr(key.find('.') + 1);
  for (const char* f : kFloats) if (leaf == f) return Type::kFloat;
  for (const char* f : kStrings) if (leaf == f) return Type::kString;
  for (const char* f : kBools) if (leaf == f) return Type::kBool;
  return Type::kInt;
}

std::string TypedValue(std::mt19937_64& rng, Type t, bool set) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  switch (t) {
    case Type::kInt: {
      const int k = pick(64);  // magnitude 2^0 .. 2^63, mostly positive
      const uint64_t mag = k == 63 ? uint64_t{1} << 63 : (uint64_t{1} << k) + rng() % ((uint64_t{1} << k) + 1);
      if (pick(5) == 0) return "-" + std::to_string(mag);
      if (mag > static_cast<uint64_t>(INT64_MAX)) return set ? std::to_string(mag) : "9223372036854775807";
      return std::to_string(mag);
    }
    case Type::kFloat: {
      static const char* kFloats[] = {"0.0", "1e-8", "0.5", "0.9", "0.999", "1.0", "3e-4", "2", "10000", "1e300",
                                      "-1e-3", "inf", "nan", "-inf", "1e-320"};
      return kFloats[pick(15)];
    }
    case Type::kString: {
      static const char* kWords[] = {"\"softmax\"", "\"sigmoid\"", "\"dense\"", "\"dsa\"", "\"fp32\"",
                                     "\"int8\"", "\"bf16\"", "\"auto\"", "\"none\"", "\"1,1\"", "\"2\"",
                                     "\"\"", "\"x\""};
      return kWords[pick(13)];
    }
    case Type::kBool: return pick(2) ? "true" : "false";
  }
  return "0";
}

struct Case {
  bool in_file = false;             // the values are in the file (else --set overrides)
  std::vector<std::string> keys;    // the keys it changed
  std::vector<std::string> values;  // "key=value" for each
  std::string file;                 // the config file
  std::vector<std::string> Overrides() const { return in_file ? std::vector<std::string>{} : values; }
  std::string Describe() const {
    std::string s = in_file ? " in the file:" : "";
    for (const auto& v : values) s += (in_file ? " " : " --set ") + v;
    return s;
  }
};

// Inserts `key = value` (TOML text) into `root`, creating its table.
void Assign(toml::table& root, const std::string& key, const std::string& value) {
  const size_t dot = key.find('.');
  toml::table parsed = toml::parse("v = " + value);
  auto* t = root.get(key.substr(0, dot));
  if (!t) {
    root.insert(key.substr(0, dot), toml::table{});
    t = root.get(key.substr(0, dot));
  }
  parsed.get("v")->visit([&](auto&& n) { t->as_table()->insert_or_assign(key.substr(dot + 1), n); });
}

class ConfigFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* src = std::getenv("MYRIAD_SOURCE_DIR");
    const char* bin = std::getenv("MYRIAD_BIN");
    ASSERT_TRUE(src && bin) << "MYRIAD_SOURCE_DIR and MYRIAD_BIN must be set (ctest sets them)";
    src_ = src;
    bin_ = bin;
    if (const char* s = std::getenv("MYRIAD_FUZZ_SEED")) seed_ = std::strtoull(s, nullptr, 10);
    tmp_ = std::make_unique<TempDir>("config_fuzz");
    std::ifstream in(src_ + "/configs/tiny.toml");
    std::stringstream ss;
    ss << in.rdbuf();
    base_ = ss.str();
    ASSERT_FALSE(base_.empty());
  }

  // The tiny corpus prepared with the real binary (as tests/e2e/lib.sh does).
  void PrepareData() {
    const std::string corpus = tmp_->path() + "/corpus";
    fs::create_directories(corpus);
    for (const auto& f : fs::directory_iterator(src_ + "/tests/data/tiny_corpus"))
      fs::copy_file(f.path(), corpus + "/" + f.path().filename().string());
    data_ = tmp_->path() + "/data";
    int rc = Run({"prepare", "--input", corpus, "--out", data_, "--vocab", "512", "--val-fraction", "0.1"},
                 tmp_->path() + "/prepare.log", 60);
    ASSERT_EQ(rc, 0) << "myriad prepare failed";
  }

  // Runs the myriad binary with `args` (stderr to `log`), killed after
  // `timeout_s`. Returns the exit code, 128 + signal, or -1 on a timeout.
  int Run(const std::vector<std::string>& args, const std::string& log, int timeout_s) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int null = open("/dev/null", O_WRONLY);
      dup2(err, 2);
      dup2(null, 1);
      if (chdir(tmp_->path().c_str()) != 0) _exit(126);
      std::vector<char*> argv = {const_cast<char*>(bin_.c_str())};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(bin_.c_str(), argv.data());
      _exit(127);
    }
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(timeout_s)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  Case MakeCase(std::mt19937_64& rng, int index) {
    Case c;
    c.in_file = rng() % 2 == 0;
    const int n = rng() % 5 < 3 ? 1 : 2 + static_cast<int>(rng() % 2);
    toml::table root = toml::parse(base_);
    auto change = [&](const std::string& key, const std::string& value) {
      c.keys.push_back(key);
      c.values.push_back(key + "=" + value);
      if (c.in_file) Assign(root, key, value);
    };
    for (int i = 0; i < n; ++i) {
      const std::string key = kKeys[rng() % std::size(kKeys)];
      change(key, rng() % 2 ? TypedValue(rng, TypeOf(key), !c.in_file) : RandomValue(rng, !c.in_file));
    }
    if (rng() % 30 == 0) change("model.d_modle", "64");  // a typo now and then
    // The paths point into the test's folder.
    Assign(root, "train.out_dir", "\"" + tmp_->path() + "/run_" + std::to_string(index) + "\"");
    Assign(root, "train.snapshot_dir", "\"none\"");
    Assign(root, "data.dir", "\"" + data_ + "\"");
    std::ostringstream out;
    out << root;
    c.file = tmp_->path() + "/case_" + std::to_string(index) + ".toml";
    std::ofstream(c.file) << out.str() << "\n";
    return c;
  }

  static bool NamesAKey(const std::string& msg, const std::vector<std::string>& keys) {
    for (const auto& k : keys) {
      if (msg.find(k) != std::string::npos) return true;
      if (msg.find(k.substr(k.find('.') + 1)) != std::string::npos) return true;  // "d_model=30"
    }
    return false;
  }

  std::string src_, bin_, data_, base_;
  uint64_t seed_ = 15;
  std::unique_ptr<TempDir> tmp_;
};

TEST_F(ConfigFuzz, EveryConfigIsRefusedNamingAKeyOrStarts) {
  PrepareData();
  if (HasFailure()) return;
  std::mt19937_64 rng(seed_);
  const bool verbose = std::getenv("MYRIAD_FUZZ_VERBOSE") != nullptr;  // every case and its outcome
  constexpr int kCases = 600, kRuns = 6;
  int refused = 0, valid = 0, ran = 0;
  std::vector<std::pair<int, Case>> runnable;
  for (int i = 0; i < kCases; ++i) {
    Case c = MakeCase(rng, i);
    SCOPED_TRACE("seed " + std::to_string(seed_) + " case " + std::to_string(i) + ":" + c.Describe());
    const auto t0 = std::chrono::steady_clock::now();
    ModelConfig mc;
    TrainConfig tc;
    Status s = LoadRunConfig(c.file, c.Overrides(), &mc, &tc);
    if (s.ok()) s = tc.ValidateLayout(mc, 1);
    if (s.ok()) s = CheckRunMemory(mc, tc, nullptr);  // the check `myriad train` makes
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(dt, 2.0) << "a case took " << dt << " s";
    if (verbose) std::printf("case %d:%s -> %s\n", i, c.Describe().c_str(), s.message().c_str());
    if (!s.ok()) {
      ++refused;
      EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
      EXPECT_TRUE(NamesAKey(s.message(), c.keys)) << "the error names none of the keys changed: " << s.message();
      continue;
    }
    ++valid;
    // Small enough to train a step (and an evaluation) in a second or two.
    const MemoryEstimate e = EstimateRankMemory(mc, tc, 1);
    const double tokens = static_cast<double>(tc.batch_size) * tc.seq_len * (tc.grad_accum + tc.eval_batches);
    if (static_cast<int>(runnable.size()) < kRuns && e.total < (int64_t{1} << 30) &&
        TrainFlopsPerToken(mc, tc.seq_len) * tokens < 2e9)
      runnable.emplace_back(i, std::move(c));
  }
  EXPECT_GT(refused, kCases / 5) << "too few refusals: the cases are not reaching the checks";
  EXPECT_GT(valid, kCases / 20) << "too few valid cases: the fuzz only tests refusals";

  // The runs that would start: `myriad train` for one step.
  for (auto& [i, c] : runnable) {
    std::vector<std::string> args = {"train", "--config", c.file, "--stop-after", "1", "-q", "--fresh"};
    for (const auto& o : c.Overrides()) args.insert(args.end(), {"--set", o});
    const std::string log = tmp_->path() + "/run_" + std::to_string(i) + ".log";
    SCOPED_TRACE("seed " + std::to_string(seed_) + " case " + std::to_string(i) + ": myriad train" + c.Describe());
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = Run(args, log, 60);
    ++ran;
    if (verbose)
      std::printf("run case %d: exit %d in %.1f s\n", i, rc,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::ifstream lf(log);
    std::string line, last, all;
    while (std::getline(lf, line)) last = line, all += line + "\n";
    ASSERT_NE(rc, -1) << "still running after 60 s:\n" << all;
    EXPECT_LT(rc, 128) << "killed by signal " << rc - 128 << ":\n" << all;
    if (rc == 0) {
      EXPECT_TRUE(fs::exists(tmp_->path() + "/run_" + std::to_string(i) + "/latest")) << all;
    } else {
      // A clear refusal at start (one line, naming a key), e.g. a vocabulary
      // smaller than the tokenizer's.
      EXPECT_EQ(last.rfind("myriad train: ", 0), 0u) << all;
      EXPECT_TRUE(NamesAKey(last, c.keys) || last.find("model.") != std::string::npos ||
                  last.find("train.") != std::string::npos)
          << all;
    }
  }
  EXPECT_GE(ran, 5) << "fewer than 5 valid cases small enough to run";
  std::printf("config fuzz (seed %" PRIu64 "): %d cases, %d refused, %d valid, %d trained a step\n", seed_, kCases,
              refused, valid, ran);
}

}  // namespace
}  // namespace myriad
