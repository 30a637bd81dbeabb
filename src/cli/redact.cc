// myriad redact [FILE...]: desensitise text on the device (placeholders from
// a session vault); myriad redact --restore --vault V [ANSWER]: put the
// originals back. Exit 3 when an answer names a placeholder the vault lacks.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/verbs.h"
#include "core/env.h"
#include "edge/redact.h"
#include "edge/tagger.h"

namespace myriad::cli {
namespace {

struct Doc {
  std::string name, text;
};

Result<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  return Env::Default()->ReadFile(path);
}

// {"text": ...} per line (an "id" or "doc" field names the document).
Status SplitJsonl(const std::string& path, const std::string& content, std::vector<Doc>* docs) {
  std::istringstream in(content);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      return Status::Error(where + ": expected a JSON object with a \"text\" string");
    std::string name = where;
    for (const char* key : {"id", "doc"})
      if (j.contains(key)) name = j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
    docs->push_back(Doc{name, j["text"].get<std::string>()});
  }
  return Status::Ok();
}

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "myriad redact: %s\n", message.c_str());
  return code;
}

int RunRestore(const std::vector<std::string>& inputs, const std::string& vault_path) {
  if (vault_path.empty()) return Fail("--restore needs --vault FILE (the vault the request was redacted with)", 2);
  if (inputs.size() > 1) return Fail("--restore takes one answer (a file or - for stdin)", 2);
  if (!Env::Default()->FileExists(vault_path)) return Fail(vault_path + ": no such vault", 2);
  Result<edge::Vault> vault = edge::Vault::Load(vault_path);
  if (!vault.ok()) return Fail(vault.status().message(), 2);
  Result<std::string> answer = ReadInput(inputs.empty() ? "-" : inputs[0]);
  if (!answer.ok()) return Fail(answer.status().message(), 2);
  const edge::Restored r = edge::Restore(*answer, *vault);
  std::fwrite(r.text.data(), 1, r.text.size(), stdout);
  std::fflush(stdout);
  for (const std::string& u : r.unresolved)
    std::fprintf(stderr, "myriad redact: unresolved placeholder %s (no entry in %s)\n", u.c_str(),
                 vault_path.c_str());
  return r.ok() ? 0 : 3;
}

}  // namespace

int RunRedact(int argc, char** argv) {
  // `myriad redact corpus|train|eval|tag`: the corpus, the tagger and the
  // evaluation (src/cli/redact_tagger.cc).
  if (argc > 1 && (!std::strcmp(argv[1], "corpus") || !std::strcmp(argv[1], "train") ||
                   !std::strcmp(argv[1], "eval") || !std::strcmp(argv[1], "tag")))
    return RunRedactTools(argc - 1, argv + 1);
  CLI::App app{"Desensitise text: every name, number and address found is replaced by a typed placeholder "
               "(⟦PHONE_1⟧) kept in a session vault; --restore puts the originals back into an answer. "
               "Subcommands: myriad redact corpus|train|eval|tag (the labelled corpus, the tagger, the figures)",
               "myriad redact"};
  std::vector<std::string> inputs;
  std::string vault_path;
  bool json = false, input_jsonl = false, restore = false;
  float min_confidence = edge::RedactorOptions{}.min_confidence;
  app.add_option("input", inputs, "text files (stdin when none, or -); with --restore one answer");
  app.add_flag("--json", json, "one JSON object per document: doc, spans (code points), redacted");
  app.add_flag("--input-jsonl", input_jsonl, "inputs hold one {\"text\": ...} object per line, each a document");
  app.add_option("--vault", vault_path, "session vault: loaded if present, saved after (placeholders stay consistent)");
  app.add_flag("--restore", restore, "restore the originals into an answer (needs --vault); exit 3 if one is unresolved");
  std::string tagger_dir;
  app.add_option("--tagger", tagger_dir, "the tagger of names, addresses and organisations (myriad redact train)");
  app.add_option("--min-confidence", min_confidence, "spans below this stay in the text")->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);
  if (restore) return RunRestore(inputs, vault_path);

  // Read everything first: a missing file fails before anything is written.
  if (inputs.empty()) inputs.push_back("-");
  std::vector<Doc> docs;
  for (const std::string& path : inputs) {
    Result<std::string> content = ReadInput(path);
    if (!content.ok()) return Fail(content.status().message(), 2);
    if (input_jsonl) {
      if (Status s = SplitJsonl(path, *content, &docs); !s.ok()) return Fail(s.message(), 2);
    } else {
      docs.push_back(Doc{path, std::move(*content)});
    }
  }
  edge::Vault vault;
  if (!vault_path.empty() && Env::Default()->FileExists(vault_path)) {
    Result<edge::Vault> v = edge::Vault::Load(vault_path);
    if (!v.ok()) return Fail(v.status().message(), 2);
    vault = std::move(*v);
  }

  std::unique_ptr<edge::Tagger> tagger;
  if (!tagger_dir.empty()) {
    auto t = edge::LoadTagger(tagger_dir);
    if (!t.ok()) return Fail("--tagger: " + t.status().message(), 2);
    tagger = std::move(t).value();
  }
  const edge::Redactor redactor(tagger.get(), edge::RedactorOptions{min_confidence});
  for (const Doc& d : docs) {
    const edge::Redaction r = redactor.Redact(d.text, &vault);
    if (!json) {
      std::fwrite(r.text.data(), 1, r.text.size(), stdout);
      if (input_jsonl) std::fputc('\n', stdout);
      continue;
    }
    const std::u32string cps = edge::DecodeUtf8(d.text);
    nlohmann::ordered_json spans = nlohmann::ordered_json::array();
    for (const edge::Span& s : r.spans)
      spans.push_back({{"start", s.start},
                       {"end", s.end},
                       {"type", edge::EntityTypeName(s.type)},
                       {"confidence", std::round(s.confidence * 1000.0) / 1000.0},
                       {"text", edge::EncodeUtf8(std::u32string_view(cps).substr(s.start, s.end - s.start))}});
    const nlohmann::ordered_json out = {{"doc", d.name}, {"spans", std::move(spans)}, {"redacted", r.text}};
    std::puts(out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  }
  std::fflush(stdout);
  if (!vault_path.empty()) {
    if (Status s = vault.Save(vault_path); !s.ok()) return Fail(s.message(), 1);
  }
  return 0;
}

}  // namespace myriad::cli
