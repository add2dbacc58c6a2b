// fa3's kernel body replayed on the SM90 emulator (fa3_replay_test.cc's setting), counted: what
// each warpgroup loads, copies and stores, with which L2 hints, in how many shared-memory
// wavefronts, and how the paged rows are located — the structure issue 22 asks for, each count
// shown to fail on the structure before it (docs/cuda.md).

#include "cuda/fa3/fa3_replay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/capability.h"
#include "core/numeric.h"
#include "cuda/common/case_spec.h"
#include "cuda/common/fast_div.h"
#include "cuda/fa3/capability.h"
#include "cuda/fa3/fa3_emu_ops.h"
#include "cuda/fa3/fa3_replay_test_util.h"
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/kernel_keys.h"
#include "cuda/fa3/kernels/prefill_cta.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"
#include "testing/variants.h"

namespace kvattn::fa3 {
namespace {

// The L2 hints (kernels/l2_hint.h), counted over the replay: every K/V load (TMA box, cp.async,
// the FP8 producer's V rows) evict_last, every Q row evict_first (the Q warp's cp.async into the
// Q tiles; the consumers load nothing), none left unhinted (the cases' rows are in 16-byte
// chunks), on the TMA (ragged, every type) and cp.async (paged: page 16) paths.
TEST(Fa3ReplayCounters, KvLoadsEvictLastQLoadsEvictFirst) {
  using emu::LoadKind;
  emu::ReplayCounters& c = emu::replay_counters();
  for (const KernelKey& key : kCiKeys) {
    for (Op op : {Op::kBatchPrefillRagged, Op::kBatchPrefillPaged, Op::kBatchDecode}) {
      const std::string what = std::string(op_name(op)) + "/" + kernel_key_string(key);
      c.reset();
      expect_matches(spec_for(key, op, {70, 1}, {130, 65}), what);
      int64_t kv_last = 0;
      for (LoadKind k : {LoadKind::kTmaBox, LoadKind::kCpAsync, LoadKind::kLd16Producer,
                         LoadKind::kLd8Producer}) {
        EXPECT_EQ(c.count(k, L2Hint::kNormal), 0) << what << " load kind " << int(k);
        EXPECT_EQ(c.count(k, L2Hint::kEvictFirst), 0) << what << " load kind " << int(k);
        kv_last += c.count(k, L2Hint::kEvictLast);
      }
      EXPECT_GT(kv_last, 0) << what;
      EXPECT_EQ(c.count(LoadKind::kCpAsyncQ, L2Hint::kNormal), 0) << what;
      EXPECT_EQ(c.count(LoadKind::kCpAsyncQ, L2Hint::kEvictLast), 0) << what;
      EXPECT_GT(c.count(LoadKind::kCpAsyncQ, L2Hint::kEvictFirst), 0) << what;
      for (L2Hint h : {L2Hint::kNormal, L2Hint::kEvictFirst, L2Hint::kEvictLast}) {
        EXPECT_EQ(c.count(LoadKind::kLd16Consumer, h), 0) << what << ": a consumer loads Q";
      }
      if (op == Op::kBatchPrefillRagged) {
        EXPECT_GT(c.count(LoadKind::kTmaBox, L2Hint::kEvictLast), 0) << what << ": TMA path";
      }
      if (op == Op::kBatchPrefillPaged) {
        EXPECT_GT(c.count(LoadKind::kCpAsync, L2Hint::kEvictLast), 0) << what << ": cp.async path";
      }
    }
  }
}

// The next tile's Q is loaded by the producer behind its own barriers (prefill_cta.h's
// produce_q, full_q / empty_q): over the replay, the consumer warpgroups load nothing from global
// memory and copy nothing into a Q tile (they only stage O there in the epilogue), and the
// producer's Q warp copies exactly the Q rows the tile lists name (ReplayCounters::q_rows: 64 per
// computing consumer warpgroup per tile, zeros past qo_len) by cp.async, rows x row bytes, every
// one evict_first; no TMA box lands in a Q tile. Prefill on the TMA path (ragged) and the
// cp.async path (paged, page 16), split prefill (tiles of a request in chunks), and decode of a
// group of 2 (one computing consumer warpgroup: the Q warp loads for the first alone) and of 80
// (two), on bf16 and e4m3 d128 (the CI keys), f16 d64 and e4m3 (192, 128); every case against the
// reference. Rows not in 16-byte chunks (gathered by the Q warp) are counted by
// Fa3ReplayLayouts.StridedAndMisalignedTensorsRunWhereAutoPicksFa3.
TEST(Fa3ReplayCounters, QLoadedByTheProducer) {
  using emu::LoadKind;
  using emu::SmemTile;
  emu::ReplayCounters& c = emu::replay_counters();
  const KernelKey keys[] = {kBf16D128,
                            kE4m3D128,
                            {DType::kF16, DType::kF16, 64, 64},
                            {DType::kE4M3, DType::kE4M3, 192, 128}};
  struct Shape {
    Op op;
    std::vector<int64_t> qo, kv;
    int qo_heads, kv_heads;
    int page_size;      // paged ops; 0: the spec's
    int64_t kv_chunk;   // ReplayOptions::kv_chunk_size; 0: none
    const char* name;
  };
  const Shape shapes[] = {
      {Op::kBatchPrefillRagged, {70, 130}, {130, 200}, 4, 2, 0, 0, "ragged prefill"},
      {Op::kBatchPrefillPaged, {3, 70}, {50, 300}, 4, 2, 16, 0, "paged prefill, page 16"},
      {Op::kBatchPrefillRagged, {20}, {600}, 2, 2, 0, 256, "prefill split in chunks"},
      {Op::kBatchDecode, {1, 1, 1}, {40, 300, 129}, 4, 2, 0, 0, "decode, group 2"},
      {Op::kBatchDecode, {1}, {200}, 80, 1, 0, 0, "decode, group 80"},
  };
  for (const KernelKey& key : keys) {
    const int64_t row_bytes = key.head_dim_qk * (is_fp8(key.q) ? 1 : 2);
    for (const Shape& sh : shapes) {
      testing::CaseSpec s = spec_for(key, sh.op, sh.qo, sh.kv, sh.qo_heads, sh.kv_heads);
      if (sh.page_size > 0) s.problem.page_size = sh.page_size;
      if (!is_decode(sh.op)) s.problem.mask_mode = MaskMode::kCausal;
      if (!declared(s.problem)) continue;
      const std::string what = std::string(sh.name) + "/" + kernel_key_string(key);
      ReplayOptions o;
      if (sh.kv_chunk > 0) o.kv_chunk_size = sh.kv_chunk;
      c.reset();
      expect_matches(s, what, o);
      std::printf(
          "[ counters ] %s: %lld Q rows; producer %lld bytes by cp.async, %lld stored; consumers "
          "%lld / %lld bytes loaded from global memory, %lld / %lld copied into Q\n",
          what.c_str(), static_cast<long long>(c.q_rows.load()),
          static_cast<long long>(c.q_tile_async_bytes[0].load()),
          static_cast<long long>(c.q_tile_stored_bytes[0].load()),
          static_cast<long long>(c.global_load_bytes[1].load()),
          static_cast<long long>(c.global_load_bytes[2].load()),
          static_cast<long long>(c.q_tile_async_bytes[1].load()),
          static_cast<long long>(c.q_tile_async_bytes[2].load()));
      ASSERT_GT(c.q_rows, 0) << what;
      for (int wg : {1, 2}) {
        EXPECT_EQ(c.global_load_bytes[wg], 0) << what << ": consumer warpgroup " << wg
                                              << " loads from global memory";
        EXPECT_EQ(c.q_tile_async_bytes[wg], 0) << what << ": consumer warpgroup " << wg;
      }
      EXPECT_EQ(c.q_tile_async_bytes[0], c.q_rows * row_bytes)
          << what << ": the producer's Q copies are not every tile's rows once";
      EXPECT_EQ(c.q_tile_stored_bytes[0], 0) << what;
      EXPECT_EQ(c.copies(SmemTile::kQ, LoadKind::kTmaBox), 0) << what;
      EXPECT_EQ(c.count(LoadKind::kCpAsyncQ, L2Hint::kEvictFirst), c.q_rows * row_bytes / 16)
          << what;
    }
  }
}

// Paged K/V rows are located once per row of each block copied (prefill_cta.h's for_each_chunk:
// one lane per row takes the page division and the page-table load, the row's chunks take its
// address by shuffles), not once per 16-byte chunk: the replay counts the page divisions
// (ops.fast_div) against the rows copied, 2 x blocks x BN (a K and a V block each). The rows are
// found from the chunks copied: every row's kRowChunks cp.async (16-bit K and V, FP8 K; FP8 V
// rows are loaded into registers in 8-byte pieces, two a chunk). Keys of every row shape: K rows
// of 4 to 32 chunks (12 and 24 at head dim 192: rows across a warp's steps), blocks of 128 and 64
// keys.
// Ragged (contiguous) K/V divide nothing. Locating per chunk, as before, divided kRowChunks
// (4 to 32) times as often as this allows.
TEST(Fa3ReplayCounters, PagedRowsAreLocatedOncePerBlock) {
  using emu::LoadKind;
  emu::ReplayCounters& c = emu::replay_counters();
  const KernelKey keys[] = {kBf16D128,
                            kE4m3D128,
                            {DType::kBF16, DType::kBF16, 192, 128},
                            {DType::kE4M3, DType::kE4M3, 192, 128},
                            {DType::kBF16, DType::kBF16, 256, 256},
                            {DType::kE4M3, DType::kE4M3, 64, 64}};
  for (const KernelKey& key : keys) {
    const bool fp8 = is_fp8(key.kv);
    const int64_t k_chunks = key.head_dim_qk * (fp8 ? 1 : 2) / 16;
    const int64_t v_chunks = key.head_dim_vo * (fp8 ? 1 : 2) / 16;
    for (Op op : {Op::kBatchPrefillPaged, Op::kBatchDecode}) {
      for (int page_size : {1, 7, 16}) {
        const std::string what = std::string(op_name(op)) + " page " + std::to_string(page_size) +
                                 " " + kernel_key_string(key);
        c.reset();
        testing::CaseSpec s = spec_for(key, op, {3, 70}, {50, 300});
        s.problem.page_size = page_size;
        s.problem.mask_mode = MaskMode::kCausal;
        expect_matches(s, what);
        const int64_t cp_async = c.count(LoadKind::kCpAsync, L2Hint::kEvictLast);
        const int64_t block_rows = cp_async / (fp8 ? k_chunks : k_chunks + v_chunks);
        const int64_t chunks = cp_async + c.count(LoadKind::kLd8Producer, L2Hint::kEvictLast) / 2;
        const int64_t divisions = c.fast_divs;
        std::printf("[ counters ] %s: %lld page divisions for %lld chunks of %lld rows\n",
                    what.c_str(), static_cast<long long>(divisions), static_cast<long long>(chunks),
                    static_cast<long long>(2 * block_rows));
        ASSERT_GT(block_rows, 0) << what;
        EXPECT_GT(divisions, 0) << what;
        EXPECT_LE(divisions, 2 * block_rows) << what << ": more than one division per row";
      }
    }
    c.reset();
    expect_matches(spec_for(key, Op::kBatchPrefillRagged, {3, 70}, {50, 300}),
                   "ragged " + kernel_key_string(key));
    EXPECT_EQ(c.fast_divs, 0) << "ragged " << kernel_key_string(key);
  }
}

// The FP8 producer's V^T stores (prefill_cta.h's copy_v_transposed for the paged rows of page 7,
// stage_v_transposed for ragged V staged by TMA; v_transpose.h) are free of bank conflicts:
// over the replay, every warp-wide st.shared into a V slot takes the fewest
// wavefronts its width allows (smem_banks.h's model: one for a 32-bit store), at every FP8 V
// block shape (128 keys x 64 / 128 dims, 64 keys x 256 dims), paged, ragged and decode, with keys
// past kv_len in the last block. The byte-by-byte transpose before took 8 per one-byte store.
// The consumers' Q stores (16 bytes a lane, 4 phases) are printed, not checked: FP8 Q rows of 64
// and 192 bytes (padded to whole 128-byte panels) put two rows in a phase, 2-way conflicts in
// some phases (1,024 wavefronts for 512 at e4m3 d64 paged prefill).
TEST(Fa3ReplayWavefronts, Fp8VTransposeStoresAreConflictFree) {
  emu::ReplayCounters& c = emu::replay_counters();
  const KernelKey keys[] = {{DType::kE4M3, DType::kE4M3, 64, 64},
                            kE4m3D128,
                            {DType::kE4M3, DType::kE4M3, 192, 128},
                            {DType::kE4M3, DType::kE4M3, 256, 256}};
  for (const KernelKey& key : keys) {
    for (Op op : {Op::kBatchPrefillPaged, Op::kBatchPrefillRagged, Op::kBatchDecode}) {
      const std::string what = std::string(op_name(op)) + "/" + kernel_key_string(key);
      c.reset();
      testing::CaseSpec s = spec_for(key, op, {3, 70}, {50, 200});
      s.problem.page_size = 7;
      s.problem.mask_mode = MaskMode::kCausal;
      expect_matches(s, what);
      const auto& v = c.stores[int(emu::SmemTile::kV)];
      const auto& q = c.stores[int(emu::SmemTile::kQ)];
      std::printf(
          "[ counters ] %s: V^T stores %lld instructions, %lld wavefronts (fewest %lld); "
          "Q stores %lld, %lld wavefronts (fewest %lld)\n",
          what.c_str(), static_cast<long long>(v.instructions.load()),
          static_cast<long long>(v.wavefronts.load()),
          static_cast<long long>(v.min_wavefronts.load()),
          static_cast<long long>(q.instructions.load()),
          static_cast<long long>(q.wavefronts.load()),
          static_cast<long long>(q.min_wavefronts.load()));
      EXPECT_GT(v.instructions, 0) << what;
      EXPECT_EQ(v.divergent, 0) << what << ": the lanes of a warp stored differently";
      EXPECT_EQ(v.wavefronts, v.min_wavefronts) << what << ": bank conflicts in the V transpose";
      EXPECT_EQ(v.min_wavefronts, v.instructions) << what << ": one wavefront per 32-bit store";
      EXPECT_EQ(q.divergent, 0) << what;
    }
  }
}

// K/V blocks by TMA where the tensors allow it (rows in 16-byte chunks; dense and ragged of
// fewer than 2^31 tokens, or paged with a page size that is a multiple of the K/V block:
// kernel_params.cc), FP8 included: over the replay, every K block the tile lists name
// (ReplayCounters::kv_blocks, from the plan) lands in the K ring as one TMA box per 128-byte panel
// of its rows (FP8 rows of 64 and 192 bytes: a box reaching past the head dim, zero-filled), and
// no cp.async chunk and no thread's store lands there. 16-bit V likewise. FP8 V's boxes land in
// the staging ring (SmemPlan::v_stage), which no thread stores to, and the producer transposes it
// into the V ring (prefill_cta.h's stage_v_transposed): no box and no cp.async there, its
// ld.shared of the staged rows and its st.shared of V^T each one wavefront per phase (no bank
// conflict: smem_banks.h's model). Pages of another size keep the cp.async path (every chunk of
// every row of every K block, no box anywhere). Both layouts; the results against the reference.
// Before (main at 52bb20b), FP8 K and V came by the producer's threads (0 boxes, BN x QK / 16
// cp.async chunks a K block, V through 8-byte global loads), and pages by cp.async at every type.
TEST(Fa3ReplayCounters, KvLoadedByTma) {
  using emu::LoadKind;
  using emu::SmemTile;
  emu::ReplayCounters& c = emu::replay_counters();
  const KernelKey keys[] = {{DType::kE4M3, DType::kE4M3, 64, 64},
                            kE4m3D128,
                            {DType::kE5M2, DType::kE4M3, 192, 128},
                            {DType::kE4M3, DType::kE5M2, 256, 256},
                            kBf16D128};
  for (const KernelKey& key : keys) {
    const bool fp8 = is_fp8(key.kv);
    const int eb = fp8 ? 1 : 2;
    const int block_n = tile_shape(key.head_dim_qk, key.head_dim_vo, eb).block_n;
    const int64_t k_panels = smem::padded_row_bytes(key.head_dim_qk * eb) / smem::kRowBytes;
    const int64_t v_panels = smem::padded_row_bytes(key.head_dim_vo * eb) / smem::kRowBytes;
    struct Layout {
      Op op;
      KVLayout layout;
      int page_size;  // paged ops
      bool tma;
    };
    const Layout layouts[] = {{Op::kBatchPrefillRagged, KVLayout::kNHD, 0, true},
                              {Op::kSinglePrefill, KVLayout::kNHD, 0, true},
                              {Op::kSinglePrefill, KVLayout::kHND, 0, true},
                              {Op::kSingleDecode, KVLayout::kNHD, 0, true},
                              {Op::kBatchPrefillPaged, KVLayout::kNHD, 2 * block_n, true},
                              {Op::kBatchDecode, KVLayout::kHND, block_n, true},
                              {Op::kBatchPrefillPaged, KVLayout::kHND, block_n * 3 / 2, false},
                              {Op::kBatchPrefillPaged, KVLayout::kNHD, 16, false}};
    for (const Layout& l : layouts) {
      const std::string what = std::string(op_name(l.op)) + "/" +
                               (l.layout == KVLayout::kHND ? "HND" : "NHD") + "/page " +
                               std::to_string(l.page_size) + "/" + kernel_key_string(key);
      c.reset();
      const bool decode = l.op == Op::kSingleDecode || l.op == Op::kBatchDecode;
      const std::vector<int64_t> qo =
          decode ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{3, 70};
      testing::CaseSpec s = is_batch(l.op) ? spec_for(key, l.op, qo, {50, 300})
                                           : spec_for(key, l.op, {decode ? 1 : 37}, {150});
      s.problem.mask_mode = decode ? MaskMode::kNone : MaskMode::kCausal;
      s.problem.kv_layout = l.layout;
      if (l.page_size > 0) s.problem.page_size = l.page_size;
      expect_matches(s, what);
      const int64_t blocks = c.kv_blocks;
      const auto copies = [&](SmemTile t, LoadKind k) { return c.copies(t, k); };
      const auto& stage_loads = c.smem_loads[int(SmemTile::kVStage)];
      const auto& v_stores = c.stores[int(SmemTile::kV)];
      std::printf(
          "[ counters ] %s: %lld K/V blocks; K: %lld TMA boxes, %lld cp.async chunks; V: %lld "
          "boxes staged, %lld into V; staged V read in %lld ld.shared, %lld wavefronts (fewest "
          "%lld)\n",
          what.c_str(), static_cast<long long>(blocks),
          static_cast<long long>(copies(SmemTile::kK, LoadKind::kTmaBox)),
          static_cast<long long>(copies(SmemTile::kK, LoadKind::kCpAsync)),
          static_cast<long long>(copies(SmemTile::kVStage, LoadKind::kTmaBox)),
          static_cast<long long>(copies(SmemTile::kV, LoadKind::kTmaBox)),
          static_cast<long long>(stage_loads.instructions.load()),
          static_cast<long long>(stage_loads.wavefronts.load()),
          static_cast<long long>(stage_loads.min_wavefronts.load()));
      ASSERT_GT(blocks, 0) << what;
      EXPECT_EQ(c.stores[int(SmemTile::kK)].instructions, 0) << what << ": stores into K";
      EXPECT_EQ(c.stores[int(SmemTile::kVStage)].instructions, 0) << what;
      EXPECT_EQ(copies(SmemTile::kQ, LoadKind::kTmaBox), 0) << what;
      EXPECT_EQ(copies(SmemTile::kOther, LoadKind::kTmaBox), 0) << what;
      if (!l.tma) {
        EXPECT_EQ(copies(SmemTile::kK, LoadKind::kTmaBox), 0) << what;
        EXPECT_EQ(copies(SmemTile::kV, LoadKind::kTmaBox), 0) << what;
        EXPECT_EQ(copies(SmemTile::kVStage, LoadKind::kTmaBox), 0) << what;
        EXPECT_EQ(stage_loads.instructions, 0) << what;
        EXPECT_EQ(copies(SmemTile::kK, LoadKind::kCpAsync),
                  blocks * block_n * key.head_dim_qk * eb / 16)
            << what;
        continue;
      }
      EXPECT_EQ(copies(SmemTile::kK, LoadKind::kCpAsync), 0) << what << ": K by cp.async";
      EXPECT_EQ(copies(SmemTile::kV, LoadKind::kCpAsync), 0) << what << ": V by cp.async";
      EXPECT_EQ(copies(SmemTile::kK, LoadKind::kTmaBox), blocks * k_panels)
          << what << ": K not one box per panel per block";
      if (!fp8) {
        EXPECT_EQ(copies(SmemTile::kV, LoadKind::kTmaBox), blocks * v_panels) << what;
        continue;
      }
      EXPECT_EQ(copies(SmemTile::kVStage, LoadKind::kTmaBox), blocks * v_panels)
          << what << ": V not one staged box per panel per block";
      EXPECT_EQ(copies(SmemTile::kV, LoadKind::kTmaBox), 0) << what;
      EXPECT_EQ(c.count(LoadKind::kLd8Producer, L2Hint::kEvictLast), 0)
          << what << ": V rows loaded by the producer's threads";
      EXPECT_GT(stage_loads.instructions, 0) << what;
      EXPECT_EQ(stage_loads.divergent, 0) << what;
      EXPECT_EQ(stage_loads.wavefronts, stage_loads.min_wavefronts)
          << what << ": bank conflicts reading the staged V";
      EXPECT_GT(v_stores.instructions, 0) << what;
      EXPECT_EQ(v_stores.divergent, 0) << what;
      EXPECT_EQ(v_stores.wavefronts, v_stores.min_wavefronts) << what << ": V^T store conflicts";
    }
  }
}

// kv_row's page division: FastDiv's for keys below 2^32 (counted), a 64-bit division past them,
// both exact: page kv_indices[kv_first + key / page_size], slot key % page_size. (kv_first is
// set so that the page-table entry read is always the second: the keys are of requests of more
// than 2^32 keys.)
TEST(Fa3KvRow, KeysPast32BitsTakeTheWideDivision) {
  struct DivOps {
    mutable int divisions = 0;
    uint32_t fast_div(const cuda::FastDiv& d, uint32_t n) const {
      ++divisions;
      return d.div(n);
    }
  };
  const int32_t pages[] = {3, 5, 9};
  const paged::CacheStrides strides{1000, 10, 1, 1};
  std::vector<uint8_t> cache(2 * 10000);
  PrefillParams p;
  p.paged = true;
  p.kv_indices = pages;
  for (uint32_t page_size : {1u, 7u, 16u, 1000u}) {
    p.page_div = cuda::FastDiv(page_size);
    for (int64_t key : {int64_t(0), int64_t(UINT32_MAX) - 1, int64_t(UINT32_MAX),
                        int64_t(UINT32_MAX) + 1, int64_t(UINT32_MAX) + 12345, int64_t(1) << 40}) {
      RequestInfo r;
      r.kv_first = 1 - key / page_size;
      const DivOps ops;
      const uint8_t* row = kv_row<2>(ops, p, r, cache.data(), strides, key, 1);
      const int64_t expected = (5 * 1000 + (key % page_size) * 10 + 1) * 2;
      EXPECT_EQ(row - cache.data(), expected) << key << " / " << page_size;
      EXPECT_EQ(ops.divisions, key <= int64_t(UINT32_MAX) ? 1 : 0) << key << " / " << page_size;
    }
  }
}

// Tiles of 64 rows on one consumer warpgroup (params.h's consumer_warpgroups): decode of a GQA
// group of 4 (4 packed rows a tile: the second warpgroup's rows are all padding) issues no wgmma
// on warpgroup 2; a prefill batch of 70 and 1 query tokens needs it (the 70-row tile's last 6
// rows), as does decode with a group of 80. Before, both consumer warpgroups computed every tile.
TEST(Fa3ReplayCounters, AWarpgroupWithoutRowsIssuesNoWgmma) {
  emu::ReplayCounters& c = emu::replay_counters();
  struct Case {
    Op op;
    std::vector<int64_t> qo, kv;
    int qo_heads, kv_heads;
    bool second_idle;
  };
  const Case cases[] = {{Op::kBatchDecode, {1, 1, 1}, {300, 65, 129}, 8, 2, true},
                        {Op::kBatchPrefillRagged, {70, 1}, {130, 65}, 4, 2, false},
                        {Op::kBatchDecode, {1, 1}, {200, 70}, 80, 1, false}};
  for (const KernelKey& key : kCiKeys) {
    for (const Case& k : cases) {
      const std::string what = std::string(op_name(k.op)) + " qo " + std::to_string(k.qo[0]) +
                               " heads " + std::to_string(k.qo_heads) + "/" +
                               std::to_string(k.kv_heads) + " " + kernel_key_string(key);
      c.reset();
      testing::CaseSpec s = spec_for(key, k.op, k.qo, k.kv, k.qo_heads, k.kv_heads);
      s.problem.mask_mode = MaskMode::kCausal;
      expect_matches(s, what);
      const int64_t wg1 = c.wgmma[1], wg2 = c.wgmma[2];
      std::printf("[ counters ] %s: wgmma per consumer warpgroup %lld / %lld\n", what.c_str(),
                  static_cast<long long>(wg1), static_cast<long long>(wg2));
      EXPECT_EQ(c.wgmma[0], 0) << what << ": the producer issues no wgmma";
      EXPECT_GT(wg1, 0) << what;
      if (k.second_idle) {
        EXPECT_EQ(wg2, 0) << what << ": warpgroup 2 has no row of any tile";
      } else {
        EXPECT_GT(wg2, 0) << what;
        EXPECT_LE(wg2, wg1) << what;
      }
    }
  }
}

// The epilogue's global stores of O (epilogue.h) are 16-byte vectors, whole rows of them: the
// replay counts every store of an output or partial row (fa3_emu_ops.h's output_stores()), and
// their bytes must be the rows' bytes exactly, with no narrower store, for every output type:
// ragged prefill (a 70-row tile: rows past qo_len not written), decode of GQA groups of 4 packed
// in a tile (heads past the group not written), and a decode split into 3 chunks of 128 keys
// (f32 partial rows, then the merge). Before, every element was stored on its own. The CI keys;
// every key with the full grid (each head dims' staging passes: epilogue.h).
TEST(Fa3ReplayCounters, OutputRowsAreStoredIn16ByteVectors) {
  emu::OutputStores& st = emu::output_stores();
  struct Case {
    Op op;
    std::vector<int64_t> qo, kv;
    int qo_heads, kv_heads;
    int64_t chunk, partial_rows;  // forced split chunk; rows of f32 partial states it writes
  };
  const Case cases[] = {{Op::kBatchPrefillRagged, {70, 1}, {130, 65}, 4, 2, 0, 0},
                        {Op::kBatchDecode, {1, 1}, {200, 70}, 8, 2, 0, 0},
                        {Op::kBatchDecode, {1}, {300}, 8, 2, 128, 3 * 8}};
  for (const KernelKey& key : grid_keys()) {
    for (DType o_dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (const Case& k : cases) {
        if (k.chunk > 0 && o_dtype != DType::kBF16) continue;  // partial rows are f32 anyway
        testing::CaseSpec s = spec_for(key, k.op, k.qo, k.kv, k.qo_heads, k.kv_heads);
        s.problem.o_dtype = o_dtype;
        s.problem.mask_mode = MaskMode::kCausal;
        const std::string what = std::string(op_name(k.op)) + " out " +
                                 std::string(dtype_name(o_dtype)) + (k.chunk > 0 ? " split" : "") +
                                 " " + kernel_key_string(key);
        ASSERT_TRUE(declared(s.problem)) << what;
        ReplayOptions o;
        o.kv_chunk_size = k.chunk;
        st.reset();
        expect_matches(s, what, o);
        int64_t tokens = 0;
        for (int64_t q : k.qo) tokens += q;
        const int64_t row_bytes =
            int64_t(key.head_dim_vo) * (k.chunk > 0 ? 4 : int64_t(dtype_size(o_dtype)));
        const int64_t rows = k.chunk > 0 ? k.partial_rows : tokens * k.qo_heads;
        std::printf(
            "[ counters ] %s: %lld 16-byte and %lld narrower stores for %lld rows of %lld "
            "bytes\n",
            what.c_str(), static_cast<long long>(st.vector16.load()),
            static_cast<long long>(st.narrow.load()), static_cast<long long>(rows),
            static_cast<long long>(row_bytes));
        EXPECT_EQ(st.narrow, 0) << what;
        EXPECT_EQ(st.vector16, rows * row_bytes / 16) << what;
        EXPECT_EQ(st.bytes, rows * row_bytes) << what;
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::fa3
