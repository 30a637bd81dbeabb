#include "data/prepare.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/env.h"
#include "core/log.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace myriad {
namespace {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform 64-bit key per document, from its text and the seed.
uint64_t DocumentKey(const std::string& text, uint64_t seed) {
  return Mix64(Checksum64(text) ^ Mix64(seed));
}

double Seconds(Env* env, uint64_t start_us) { return (env->NowMicros() - start_us) / 1e6; }

Status ValidateOptions(const PrepareOptions& o) {
  if (o.out_dir.empty()) return Status::Error("prepare: out_dir is empty (hint: e.g. --out data/default)");
  if (o.vocab_size < 260 || o.vocab_size > (1 << 24)) {
    return Status::Error("prepare: vocab_size=" + std::to_string(o.vocab_size) +
                         " is out of range (hint: 260..16777216; 4096 suits the default corpus)");
  }
  if (!(o.val_fraction >= 0.0 && o.val_fraction <= 0.5)) {
    return Status::Error("prepare: val_fraction=" + std::to_string(o.val_fraction) +
                         " is out of range (hint: a fraction in [0, 0.5], e.g. 0.02)");
  }
  if (o.max_bytes < 0) {
    return Status::Error("prepare: max_bytes=" + std::to_string(o.max_bytes) +
                         " is negative (hint: 0 means no cap)");
  }
  if (o.shard_max_tokens < 1) return Status::Error("prepare: shard_max_tokens must be positive");
  return Status::Ok();
}

// Keeps about max_bytes of the corpus, the same fraction of every source,
// choosing documents by key; kept documents stay in corpus order.
void CapCorpus(Corpus* corpus, int64_t max_bytes, uint64_t seed) {
  const int64_t total = corpus->total_bytes();
  if (max_bytes <= 0 || total <= max_bytes) return;
  const double scale = static_cast<double>(max_bytes) / static_cast<double>(total);
  std::vector<bool> keep(corpus->documents.size(), false);
  for (auto& source : corpus->sources) {
    std::vector<std::pair<uint64_t, size_t>> order;
    for (size_t i = 0; i < corpus->documents.size(); ++i) {
      if (corpus->documents[i].source == source.source) {
        order.push_back({DocumentKey(corpus->documents[i].text, seed ^ i), i});
      }
    }
    std::sort(order.begin(), order.end());
    const int64_t budget = static_cast<int64_t>(scale * static_cast<double>(source.bytes));
    int64_t used = 0, docs = 0;
    for (auto [key, i] : order) {
      int64_t size = static_cast<int64_t>(corpus->documents[i].text.size());
      if (docs > 0 && used + size > budget) continue;
      keep[i] = true;
      used += size;
      ++docs;
    }
    source.bytes = used;
    source.documents = docs;
  }
  std::vector<CorpusDocument> kept;
  for (size_t i = 0; i < corpus->documents.size(); ++i) {
    if (keep[i]) kept.push_back(std::move(corpus->documents[i]));
  }
  corpus->documents = std::move(kept);
}

// is_val[i] for every document; see prepare.h for the rules.
std::vector<bool> SplitDocuments(const Corpus& corpus, double val_fraction, uint64_t seed) {
  const size_t n = corpus.documents.size();
  std::vector<bool> is_val(n, false);
  const double threshold = val_fraction * 18446744073709551616.0;  // 2^64
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) {
    keys[i] = DocumentKey(corpus.documents[i].text, seed);
    is_val[i] = static_cast<double>(keys[i]) < threshold;
  }
  if (val_fraction <= 0) return is_val;
  for (const auto& source : corpus.sources) {
    // The documents of this source, with the smallest and largest key.
    size_t count = 0, val = 0, lo = n, hi = n;
    for (size_t i = 0; i < n; ++i) {
      if (corpus.documents[i].source != source.source) continue;
      ++count;
      val += is_val[i];
      if (lo == n || keys[i] < keys[lo]) lo = i;
      if (hi == n || keys[i] > keys[hi]) hi = i;
    }
    if (count < 2) continue;
    // Move every copy of the chosen text, so identical documents stay together.
    auto move_key = [&](uint64_t key, bool to_val) {
      for (size_t i = 0; i < n; ++i) {
        if (keys[i] == key && corpus.documents[i].source == source.source) is_val[i] = to_val;
      }
    };
    if (val == 0) move_key(keys[lo], true);
    if (val == count) move_key(keys[hi], false);
  }
  return is_val;
}

