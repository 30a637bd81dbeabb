// hf_tokenizer_ids: our side of the tokenizer parity test (tests/hf/tokenizer_parity.sh).
//
//   hf_tokenizer_ids TOKENIZER LINES OUT
//
// Loads TOKENIZER with myriad::Tokenizer::Load, reads LINES (one JSON string
// per line), and writes OUT: a header object {vocab_size, bos_id, adds_bos,
// eos_id}, then per line {"ids": Encode(line), "text": Decode(ids)}. Prints
// the encode speed on stderr (cold: the first pass, filling the word cache;
// warm: the second, which must give the same ids).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TOKENIZER LINES OUT\n", argv[0]);
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto tok = myriad::Tokenizer::Load(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().message().c_str());
    return 1;
  }
  const double load_s = Seconds(t0);
  std::vector<std::string> lines;
  {
    std::ifstream in(argv[2]);
    std::string raw;
    while (std::getline(in, raw)) lines.push_back(nlohmann::json::parse(raw).get<std::string>());
  }
  size_t bytes = 0;
  for (const auto& l : lines) bytes += l.size();

  std::vector<std::vector<int32_t>> ids(lines.size());
  size_t tokens = 0;
  t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < lines.size(); ++i) {
    ids[i] = tok->Encode(lines[i]);
    tokens += ids[i].size();
  }
  const double cold_s = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  size_t differ = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (tok->Encode(lines[i]) != ids[i] && differ == lines.size()) differ = i;
  }
  const double warm_s = Seconds(t0);
  if (differ < lines.size()) {
    std::fprintf(stderr, "%s: line %zu encodes differently the second time (word cache)\n", argv[1], differ + 1);
    return 1;
  }

  std::ofstream out(argv[3]);
  out << nlohmann::json{{"vocab_size", tok->vocab_size()},
                        {"bos_id", tok->bos_id()},
                        {"adds_bos", tok->adds_bos()},
                        {"eos_id", tok->eos_id()}}
             .dump()
      << "\n";
  for (size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json row{{"ids", ids[i]}, {"text", tok->Decode(ids[i])}};
    out << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  out.close();
  if (!out) {
    std::fprintf(stderr, "%s: cannot write\n", argv[3]);
    return 1;
  }
  std::fprintf(stderr,
               "%s: load %.2fs; %zu lines, %zu bytes, %zu tokens; encode cold %.0f lines/s %.2fM tokens/s "
               "%.1f MB/s, warm %.0f lines/s %.2fM tokens/s %.1f MB/s (one thread)\n",
               argv[1], load_s, lines.size(), bytes, tokens, lines.size() / cold_s, tokens / cold_s / 1e6,
               bytes / cold_s / 1e6, lines.size() / warm_s, tokens / warm_s / 1e6, bytes / warm_s / 1e6);
  return 0;
}
