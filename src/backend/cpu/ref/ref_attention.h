// Scalar reference attention (internal to cpu/ref): materialises the full
// score matrix per (b, h), accumulates in double. Used only as a test oracle.
#pragma once
#include "backend/backend.h"

namespace myriad::ref {
void AttentionFwd(const AttentionParams& p);
void AttentionBwd(const AttentionBackwardParams& p);
// Paged attention: each score addressed through the block table, in double.
void PagedAttention(const PagedAttentionParams& p);
}  // namespace myriad::ref
