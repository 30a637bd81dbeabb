// `myriad redact corpus|train|eval|tag`: the labelled corpus, the
// tagger's training, the detector evaluation and a look at the tagger's spans (src/edge/corpus.h, tagger.h,
// redact_eval.h). argv[0] is the subcommand.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/verbs.h"
#include "data/corpus.h"
#include "edge/corpus.h"
#include "edge/redact.h"
#include "edge/redact_eval.h"
#include "edge/restore_check.h"
#include "edge/tagger.h"

namespace myriad::cli {

namespace {

using edge::EntityType;

const std::vector<EntityType> kTaggerTypes = {EntityType::kPerson, EntityType::kAddress, EntityType::kOrg};

int Fail(const char* sub, const std::string& message) {
  std::fprintf(stderr, "myriad redact %s: %s\n", sub, message.c_str());
  return 2;
}

edge::Detector TaggerDetector(const edge::Tagger& t) {
  return [&t](std::string_view utf8) { return t.Tag(edge::DecodeUtf8(utf8)); };
}

int RunCorpus(int argc, char** argv) {
  CLI::App app{"Write a labelled desensitisation corpus as JSONL", "myriad redact corpus"};
  std::string out, split = "train";
  int64_t count = 100;
  uint64_t seed = 1;
  app.add_option("--out,-o", out, "JSONL file to write")->required();
  app.add_option("--count", count, "documents")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--seed", seed, "generator seed");
  app.add_option("--split", split, "train or held-out")->check(CLI::IsMember({"train", "held-out"}));
  CLI11_PARSE(app, argc, argv);
  const auto docs = edge::GenerateCorpus(seed, *edge::ParseSplit(split), count);
  if (Status s = edge::WriteJsonl(out, docs); !s.ok()) return Fail("corpus", s.message());
  int64_t spans = 0, decoys = 0;
  for (const auto& d : docs) spans += static_cast<int64_t>(d.spans.size()), decoys += static_cast<int64_t>(d.decoys.size());
  std::printf("%s: %lld documents (%s), %lld spans, %lld decoys\n", out.c_str(), static_cast<long long>(count),
              split.c_str(), static_cast<long long>(spans), static_cast<long long>(decoys));
  return 0;
}

// The built-in corpus's texts (fortunes, Python sources): the tagger's
// negatives. Empty, with a warning, where its packages are not installed.
std::vector<std::string> PlainTexts() {
  auto c = LoadDefaultCorpus();
  if (!c.ok()) {
    std::fprintf(stderr, "myriad redact: no built-in corpus for plain-text documents (%s)\n", c.status().message().c_str());
    return {};
  }
  std::vector<std::string> texts;
  for (auto& d : c->documents) texts.push_back(std::move(d.text));
  return texts;
}

// What the tagger redacts in free text with nothing to redact.
struct PlainFigures {
  int64_t docs = 0, docs_flagged = 0, chars = 0, chars_flagged = 0;
};
PlainFigures ScorePlain(const std::vector<edge::LabelledDoc>& plain, const edge::Detector& detect) {
  PlainFigures f;
  for (const auto& d : plain) {
    const auto spans = detect(d.text);
    int64_t flagged = 0;
    for (const auto& sp : spans)
      if (sp.type == EntityType::kPerson || sp.type == EntityType::kAddress || sp.type == EntityType::kOrg)
        flagged += sp.end - sp.start;
    ++f.docs;
    f.docs_flagged += flagged > 0;
    f.chars += static_cast<int64_t>(edge::DecodeUtf8(d.text).size());
    f.chars_flagged += flagged;
  }
  return f;
}
void PrintPlain(const PlainFigures& f) {
  if (f.docs == 0) return;
  std::printf("plain text (held-out fortunes and code, nothing to redact): names/addresses/organisations found in "
              "%lld of %lld documents, %lld of %lld characters (%.4f)\n",
              static_cast<long long>(f.docs_flagged), static_cast<long long>(f.docs),
              static_cast<long long>(f.chars_flagged), static_cast<long long>(f.chars),
              f.chars ? double(f.chars_flagged) / f.chars : 0.0);
}

void PrintReport(const edge::EvalReport& r, bool json) {
  if (json) std::printf("%s\n", edge::EvalReportJson(r).dump(1).c_str());
  else std::printf("%s", edge::FormatEvalTable(r).c_str());
}

int RunTrainTagger(int argc, char** argv) {
  CLI::App app{"Train the PERSON/ADDRESS/ORG tagger on a generated corpus, save it, print held-out figures",
               "myriad redact train"};
  std::string out;
  int64_t docs = 3000, held_out = 300, threads = 0;
  uint64_t seed = 1;
  edge::TaggerConfig cfg;
  edge::TaggerTrainOptions opt;
  bool json = false;
  app.add_option("--out,-o", out, "tagger directory to write")->required();
  app.add_option("--docs", docs, "training documents to generate")->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--held-out", held_out, "held-out documents to evaluate on")->check(CLI::Range(int64_t{0}, int64_t{1} << 22));
  app.add_option("--steps", opt.steps, "optimizer steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--batch", opt.batch, "sequences per step")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--lr", opt.lr, "peak learning rate");
  app.add_option("--seed", seed, "corpus and training seed");
  app.add_option("--d-model", cfg.d_model, "model width");
  app.add_option("--layers", cfg.n_layers, "transformer layers");
  app.add_option("--d-ff", cfg.d_ff, "FFN width");
  app.add_option("--window", cfg.window, "positions per sequence");
  app.add_option("--delay", cfg.delay, "positions of right context each tag waits for");
  app.add_option("--threads", threads, "OpenMP threads (0: all cores)");
  int64_t plain = 1000;
  app.add_option("--plain", plain, "free-text documents with nothing to redact (the built-in corpus) mixed in")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 22));
  app.add_flag("--json", json, "held-out figures as JSON");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
  opt.seed = seed;
  auto train_docs = edge::GenerateCorpus(seed, edge::Split::kTrain, docs);
  std::vector<std::string> plain_texts;
  if (plain > 0) {
    plain_texts = PlainTexts();
    const auto negatives = edge::PlainTextDocs(plain_texts, edge::Split::kTrain, plain, seed);
    std::fprintf(stderr, "tagger: %zu generated documents and %zu plain-text ones\n", train_docs.size(), negatives.size());
    train_docs.insert(train_docs.end(), negatives.begin(), negatives.end());
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto tagger = edge::TrainTagger(train_docs, cfg, opt);
  if (!tagger.ok()) return Fail("train", tagger.status().message());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (Status s = (*tagger)->Save(out); !s.ok()) return Fail("train", s.message());
  std::fprintf(stderr, "tagger: %lld parameters, vocab %lld, trained in %.1fs, saved to %s\n",
               static_cast<long long>((*tagger)->num_params()), static_cast<long long>((*tagger)->vocab_size()), secs,
               out.c_str());
  if (held_out > 0) {
    const auto ho = edge::GenerateCorpus(seed + 1, edge::Split::kHeldOut, held_out);
    edge::EvalOptions eo;
    eo.types = kTaggerTypes;
    PrintReport(edge::EvaluateDetector(ho, TaggerDetector(**tagger), eo), json);
    if (!json && !plain_texts.empty())
      PrintPlain(ScorePlain(edge::PlainTextDocs(plain_texts, edge::Split::kHeldOut, 300, seed), TaggerDetector(**tagger)));
  }
  return 0;
}

// The whole desensitiser (patterns + the tagger) on held-out documents, every
// type, with the restore figure; --tagger-only scores the tagger alone on its types.
int RunEvalTagger(int argc, char** argv) {
  CLI::App app{"Evaluate desensitisation on held-out labelled documents: per-type precision, recall, F1, F2, "
               "decoys, over-redaction, speed, restores",
               "myriad redact eval"};
  std::string dir, docs_path;
  int64_t count = 300, threads = 0;
  uint64_t seed = 2;
  bool json = false, tagger_only = false;
  app.add_option("--tagger", dir, "tagger directory (without it: the patterns alone)");
  app.add_option("--docs", docs_path, "labelled JSONL (default: generate --count held-out documents)");
  app.add_option("--count", count, "held-out documents to generate")->check(CLI::Range(int64_t{1}, int64_t{1} << 22));
  app.add_option("--seed", seed, "seed of the generated documents");
  app.add_option("--threads", threads, "OpenMP threads (0: all cores)");
  app.add_flag("--tagger-only", tagger_only, "score the tagger alone, on PERSON/ADDRESS/ORG");
  int64_t plain = 300;
  app.add_option("--plain", plain, "held-out free-text documents (the built-in corpus) to count false finds on")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 22));
  app.add_flag("--json", json, "figures as JSON");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
  std::unique_ptr<edge::Tagger> tagger;
  if (!dir.empty()) {
    auto t = edge::LoadTagger(dir);
    if (!t.ok()) return Fail("eval", t.status().message());
    tagger = std::move(t).value();
  } else if (tagger_only) {
    return Fail("eval", "--tagger-only needs --tagger DIR");
  }
  std::vector<edge::LabelledDoc> docs;
  if (!docs_path.empty()) {
    auto read = edge::ReadJsonl(docs_path);
    if (!read.ok()) return Fail("eval", read.status().message());
    docs = std::move(read).value();
  } else {
    docs = edge::GenerateCorpus(seed, edge::Split::kHeldOut, count);
  }
  edge::EvalOptions eo;
  if (tagger_only) {
    eo.types = kTaggerTypes;
    PrintReport(edge::EvaluateDetector(docs, TaggerDetector(*tagger), eo), json);
    return 0;
  }
  const edge::Redactor redactor(tagger.get());
  const edge::EvalReport r =
      edge::EvaluateDetector(docs, [&](std::string_view t) { return redactor.Detect(t); }, eo);
  std::vector<std::string> texts;
  for (const auto& d : docs) texts.push_back(d.text);
  const edge::RestoreCheck rc = edge::CheckRestores(redactor, texts);
  PlainFigures pf;
  if (plain > 0) {
    const auto plain_docs = edge::PlainTextDocs(PlainTexts(), edge::Split::kHeldOut, plain, seed);
    pf = ScorePlain(plain_docs, [&](std::string_view t) { return redactor.Detect(t); });
  }
  if (json) {
    nlohmann::json j = edge::EvalReportJson(r);
    j["restore"] = {{"documents", rc.documents}, {"answers", rc.answers}, {"placeholders", rc.placeholders},
                    {"failures", rc.failures}};
    j["tagger"] = dir.empty() ? nlohmann::json(nullptr) : nlohmann::json(dir);
    j["plain"] = {{"docs", pf.docs}, {"docs_flagged", pf.docs_flagged}, {"chars", pf.chars},
                  {"chars_flagged", pf.chars_flagged}};
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    std::printf("%s", edge::FormatEvalTable(r).c_str());
    std::printf("restore: %lld answers over %lld documents (echoed, reformatted, repeated and reordered "
                "placeholders, whole and streamed), %lld placeholders, %lld failures\n",
                static_cast<long long>(rc.answers), static_cast<long long>(rc.documents),
                static_cast<long long>(rc.placeholders), static_cast<long long>(rc.failures));
    PrintPlain(pf);
  }
  for (const auto& e : rc.examples) std::fprintf(stderr, "restore failure: %s\n", e.c_str());
  return 0;
}

