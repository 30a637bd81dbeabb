// The batched paged runner: one forward for a batch of sequences, each adding
// a chunk of new tokens (a prefill chunk, or one decode token). All new tokens
// of the batch go through the projections, the dense FFN and the MoE experts
// together (InferenceForward, the same code as InferenceSession); attention
// runs per sequence over its keys and values in paged KvPool blocks,
// addressed through the sequence's block table.
//
// Attention over pages: the sequence's blocks are gathered into contiguous
// per-thread scratch [Tk, Hkv*D] and the fused attention kernel runs once per
// sequence (the gather reads the same bytes the kernel reads anyway). A batch
// of decode tokens only runs its sequences' attention side by side, one per
// thread; a batch with a prefill chunk runs them one after another, each with
// the kernel's own threads.
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
};

class BatchRunner {
 public:
  // `model` and `pool` must outlive the runner.
  BatchRunner(const Model& model, KvPool* pool, WeightFormat fmt = WeightFormat::kF32);
  ~BatchRunner();
  // Writes the chunks' keys and values into their blocks and returns the
  // logits [chunks.size(), V] of each chunk's last token (valid until the
  // next call).
  const float* Forward(const std::vector<SeqChunk>& chunks);
  int64_t vocab() const { return weights_.config().vocab_size; }
  const InferenceWeights& weights() const { return weights_; }

 private:
  class PagedAttention;
  InferenceWeights weights_;
  KvPool* pool_;
  std::unique_ptr<PagedAttention> attn_;
  InferenceScratch scratch_;
  std::vector<int32_t> tokens_, pos_;
  std::vector<int64_t> out_rows_;
  std::vector<float> logits_;
};

}  // namespace myriad::serve
