// myriad route prompts|data|train|eval: the edge/cloud router's prompt set,
// the judge's verdicts, the classifier's training and its evaluation
// (docs/edge.md, "Router").
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>

#include "cli/ckpt_util.h"
#include "cli/verbs.h"
#include "core/env.h"
#include "edge/judge.h"
#include "edge/route_eval.h"
#include "edge/router.h"
#include "edge/tagger.h"

namespace myriad::cli {

namespace {

int Fail(const char* verb, const Status& s, int code = 1) {
  std::fprintf(stderr, "myriad route %s: %s\n", verb, s.message().c_str());
  return code;
}

int RoutePrompts(int argc, char** argv) {
  CLI::App app{"Write the router's prompt set (train and held-out splits) as JSONL", "myriad route prompts"};
  edge::PromptSetOptions opt;
  std::string out, docs;
  app.add_option("--out,-o", out, "JSONL file to write")->required();
  app.add_option("--count", opt.count, "train prompts")->check(CLI::Range(1, 1 << 20));
  app.add_option("--held-out", opt.held_out_count, "held-out prompts")->check(CLI::Range(0, 1 << 20));
  app.add_option("--seed", opt.seed, "generator seed");
  app.add_option("--docs", docs, "business documents: JSONL with a \"text\" field (myriad redact corpus)");
  app.add_option("--doc-chars", opt.doc_chars, "a document is cut to this many characters")->check(CLI::Range(16, 1 << 20));
  app.add_option("--fortunes", opt.fortunes_dir, "folder of the fortune files");
  CLI11_PARSE(app, argc, argv);
  if (!docs.empty()) {
    Result<std::vector<std::string>> d = edge::LoadDocsJsonl(docs);
    if (!d.ok()) return Fail("prompts", d.status());
    opt.business_docs = std::move(d.value());
  }
  Result<std::vector<edge::RoutePrompt>> set = edge::BuildPromptSet(opt);
  if (!set.ok()) return Fail("prompts", set.status());
  if (Status s = edge::WritePromptsJsonl(out, *set); !s.ok()) return Fail("prompts", s);
  std::map<std::string, int> per;
  int agree = 0;
  for (const auto& p : *set) {
    ++per[p.split + "/" + p.domain];
    agree += edge::ClassifyDomain(p.prompt) == p.domain;
  }
  std::string counts;
  for (const auto& [k, v] : per) counts += " " + k + "=" + std::to_string(v);
  std::fprintf(stderr, "wrote %zu prompts to %s:%s; domain rules agree with the tags on %.1f%%\n", set->size(),
               out.c_str(), counts.c_str(), 100.0 * agree / std::max<size_t>(1, set->size()));
  return 0;
}

struct Loaded {
  LoadedModel m;
  std::unique_ptr<Tokenizer> tok;
};

Result<Loaded> LoadWithTokenizer(const std::string& path) {
  const bool hf = Env::Default()->FileExists(path + "/config.json");
  Loaded l;
  ASSIGN_OR_RETURN(l.m, LoadModelFor(hf ? "" : path, hf ? path : ""));
  if (l.m.tokenizer_path.empty()) return Status::Error(path + ": names no tokenizer");
  ASSIGN_OR_RETURN(Tokenizer t, Tokenizer::Load(l.m.tokenizer_path));
  l.tok = std::make_unique<Tokenizer>(std::move(t));
  return l;
}

int RouteData(int argc, char** argv) {
  CLI::App app{"Both models answer every prompt; the judge scores each placement and writes verdicts and features",
               "myriad route data"};
  std::string edge_path, cloud_path, prompts_path, out;
  edge::JudgeOptions opt;
  app.add_option("--edge", edge_path, "the edge model's checkpoint (run dir or step dir)")->required();
  app.add_option("--cloud", cloud_path, "the cloud model's checkpoint")->required();
  app.add_option("--prompts", prompts_path, "prompt set (myriad route prompts)")->required();
  app.add_option("--out,-o", out, "verdicts JSONL to write")->required();
  app.add_option("--max-tokens", opt.max_tokens, "tokens per answer")->check(CLI::Range(1, 4096));
  app.add_option("--margin", opt.margin, "edge wins when q_edge >= q_remote - margin")->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-prompt-tokens", opt.features.max_prompt_tokens, "tokens the embedding reads")
      ->check(CLI::Range(1, 4096));
  app.add_option("--probe-tokens", opt.features.probe_tokens, "greedy probe length")->check(CLI::Range(1, 16));
  app.add_option("--batch", opt.engine_batch, "engine batch")->check(CLI::Range(1, 1024));
  std::string tagger_dir;
  app.add_option("--tagger", tagger_dir, "the desensitiser's tagger (myriad redact train): names count as PII too");
  CLI11_PARSE(app, argc, argv);
  Result<std::vector<edge::RoutePrompt>> prompts = edge::LoadPromptsJsonl(prompts_path);
  if (!prompts.ok()) return Fail("data", prompts.status());
  std::unique_ptr<edge::Tagger> tagger;
  if (!tagger_dir.empty()) {
    auto t = edge::LoadTagger(tagger_dir);
    if (!t.ok()) return Fail("data", t.status().With("--tagger"));
    tagger = std::move(t).value();
  }
  Result<Loaded> e = LoadWithTokenizer(edge_path);
  if (!e.ok()) return Fail("data", e.status().With("--edge"));
  Result<Loaded> c = LoadWithTokenizer(cloud_path);
  if (!c.ok()) return Fail("data", c.status().With("--cloud"));
  edge::JudgeModel em{e->m.model.get(), e->tok.get(), TextConventions::For(*e->tok, e->m.eos_token_ids)};
  edge::JudgeModel cm{c->m.model.get(), c->tok.get(), TextConventions::For(*c->tok, c->m.eos_token_ids)};
  opt.edge_path = edge_path;
  // PII as the edge front sees it; the collaborative answer desensitised,
  // asked and restored as the edge front does it.
  const edge::Redactor redactor(tagger.get());
  opt.pii = edge::PiiThrough(&redactor);
  opt.collaborative = edge::CollaborativeThrough(&redactor);
  Result<std::vector<edge::RouteRecord>> recs =
      edge::JudgePrompts(em, cm, *prompts, opt, [](const std::string& s) { std::fprintf(stderr, "judge: %s\n", s.c_str()); });
  if (!recs.ok()) return Fail("data", recs.status());
  if (Status s = edge::WriteRecordsJsonl(out, *recs); !s.ok()) return Fail("data", s);
  std::map<std::string, int> verdicts;
  double qe = 0, qr = 0;
  for (const auto& r : *recs) ++verdicts[r.verdict], qe += r.q_edge, qr += r.q_remote;
  std::string vs;
  for (const auto& [k, v] : verdicts) vs += " " + k + "=" + std::to_string(v);
  std::fprintf(stderr, "wrote %zu verdicts to %s:%s; mean quality edge %.3f, remote %.3f\n", recs->size(),
               out.c_str(), vs.c_str(), qe / recs->size(), qr / recs->size());
  return 0;
}

struct SplitData {
  std::vector<const edge::RouteRecord*> recs;
  std::vector<std::vector<float>> x;  // raw feature vectors
  std::vector<int> y;                 // remote needed
  std::vector<double> qe, qr;
};

SplitData Select(const std::vector<edge::RouteRecord>& all, const std::string& split) {
  SplitData d;
  for (const auto& r : all) {
    if (r.prompt.split != split) continue;
    d.recs.push_back(&r);
    d.x.push_back(edge::FeatureVector(r.features));
    d.y.push_back(r.remote_needed() ? 1 : 0);
    d.qe.push_back(r.q_edge), d.qr.push_back(r.q_remote);
  }
  return d;
}

Status CheckShapes(const SplitData& d, const std::string& what) {
  for (size_t i = 0; i < d.x.size(); ++i)
    if (d.x[i].size() != d.x[0].size())
      return Status::Error(what + ": " + d.recs[i]->prompt.id + " has " + std::to_string(d.x[i].size()) +
                           " features, the first record " + std::to_string(d.x[0].size()));
  return Status::Ok();
}

int RouteTrain(int argc, char** argv) {
  CLI::App app{"Train the router's classifier on the judge's train split and calibrate its threshold",
               "myriad route train"};
  std::string data, out;
  double budget = -1, min_quality = -1;
  edge::TrainOptions topt;
  app.add_option("--data", data, "verdicts JSONL (myriad route data)")->required();
  app.add_option("--out,-o", out, "router.json to write")->required();
  auto* b = app.add_option("--cloud-budget", budget, "at most this share of prompts routed remote")
                ->check(CLI::Range(0.0, 1.0));
  app.add_option("--min-quality", min_quality, "the lowest remote share whose mean judged quality reaches this")
      ->check(CLI::Range(0.0, 1.0))
      ->excludes(b);
  app.add_option("--hidden", topt.hidden, "hidden units (0: logistic regression)")->check(CLI::Range(0, 1024));
  app.add_option("--steps", topt.steps, "full-batch AdamW steps")->check(CLI::Range(1, 1000000));
  app.add_option("--lr", topt.lr, "learning rate")->check(CLI::Range(1e-6, 10.0));
  app.add_option("--weight-decay", topt.weight_decay, "AdamW weight decay")->check(CLI::Range(0.0, 10.0));
  app.add_option("--seed", topt.seed, "initialisation seed");
  CLI11_PARSE(app, argc, argv);
  Result<std::vector<edge::RouteRecord>> all = edge::LoadRecordsJsonl(data);
  if (!all.ok()) return Fail("train", all.status());
  const SplitData tr = Select(*all, "train");
  if (tr.recs.empty()) return Fail("train", Status::Error(data + ": no train records"));
  if (Status s = CheckShapes(tr, data); !s.ok()) return Fail("train", s);
  edge::RouterModel m;
  m.standardiser = edge::Standardiser::Fit(tr.x);
  std::vector<std::vector<float>> xs;
  for (const auto& x : tr.x) xs.push_back(m.standardiser.Apply(x));
  double loss = 0;
  m.classifier = edge::TrainClassifier(xs, tr.y, topt, &loss);
  const nlohmann::json& em = tr.recs[0]->edge_model;
  m.embedding_dim = static_cast<int>(tr.recs[0]->features.embedding.size());
  m.edge_vocab_size = em.value("vocab_size", int64_t{0});
  m.edge_d_model = em.value("d_model", int64_t{m.embedding_dim});
  m.edge_n_layers = em.value("n_layers", int64_t{0});
  m.edge_path = em.value("path", "");
  m.spec.max_prompt_tokens = em.value("max_prompt_tokens", m.spec.max_prompt_tokens);
  m.spec.probe_tokens = em.value("probe_tokens", m.spec.probe_tokens);
  std::vector<double> p;
  for (const auto& x : xs) p.push_back(m.classifier.Probability(x.data()));
  bool reached = true;
  char knob[64];
  if (budget >= 0) {
    m.threshold = edge::ThresholdForBudget(p, budget);
    std::snprintf(knob, sizeof knob, "cloud_budget=%g", budget);
  } else if (min_quality >= 0) {
    m.threshold = edge::ThresholdForQuality(p, tr.qe, tr.qr, min_quality, &reached);
    std::snprintf(knob, sizeof knob, "min_quality=%g", min_quality);
  } else {
    m.threshold = edge::ThresholdForAccuracy(p, tr.y);
    std::snprintf(knob, sizeof knob, "max_accuracy");
  }
  m.knob = knob;
  int correct = 0, remote = 0;
  double q = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const bool r = p[i] >= m.threshold;
    correct += r == (tr.y[i] != 0), remote += r;
    q += r ? tr.qr[i] : tr.qe[i];
  }
  if (Status s = m.Save(out); !s.ok()) return Fail("train", s);
  if (!reached)
    std::fprintf(stderr, "route train: min quality %.3f is out of reach on the train split; everything routed remote\n",
                 min_quality);
  std::fprintf(stderr,
               "trained on %zu prompts (%d features, hidden %d): loss %.4f, train accuracy %.3f, threshold %.4f (%s), "
               "remote share %.3f, mean quality %.3f; wrote %s\n",
               p.size(), m.classifier.inputs(), m.classifier.hidden(), loss, double(correct) / p.size(), m.threshold,
               knob, double(remote) / p.size(), q / p.size(), out.c_str());
  return 0;
}

nlohmann::json CurveSummary(const std::vector<edge::CurvePoint>& c) {
  return {{"apgr", edge::Apgr(c)}, {"cloud_calls_cut", edge::CloudCallsCut(c)}};
}

int RouteEval(int argc, char** argv) {
  CLI::App app{"Evaluate a router on the judge's held-out split", "myriad route eval"};
  std::string data, router_path, edge_override, curve;
  bool json = false, no_latency = false;
  int knn_k = 5;
  app.add_option("--data", data, "verdicts JSONL (myriad route data)")->required();
  app.add_option("--router", router_path, "router.json (myriad route train)")->required();
  app.add_option("--edge", edge_override, "the edge checkpoint for the latency run (default: router.json's)");
  app.add_flag("--no-latency", no_latency, "skip the live routing run (no model loaded)");
  app.add_option("--curve", curve, "write the cost-quality curves here (.dat; scripts/route_plot.gp plots it)");
  app.add_option("--knn", knn_k, "k of the kNN baseline")->check(CLI::Range(1, 1000));
  app.add_flag("--json", json, "print the report as JSON");
  std::string tagger_dir;
  app.add_option("--tagger", tagger_dir, "the desensitiser's tagger, for live routing (as route data used)");
  CLI11_PARSE(app, argc, argv);
  Result<edge::RouterModel> rm = edge::RouterModel::Load(router_path);
  if (!rm.ok()) return Fail("eval", rm.status());
  Result<std::vector<edge::RouteRecord>> all = edge::LoadRecordsJsonl(data);
  if (!all.ok()) return Fail("eval", all.status());
  const SplitData tr = Select(*all, "train"), ho = Select(*all, "held_out");
  if (ho.recs.empty()) return Fail("eval", Status::Error(data + ": no held_out records"));
  if (Status s = CheckShapes(ho, data); !s.ok()) return Fail("eval", s);
  if (static_cast<int>(ho.x[0].size()) != rm->classifier.inputs())
    return Fail("eval", Status::Error(router_path + ": " + std::to_string(rm->classifier.inputs()) +
                                      " features, the data has " + std::to_string(ho.x[0].size())));
  const size_t n = ho.recs.size();
  std::vector<double> p;
  int correct = 0, remote = 0, agree_domain = 0;
  double q = 0;
  std::map<std::string, std::pair<int, int>> per_domain;  // correct, total
  for (size_t i = 0; i < n; ++i) {
    const edge::RouteRecord& r = *ho.recs[i];
    p.push_back(rm->PRemote(r.features));
    const edge::Route route = edge::Router::RouteOf(p[i], rm->threshold, r.features.pii);
    const bool ok = edge::RouteName(route) == r.verdict;
    correct += ok, remote += route != edge::Route::kEdge;
    q += route != edge::Route::kEdge ? r.q_remote : r.q_edge;
    auto& d = per_domain[r.prompt.domain];
    d.first += ok, d.second += 1;
    agree_domain += r.features.domain == r.prompt.domain;
  }
  // Curves: the router, random (expected), kNN on the embedding, the oracle.
  const auto router_curve = edge::QualityCurve(p, ho.qe, ho.qr);
  const auto random_curve = edge::RandomCurve(ho.qe, ho.qr);
  std::vector<std::vector<float>> tr_emb, ho_emb;
  for (const auto* r : tr.recs) tr_emb.push_back(r->features.embedding);
  for (const auto* r : ho.recs) ho_emb.push_back(r->features.embedding);
  const std::vector<double> knn = tr.recs.empty() ? std::vector<double>(n, 0.5) : edge::KnnScores(tr_emb, tr.y, ho_emb, knn_k);
  const auto knn_curve = edge::QualityCurve(knn, ho.qe, ho.qr);
  const auto oracle_curve = edge::QualityCurve(edge::OracleScore(ho.qe, ho.qr), ho.qe, ho.qr);
  int knn_correct = 0;
  for (size_t i = 0; i < n; ++i) knn_correct += (knn[i] >= 0.5) == (ho.y[i] != 0);
  nlohmann::json rep;
  rep["held_out"] = n;
  rep["accuracy"] = double(correct) / n;
  rep["remote_share"] = double(remote) / n;
  rep["quality"] = q / n;
  rep["threshold"] = std::isfinite(rm->threshold) ? nlohmann::json(rm->threshold) : nlohmann::json("inf");
  rep["knob"] = rm->knob;
  rep["all_edge_quality"] = router_curve.front().quality;
  rep["all_cloud_quality"] = router_curve.back().quality;
  rep["domain_rule_agreement"] = double(agree_domain) / n;
  int need = 0;
  for (int y : ho.y) need += y;
  rep["remote_needed_share"] = double(need) / n;
  for (const auto& [d, c] : per_domain) rep["accuracy_by_domain"][d] = double(c.first) / c.second;
  rep["router"] = CurveSummary(router_curve);
  rep["random"] = CurveSummary(random_curve);
  rep["knn"] = CurveSummary(knn_curve);
  rep["knn"]["k"] = knn_k;
  rep["knn"]["accuracy"] = double(knn_correct) / n;
  rep["oracle"] = CurveSummary(oracle_curve);
  // Live routing: the edge model computes the features again, per request.
  if (!no_latency) {
    const std::string ep = edge_override.empty() ? rm->edge_path : edge_override;
    if (ep.empty()) return Fail("eval", Status::Error(router_path + " names no edge model (hint: --edge CKPT or --no-latency)"));
    Result<Loaded> e = LoadWithTokenizer(ep);
    if (!e.ok()) return Fail("eval", e.status().With("edge model"));
    std::unique_ptr<edge::Tagger> tagger;
    if (!tagger_dir.empty()) {
      auto t = edge::LoadTagger(tagger_dir);
      if (!t.ok()) return Fail("eval", t.status().With("--tagger"));
      tagger = std::move(t).value();
    }
    const edge::Redactor redactor(tagger.get());
    Result<edge::Router> router = edge::Router::Load(router_path, *e->m.model, *e->tok, edge::PiiThrough(&redactor));
    if (!router.ok()) return Fail("eval", router.status());
    router->Decide(ho.recs[0]->prompt.prompt);  // warm-up (first-touch of the weights, thread pool start)
    std::vector<double> ms;
    int same = 0;
    for (size_t i = 0; i < n; ++i) {
      const edge::RouteDecision d = router->Decide(ho.recs[i]->prompt.prompt);
      ms.push_back(d.latency_ms);
      same += d.route == edge::Router::RouteOf(p[i], rm->threshold, ho.recs[i]->features.pii);
    }
    rep["latency_ms"] = {{"p50", edge::Percentile(ms, 50)}, {"p99", edge::Percentile(ms, 99)},
                         {"mean", std::accumulate(ms.begin(), ms.end(), 0.0) / n}};
    rep["live_agreement"] = double(same) / n;  // live decisions equal to the stored features' decisions
  }
  if (!curve.empty()) {
    std::string body = "# myriad route eval: remote share, mean judged quality (held-out, " + std::to_string(n) +
                       " prompts)\n";
    const std::pair<const char*, const std::vector<edge::CurvePoint>*> curves[] = {
        {"router", &router_curve}, {"random", &random_curve}, {"knn", &knn_curve}, {"oracle", &oracle_curve}};
    for (const auto& [name, c] : curves) {
      body += std::string("# ") + name + " (APGR " + std::to_string(edge::Apgr(*c)) + ")\n";
      for (const auto& pt : *c) body += std::to_string(pt.remote_share) + " " + std::to_string(pt.quality) + "\n";
      body += "\n\n";
    }
    if (Status s = WriteFileAtomic(Env::Default(), curve, body); !s.ok()) return Fail("eval", s);
  }
  if (json) {
    std::printf("%s\n", rep.dump(1).c_str());
    return 0;
  }
  std::printf("held-out prompts      %zu (remote needed on %.1f%%)\n", n, 100.0 * need / n);
  std::printf("accuracy              %.3f (kNN %.3f)\n", rep["accuracy"].get<double>(), rep["knn"]["accuracy"].get<double>());
  std::printf("remote share          %.3f at threshold %s (%s); quality %.3f (all-edge %.3f, all-cloud %.3f)\n",
              rep["remote_share"].get<double>(), rep["threshold"].dump().c_str(), rm->knob.c_str(), q / n,
              router_curve.front().quality, router_curve.back().quality);
  for (const char* k : {"router", "knn", "random", "oracle"})
    std::printf("%-8s APGR %.3f, cloud calls cut at equal quality %.1f%%\n", k, rep[k]["apgr"].get<double>(),
                100 * rep[k]["cloud_calls_cut"].get<double>());
  if (rep.contains("latency_ms"))
    std::printf("latency               p50 %.3f ms, p99 %.3f ms per request (live decisions agree %.1f%%)\n",
                rep["latency_ms"]["p50"].get<double>(), rep["latency_ms"]["p99"].get<double>(),
                100 * rep["live_agreement"].get<double>());
  std::printf("domain rules agree    %.1f%%\n", 100 * rep["domain_rule_agreement"].get<double>());
  if (!curve.empty())
    std::printf("curves                %s (gnuplot -e \"dat='%s'; png='route.png'\" scripts/route_plot.gp)\n",
                curve.c_str(), curve.c_str());
  return 0;
}

}  // namespace