struct SplitWriter {
  std::string split;
  std::string out_dir;
  uint32_t vocab_size = 0;
  uint64_t shard_max_tokens = 0;
  std::unique_ptr<ShardWriter> current;
  std::vector<std::string> shard_files;
  uint64_t tokens = 0, documents = 0, bytes = 0;

  Status Append(const std::vector<int32_t>& doc_with_eos, size_t text_bytes) {
    if (current && current->num_tokens() > 0 &&
        current->num_tokens() + doc_with_eos.size() > shard_max_tokens) {
      RETURN_IF_ERROR(Close());
    }
    if (!current) {
      std::string name = ShardFileName(split, static_cast<int>(shard_files.size()));
      current = std::make_unique<ShardWriter>(out_dir + "/" + name, vocab_size);
      shard_files.push_back(name);
    }
    RETURN_IF_ERROR(current->AppendDocument(doc_with_eos));
    tokens += doc_with_eos.size();
    documents += 1;
    bytes += text_bytes;
    return Status::Ok();
  }
  Status Close() {
    if (!current) return Status::Ok();
    LOG_INFO("prepare: wrote %s/%s: %llu tokens, %llu documents", out_dir.c_str(),
             shard_files.back().c_str(), static_cast<unsigned long long>(current->num_tokens()),
             static_cast<unsigned long long>(current->num_documents()));
    Status s = current->Finish();
    current.reset();
    return s;
  }
};

// Removes what an earlier run left in out_dir: shards of any split, their
// temp files and data.json.
Status RemoveEarlierOutput(Env* env, const std::string& out_dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(out_dir));
  for (const auto& name : names) {
    bool shard = (name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) &&
                 (name.size() > 4 && (name.compare(name.size() - 4, 4, ".bin") == 0 ||
                                      name.find(".bin.tmp") != std::string::npos));
    if (shard || name == "data.json" || name == "data.json.tmp") {
      RETURN_IF_ERROR(env->RemoveAll(out_dir + "/" + name));
    }
  }
  return Status::Ok();
}

}  // namespace

