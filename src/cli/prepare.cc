// myriad prepare [--input DIR] [--out DIR] [--vocab N | --tokenizer PATH]: tokenizer + token shards.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/verbs.h"
#include "data/prepare.h"

namespace myriad::cli {

int RunPrepare(int argc, char** argv) {
  CLI::App app{"Train a SentencePiece BPE tokenizer (or use --tokenizer) and write token shards with a validation split. "
               "Without --input, uses the built-in corpus (English and Chinese fortunes, Python sources).",
               "myriad prepare"};
  PrepareOptions o;
  app.add_option("--input,-i", o.input_dir, "folder of text files (default: the built-in corpus)");
  app.add_option("--out,-o", o.out_dir, "output folder")->capture_default_str();
  app.add_option("--vocab", o.vocab_size, "tokenizer vocabulary size")->capture_default_str()->check(CLI::Range(256, 1 << 20));
  app.add_option("--tokenizer", o.tokenizer,
                 "use this tokenizer instead of training one: an open model's (a Hugging Face folder, its "
                 "tokenizer.json or tokenizer.model), to fine-tune that model on the data");
  app.add_option("--val-fraction", o.val_fraction, "share of documents held out")->capture_default_str()->check(CLI::Range(0.0, 0.5));
  app.add_option("--seed", o.seed, "split and sampling seed")->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "cap on corpus bytes (0 = none)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  Status s = RunPrepare(o);
  if (!s.ok()) {
    std::fprintf(stderr, "myriad prepare: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace myriad::cli
