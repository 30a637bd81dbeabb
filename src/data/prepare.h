// `myriad prepare`: corpus -> tokenizer + token shards + data.json.
//
// Steps, each logged to stderr with LOG_INFO:
//  1. gather the corpus: the built-in default corpus (LoadDefaultCorpus) or
//     every text file under input_dir (LoadFolderCorpus); optionally capped to
//     max_bytes, taking the same fraction of every source;
//  2. split documents into train and val by a seeded hash of each document's
//     text (stable when documents are added; identical documents always land
//     in the same split, so val never repeats train). Every source with at
//     least two documents gets at least one val document and one train document;
//  3. train the BPE tokenizer on the train documents -> out_dir/tokenizer.model
//     (and tokenizer.vocab), or use the one `tokenizer` names (an open
//     model's: a Hugging Face folder, its tokenizer.json or tokenizer.model;
//     Tokenizer::Load), which data.json then records by absolute path;
//  4. encode all documents on all cores, in chunks (memory stays bounded), and
//     append each as "tokens + eos" to out_dir/train_NNN.bin / val_NNN.bin,
//     starting a new shard every shard_max_tokens tokens;
//  5. write out_dir/data.json (tokenizer path, vocab size, bos/eos ids, counts
//     per split and per source, the options used).
//
// Shards and data.json from an earlier run in out_dir are removed first, and
// data.json is written last, atomically: a folder with data.json is complete.
// The output is a deterministic function of the corpus and the options.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace myriad {

struct PrepareOptions {
  std::string input_dir;               // empty = the built-in default corpus
  std::string out_dir = "data/default";
  int vocab_size = 4096;               // includes <unk>, <s>, </s> and 256 byte tokens
  std::string tokenizer;               // use this tokenizer instead of training one ("": train; vocab_size unused)
  double val_fraction = 0.02;          // in [0, 0.5]
  uint64_t seed = 1;
  int64_t max_bytes = 0;               // cap on corpus bytes; 0 = no cap
  // Tuning knobs; the defaults keep the default prepare within about a minute
  // on two cores.
  int num_threads = 0;                          // 0 = all cores
  uint64_t shard_max_tokens = 32ull << 20;      // tokens per shard file
  int64_t tokenizer_training_bytes = 6000000;   // sample cap for tokenizer training
};

Status RunPrepare(const PrepareOptions& options);

// The tokenizer of a prepared folder: data.json's "tokenizer" (relative to
// the folder, or absolute), else the folder's tokenizer.model (folders
// prepared before data.json named one).
std::string PreparedTokenizerPath(const std::string& data_dir);

}  // namespace myriad
