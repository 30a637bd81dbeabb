// The DSA indexer's tile kernels that need an ISA of their own (internal to
// the CPU backend and backend/cpu/dsa/dsa_indexer.cc, which walks the tiles and picks
// these by cpuid). A tile is 64 keys; the int8 layout is [Dg][64][4] bytes,
// each the key's int8 value + 128 (the layout vpdpbusd reads), with one
// scale per key. Every kernel here computes the same bits as the portable
// one in backend/cpu/dsa/dsa_indexer.cc: the dot products are exact in int32, then
// t = fma(c[j], max(float(dot_j), 0), t) over the heads in order j and
// score = t * scale_k.
#pragma once

#include <cstdint>

namespace myriad::cpu::dsa {

constexpr int kIndexTile = 64;  // keys per tile

// One query row as the tile kernels take it.
struct IndexQueryRow {
  const float* qi;       // fp32: [Hi][Di]
  const float* w;        // fp32: [Hi]
  const int8_t* q8;      // int8: [Hi][Dg*4], zero-padded
  const float* c;        // int8: [Hi] w * scale_q
  const int32_t* corr;   // int8: [Hi] 128 * sum(q8): the +128 offset of the keys
};

// The rows of one task's block on one tile (first key s0): each row that
// sees more than K keys and key s0 appends the tile's keys at or above its
// tau among its n[r] - s0 visible ones to ckey/cidx + r * cap.
struct IndexTileRows {
  const IndexQueryRow* rows;
  const int* n;
  const uint32_t* tau;
  uint32_t* ckey;
  int32_t* cidx;
  int* count;
  int64_t cap;
  int nr, K;
};

// A uint32 that orders like the float (-0 canonicalised to +0).
[[gnu::always_inline]] inline uint32_t OrderedKey(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f + 0.f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// AVX2 + FMA (isa_avx2/dsa_index_avx2.cc). The int8 dots without VNNI:
// the key bytes xor 0x80 are the signed values k; vpmaddubsw(|k|,
// sign(q, k)) sums pairs of k*q in int16 (at most 2 * 127 * 127, no
// saturation), vpmaddwd against ones sums those pairs into int32.
// Candidates are kept by a compress through a 256-entry permutation table
// (no AVX-512 compress, no pdep: both are slow on some AVX2 cores).
// Collect/compact contracts: those of backend/cpu/dsa/dsa_indexer.cc's portable
// kernels; they write up to 8 entries past the count (buffers have room).
void TileScoresI8Avx2(const IndexQueryRow& r, const uint8_t* tile, const float* ks, int Hi, int Dg,
                      float* sc);
int TileCollectI8Avx2(const IndexQueryRow& r, const uint8_t* tile, const float* ks, int Hi, int Dg,
                      int valid, int s0, uint32_t tau, uint32_t* ckey, int32_t* cidx, int c);
void TileCollectRowsI8Avx2(const IndexTileRows& b, const uint8_t* tile, const float* ks, int Hi,
                           int Dg, int s0);
int CollectAvx2(const float* sc, int valid, int s0, uint32_t tau, uint32_t* ckey, int32_t* cidx,
                int c);
void CompactAvx2(const uint32_t* ck, const int32_t* ci, int c, uint32_t thr, int32_t* out);
// The K-th threshold contract of backend/cpu/dsa/dsa_indexer.cc (KthThreshold): scratch
// holds n + 8 entries and may be `key` itself when it can be overwritten.
uint32_t KthThresholdAvx2(const uint32_t* key, int n, int k, int* ge, uint32_t* scratch);

}  // namespace myriad::cpu::dsa
