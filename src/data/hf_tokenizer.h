// Hugging Face tokenizer.json files with a byte-level BPE model (internal to
// src/data; callers use myriad::Tokenizer, data/tokenizer.h).
//
// Supported, with the semantics of Hugging Face's `tokenizers` library:
//   model           BPE: vocab, merges ("a b" strings or ["a", "b"] pairs),
//                   ignore_merges; dropout null, no subword prefix/suffix
//   normalizer      null, NFC, NFD, NFKC, NFKD, a Sequence of them (utf8proc)
//   pre_tokenizer   ByteLevel (add_prefix_space, use_regex: GPT-2's pattern),
//                   or a Sequence of Split (Regex or String pattern, any
//                   behavior, invert) and Digits, ending in ByteLevel
//   added_tokens    split out of the text first, leftmost-longest; those
//                   with normalized=false (and all when there is no
//                   normalizer) before normalization, the others after it;
//                   lstrip/rstrip; special ones marked (is_special)
//   post_processor  null, ByteLevel, TemplateProcessing whose single template
//                   is [one special token] $A (reported as adds_bos/bos_id),
//                   a Sequence of them
//   decoder         ByteLevel
// Everything else (WordPiece, Unigram, Metaspace, Replace, BertProcessing,
// single_word added tokens, templates that append tokens, ...) is refused
// with one line: `<path>: <what> is not supported (supported: ...)`.
// truncation and padding are batch settings and are ignored.
//
// Beyond Hugging Face, whose input is always valid UTF-8: a malformed byte
// becomes its byte-level token, so every byte string encodes losslessly.
//
// The vocabulary must have a token for each of the 256 byte-level
// characters (GPT-2's bytes_to_unicode); every merge's parts and result must
// be tokens (as Hugging Face requires).
#pragma once

#include <string>

#include "core/status.h"
#include "data/tokenizer_backend.h"

namespace myriad {

// Loads `path`; `config` is the folder's tokenizer_config.json (bos/eos
// names, which tokenizer.json does not carry).
Result<TokenizerParts> LoadHfTokenizerJson(const std::string& path, const HfTokenizerConfig& config);

}  // namespace myriad