Status RunPrepare(const PrepareOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  Env* env = Env::Default();
  const uint64_t start = env->NowMicros();
  const std::string& out = options.out_dir;

  // 1. Corpus.
  LOG_INFO("prepare: reading %s", options.input_dir.empty()
                                       ? "the built-in corpus (fortunes, fortunes-zh, python3.11 stdlib)"
                                       : options.input_dir.c_str());
  Result<Corpus> loaded = options.input_dir.empty() ? LoadDefaultCorpus()
                                                    : LoadFolderCorpus(options.input_dir);
  if (!loaded.ok()) return loaded.status();
  Corpus corpus = std::move(loaded.value());
  if (options.max_bytes > 0 && corpus.total_bytes() > options.max_bytes) {
    LOG_INFO("prepare: capping %.2f MB to max_bytes=%lld", corpus.total_bytes() / 1e6,
             static_cast<long long>(options.max_bytes));
    CapCorpus(&corpus, options.max_bytes, options.seed);
  }
  {
    std::string summary = corpus.Summary();
    for (size_t pos = 0, nl; (nl = summary.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      LOG_INFO("prepare: source %s", summary.substr(pos, nl - pos).c_str());
    }
  }

  // 2. Split.
  std::vector<bool> is_val = SplitDocuments(corpus, options.val_fraction, options.seed);
  std::vector<std::string> train_texts;
  size_t val_docs = 0;
  for (size_t i = 0; i < corpus.documents.size(); ++i) {
    if (is_val[i]) {
      ++val_docs;
    } else {
      train_texts.push_back(corpus.documents[i].text);
    }
  }
  LOG_INFO("prepare: split %zu train / %zu val documents (val_fraction=%g, seed=%llu)",
           train_texts.size(), val_docs, options.val_fraction,
           static_cast<unsigned long long>(options.seed));
  if (train_texts.empty()) {
    return Status::Error("prepare: no train documents (hint: lower val_fraction or add text)");
  }

  // 3. Tokenizer.
  RETURN_IF_ERROR(env->CreateDirs(out));
  RETURN_IF_ERROR(RemoveEarlierOutput(env, out));
  TokenizerTrainOptions tok_options;
  tok_options.seed = options.seed;
  tok_options.max_training_bytes = options.tokenizer_training_bytes;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int threads = options.num_threads > 0 ? options.num_threads : static_cast<int>(hw);
  tok_options.num_threads = threads;
  const uint64_t tok_start = env->NowMicros();
  std::string tokenizer_ref = "tokenizer.model";  // data.json's "tokenizer"
  if (options.tokenizer.empty()) {
    RETURN_IF_ERROR(Tokenizer::Train(train_texts, out + "/tokenizer", options.vocab_size, tok_options));
  } else {
    std::error_code ec;
    tokenizer_ref = std::filesystem::absolute(options.tokenizer, ec).lexically_normal().string();
  }
  std::vector<std::string>().swap(train_texts);
  ASSIGN_OR_RETURN(Tokenizer tokenizer,
                   Tokenizer::Load(options.tokenizer.empty() ? out + "/tokenizer.model" : tokenizer_ref));
  if (tokenizer.eos_id() < 0)
    return Status::Error(options.tokenizer + ": the tokenizer has no eos token, which prepare puts after every "
                         "document (hint: a tokenizer_config.json with eos_token beside it)");
  if (options.tokenizer.empty())
    LOG_INFO("prepare: tokenizer %s/tokenizer.model: vocab %d, trained in %.1fs", out.c_str(),
             tokenizer.vocab_size(), Seconds(env, tok_start));
  else
    LOG_INFO("prepare: tokenizer %s: vocab %d, eos %d (not trained: given)", tokenizer_ref.c_str(),
             tokenizer.vocab_size(), tokenizer.eos_id());

  // 4. Encode in chunks on all cores; write in corpus order.
  SplitWriter writers[2];
  for (int s = 0; s < 2; ++s) {
    writers[s].split = s == 0 ? "train" : "val";
    writers[s].out_dir = out;
    writers[s].vocab_size = static_cast<uint32_t>(tokenizer.vocab_size());
    writers[s].shard_max_tokens = options.shard_max_tokens;
  }
  struct SourceCounts {
    uint64_t documents[2] = {0, 0}, bytes[2] = {0, 0}, tokens[2] = {0, 0};
  };
  std::map<std::string, SourceCounts> per_source;
  const uint64_t encode_start = env->NowMicros();
  constexpr size_t kChunkBytes = 32 << 20;
  const size_t n = corpus.documents.size();
  uint64_t bytes_done = 0;
  for (size_t begin = 0; begin < n;) {
    size_t end = begin, chunk_bytes = 0;
    while (end < n && (end == begin || chunk_bytes < kChunkBytes)) chunk_bytes += corpus.documents[end++].text.size();
    std::vector<std::vector<int32_t>> encoded(end - begin);
    std::atomic<size_t> next{begin};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < end;) {
        std::vector<int32_t>& ids = encoded[i - begin];
        tokenizer.EncodeTo(corpus.documents[i].text, &ids);
        ids.push_back(tokenizer.eos_id());
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (size_t i = begin; i < end; ++i) {
      const int split = is_val[i] ? 1 : 0;
      const CorpusDocument& doc = corpus.documents[i];
      RETURN_IF_ERROR(writers[split].Append(encoded[i - begin], doc.text.size()));
      SourceCounts& c = per_source[doc.source];
      c.documents[split] += 1;
      c.bytes[split] += doc.text.size();
      c.tokens[split] += encoded[i - begin].size() - 1;  // without the eos
    }
    bytes_done += chunk_bytes;
    LOG_INFO("prepare: encoded %zu/%zu documents (%.1f MB, %.1f MB/s)", end, n, bytes_done / 1e6,
             bytes_done / 1e6 / std::max(1e-9, Seconds(env, encode_start)));
    begin = end;
  }
  for (auto& w : writers) RETURN_IF_ERROR(w.Close());

  // 5. data.json, last.
  nlohmann::json splits = nlohmann::json::object();
  for (const auto& w : writers) {
    splits[w.split] = {{"documents", w.documents}, {"bytes", w.bytes}, {"tokens", w.tokens},
                       {"shards", w.shard_files}};
  }
  nlohmann::json sources = nlohmann::json::object();
  for (const auto& s : corpus.sources) {
    const SourceCounts& c = per_source[s.source];
    sources[s.source] = {
        {"files", s.files},
        {"skipped_files", s.skipped_files},
        {"capped_files", s.capped_files},
        {"train", {{"documents", c.documents[0]}, {"bytes", c.bytes[0]}, {"tokens", c.tokens[0]}}},
        {"val", {{"documents", c.documents[1]}, {"bytes", c.bytes[1]}, {"tokens", c.tokens[1]}}}};
  }
  nlohmann::json data = {
      {"format", "myriad-data"},
      {"version", 1},
      {"tokenizer", tokenizer_ref},
      {"vocab_size", tokenizer.vocab_size()},
      {"bos_id", tokenizer.bos_id()},
      {"eos_id", tokenizer.eos_id()},
      {"unk_id", tokenizer.unk_id()},
      {"packing", "each document is followed by eos_id; rows are windows of seq_len+1 tokens"},
      {"splits", splits},
      {"sources", sources},
      {"options",
       {{"input", options.input_dir.empty() ? "default" : options.input_dir},
        {"vocab_size", options.vocab_size},
        {"tokenizer", options.tokenizer.empty() ? "trained" : tokenizer_ref},
        {"val_fraction", options.val_fraction},
        {"seed", options.seed},
        {"max_bytes", options.max_bytes},
        {"shard_max_tokens", options.shard_max_tokens},
        {"tokenizer_training_bytes", options.tokenizer_training_bytes}}},
  };
  RETURN_IF_ERROR(WriteFileAtomic(env, out + "/data.json", data.dump(2) + "\n"));
  const uint64_t corpus_bytes = writers[0].bytes + writers[1].bytes;
  const uint64_t tokens = writers[0].tokens + writers[1].tokens;
  LOG_INFO("prepare: done in %.1fs: %s/data.json; train %llu tokens in %zu shards, val %llu "
           "tokens; %.2f bytes/token",
           Seconds(env, start), out.c_str(), static_cast<unsigned long long>(writers[0].tokens),
           writers[0].shard_files.size(), static_cast<unsigned long long>(writers[1].tokens),
           tokens ? static_cast<double>(corpus_bytes) / tokens : 0.0);
  return Status::Ok();
}

std::string PreparedTokenizerPath(const std::string& data_dir) {
  std::ifstream in(data_dir + "/data.json");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::string name = "tokenizer.model";
  if (j.is_object() && j.contains("tokenizer") && j["tokenizer"].is_string()) name = j["tokenizer"];
  return !name.empty() && name[0] == '/' ? name : data_dir + "/" + name;
}

}  // namespace myriad