int RunTagText(int argc, char** argv) {
  CLI::App app{"Print the tagger's spans over one text, or over generated held-out documents next to their gold spans",
               "myriad redact tag"};
  std::string dir, text;
  int64_t count = 0;
  uint64_t seed = 2;
  app.add_option("--tagger", dir, "tagger directory")->required();
  app.add_option("--text", text, "UTF-8 text to tag");
  app.add_option("--count", count, "or: this many generated held-out documents, gold beside predicted");
  app.add_option("--seed", seed, "seed of the generated documents");
  CLI11_PARSE(app, argc, argv);
  auto tagger = edge::LoadTagger(dir);
  if (!tagger.ok()) return Fail("tag", tagger.status().message());
  auto show = [&](const std::string& t, const std::vector<edge::Span>& spans, const char* what) {
    for (const edge::Span& s : spans)
      if (s.type == EntityType::kPerson || s.type == EntityType::kAddress || s.type == EntityType::kOrg)
        std::printf("%s %lld %lld %s %.3f [%s]\n", what, static_cast<long long>(s.start), static_cast<long long>(s.end),
                    edge::EntityTypeName(s.type), s.confidence, edge::SpanText(t, s).c_str());
  };
  if (!text.empty()) show(text, (*tagger)->Tag(edge::DecodeUtf8(text)), "span");
  for (const auto& d : edge::GenerateCorpus(seed, edge::Split::kHeldOut, count)) {
    std::printf("== %s\n%s\n", d.id.c_str(), d.text.c_str());
    show(d.text, d.spans, "gold");
    show(d.text, (*tagger)->Tag(edge::DecodeUtf8(d.text)), "pred");
  }
  return 0;
}

}  // namespace

int RunRedactTools(int argc, char** argv) {
  const char* usage = "usage: myriad redact corpus|train|eval|tag [options]   (--help after one for its options)\n";
  if (argc < 1 || !argv[0]) {
    std::fprintf(stderr, "%s", usage);
    return 2;
  }
  const std::string sub = argv[0];
  if (sub == "corpus") return RunCorpus(argc, argv);
  if (sub == "train") return RunTrainTagger(argc, argv);
  if (sub == "eval") return RunEvalTagger(argc, argv);
  if (sub == "tag") return RunTagText(argc, argv);
  if (sub == "--help" || sub == "-h") {
    std::printf("%s", usage);
    return 0;
  }
  std::fprintf(stderr, "myriad redact: unknown subcommand '%s' (hint: corpus, train, eval or tag)\n", sub.c_str());
  return 2;
}

}  // namespace myriad::cli