// Answers made elsewhere (a benchmark's, through the servers) scored like
// the judge's: the verifier where the prompt has one, else the rubric.
int RouteScore(int argc, char** argv) {
  CLI::App app{"Score answers to a prompt set as the judge does (verifier, else the judge model's rubric)",
               "myriad route score"};
  std::string prompts_path, answers_path, judge_path, out;
  int batch = 16;
  app.add_option("--prompts", prompts_path, "prompt set (myriad route prompts)")->required();
  app.add_option("--answers", answers_path, "JSONL: {\"id\": prompt id, \"answer\": text, ...} per line")->required();
  app.add_option("--judge", judge_path, "the judge model's checkpoint (the cloud model)")->required();
  app.add_option("--out,-o", out, "the answers' lines again, each with \"quality\"")->required();
  app.add_option("--batch", batch, "engine batch")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  Result<std::vector<edge::RoutePrompt>> prompts = edge::LoadPromptsJsonl(prompts_path);
  if (!prompts.ok()) return Fail("score", prompts.status());
  std::map<std::string, const edge::RoutePrompt*> by_id;
  for (const auto& p : *prompts) by_id[p.id] = &p;
  std::ifstream in(answers_path);
  if (!in) return Fail("score", Status::Error(answers_path + ": cannot open (hint: check the path)"));
  std::vector<nlohmann::json> lines;
  std::vector<edge::RoutePrompt> ps;
  std::vector<std::string> answers;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const std::string where = answers_path + ":" + std::to_string(n) + ": ";
    if (!j.is_object() || !j.contains("id") || !j["id"].is_string() || !j.contains("answer") || !j["answer"].is_string())
      return Fail("score", Status::Error(where + "expected {\"id\": string, \"answer\": string}"));
    auto it = by_id.find(j["id"].get<std::string>());
    if (it == by_id.end()) return Fail("score", Status::Error(where + "no prompt '" + j["id"].get<std::string>() + "' in " + prompts_path));
    ps.push_back(*it->second);
    answers.push_back(j["answer"].get<std::string>());
    lines.push_back(std::move(j));
  }
  Result<Loaded> judge = LoadWithTokenizer(judge_path);
  if (!judge.ok()) return Fail("score", judge.status().With("--judge"));
  edge::JudgeModel jm{judge->m.model.get(), judge->tok.get(), TextConventions::For(*judge->tok, judge->m.eos_token_ids)};
  Result<std::vector<double>> q = edge::ScoreAnswers(jm, ps, answers, batch);
  if (!q.ok()) return Fail("score", q.status());
  std::ofstream o(out);
  for (size_t i = 0; i < lines.size(); ++i) {
    lines[i]["quality"] = (*q)[i];
    o << lines[i].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  if (!o.flush()) return Fail("score", Status::Error(out + ": cannot write"));
  std::fprintf(stderr, "scored %zu answers into %s\n", lines.size(), out.c_str());
  return 0;
}

int RunRoute(int argc, char** argv) {
  const char* usage =
      "usage: myriad route prompts|data|train|eval|score [options]   (myriad route <step> --help)\n"
      "  prompts  write the prompt set (train and held-out)\n"
      "  data     both models answer, the judge scores; verdicts and features\n"
      "  train    train the router's classifier and calibrate its threshold\n"
      "  eval     accuracy, APGR, cloud calls cut, curves and latency on the held-out split\n"
      "  score    score answers made elsewhere as the judge does (bench/edge_cloud.py)\n";
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string step = argv[1];
  if (step == "prompts") return RoutePrompts(argc - 1, argv + 1);
  if (step == "data") return RouteData(argc - 1, argv + 1);
  if (step == "train") return RouteTrain(argc - 1, argv + 1);
  if (step == "eval") return RouteEval(argc - 1, argv + 1);
  if (step == "score") return RouteScore(argc - 1, argv + 1);
  std::fprintf(stderr, "myriad route: unknown step '%s' (hint: prompts, data, train, eval or score)\n", step.c_str());
  return 2;
}

}  // namespace myriad::cli
