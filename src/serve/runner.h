// The batched paged runner: one forward for a batch of sequences, each adding
// a chunk of new tokens (a prefill chunk, or one decode token). All new tokens
// of the batch go through the projections, the dense FFN and the MoE experts
// together (InferenceForward, the same code as InferenceSession); attention
// runs per sequence over its keys and values in paged KvPool blocks,
// addressed through the sequence's block table.
//
// Attention over pages: each layer first stores the new keys and values in
// their blocks, then one backend paged_attention call
// (ops::PagedAttention) serves every sequence of the batch, reading K and V
// in place through the block tables; its work items (sequence, query
// positions, kv heads) spread over the threads whatever the batch's mix of
// prefill chunks and decode tokens. AttentionPath::kGather keeps the former
// path as a reference for tests and benchmarks: each sequence's blocks are
// gathered into contiguous per-thread scratch and attention_fwd runs once
// per sequence (side by side, one per thread, for a batch of decode tokens;
// one after another otherwise). DSA models take the paged op's sparse mode:
// the first layer of each sharing group selects every new row's keys with
// the indexer (over the sequence's indexer keys, read in place through the
// block table: IndexerParams::ki_blocks), and each layer of the group attends to them through
// the block table; under kGather they take DsaAttend over gathered caches.
//
// Not thread-safe: one thread (the engine's scheduler) calls Forward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/inference.h"
#include "serve/kv_pool.h"

namespace myriad::serve {

struct SeqChunk {
  const int32_t* tokens = nullptr;  // the new tokens [n]
  int64_t n = 0;
  int64_t start = 0;                // position of tokens[0]; KV of [0, start) is in the blocks
  const int32_t* blocks = nullptr;  // block table: block i holds positions [16i, 16i+16)
  int64_t n_blocks = 0;             // must cover [0, start + n)
  bool all_logits = false;          // the logits of every new token (a draft's verification), not only the last
};

// How dense attention reads the pool (see above).
enum class AttentionPath { kPaged, kGather };

class BatchRunner {
 public:
  // `model` and `pool` must outlive the runner.
  BatchRunner(const Model& model, KvPool* pool, WeightFormat fmt = WeightFormat::kF32,
              AttentionPath path = AttentionPath::kPaged);
  ~BatchRunner();
  // Writes the chunks' keys and values into their blocks and returns the
  // logits of each chunk's last token, or of all its tokens with
  // all_logits, chunk after chunk: chunk i's first row is logits_row(i)
  // (valid until the next call). With `hidden`, also every new token's
  // hidden state as MTP drafts read it (InferenceForward's), chunk i's rows
  // from hidden_row(i).
  const float* Forward(const std::vector<SeqChunk>& chunks, bool hidden = false);
  int64_t logits_row(size_t i) const { return logits_row_[i]; }
  const float* hidden_row(size_t i) const { return hidden_.data() + row0_[i] * weights_.config().d_model; }
  int64_t vocab() const { return weights_.config().vocab_size; }
  const InferenceWeights& weights() const { return weights_; }
  // The model's selection biases changed in place (Engine::WeightsChanged).
  void RefreshBiases() { weights_.RefreshBiases(); }

 private:
  class PoolAttention;
  InferenceWeights weights_;
  KvPool* pool_;
  std::unique_ptr<PoolAttention> attn_;
  InferenceScratch scratch_;
  std::vector<int32_t> tokens_, pos_;
  std::vector<int64_t> row0_, out_rows_, logits_row_;  // each chunk's first row, the rows with logits
  std::vector<float> logits_, hidden_;
};

}  // namespace myriad::serve
