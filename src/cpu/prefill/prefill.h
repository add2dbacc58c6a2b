// The CPU prefill path (single_prefill, batch_prefill_paged, batch_prefill_ragged): the contract
// between the cpu backend (src/cpu/backend.cc) and the prefill kernels in this directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/prefill/tile_config.h"
#include "kvattn/attention.h"
#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::cpu {

struct CpuKernel;

// The kernel a prefill plan runs for requests of these query lengths on `threads` threads:
// `chosen` (the kernel table's choice for the Problem) or the tallest of its taller tiles
// (CpuKernel::taller) that still cuts at least kPrefillItemsPerThread work items a thread, whose
// per-thread scratch stays within kPrefillTileScratchBytes, and, under a sliding window, whose
// query tokens are at most 1 / kPrefillWindowPerTileToken of the keys a row sees: a tile
// computes the keys of its whole span, so at a window of 256 keys 512 rows (128 tokens at GQA
// group 4) took 1.15x the time of 128 rows, 256 rows 1.02x; at 1024 keys 256 rows 0.975x, 512
// rows 0.99x (AMD Zen 4, one prompt of 4096 tokens, d 128).
inline constexpr int64_t kPrefillItemsPerThread = 8;
inline constexpr int64_t kPrefillTileScratchBytes = int64_t{1} << 20;
inline constexpr int64_t kPrefillWindowPerTileToken = 16;
const CpuKernel& prefill_kernel_for_lengths(const Problem& problem, const CpuKernel& chosen,
                                            const std::vector<int64_t>& qo_len, int threads);

// KV heads a prefill task takes together (PrefillItemFn, params.h; the kernels walk each KV tile
// over all of them, kernel.h's run_tile): over an NHD cache, where the tiles hold at most
// kPrefillHeadTaskRows query rows (a few tokens each: a speculative-decoding check, short chunks,
// whose tiles' arithmetic is too short to hide one head's slices of each token row), the most of
// kPrefillMaxTaskHeads (tile_config.h) that still leaves kPrefillTasksPerThread tasks a thread
// and whose heads' scratch slots stay within kPrefillTileScratchBytes; else 1. `tile`: the
// plan's (cut to the longest request), `items` its work items. Measured on AMD Zen 4 (2 threads,
// B16 x 4096 keys, GQA 32/8, d 128, bf16, causal; against one head a task): 4 query tokens 0.73x
// on the bf16-dot kernel, 0.77x on the AVX2 one, 0.95x on the AVX-512 FMA one; 1 / 2 / 8 / 16
// tokens 0.81x / 0.80x / 0.86x / 0.98x (bf16-dot), an e4m3 cache 0.72x.
inline constexpr int kPrefillHeadTaskRows = 64;
inline constexpr int64_t kPrefillTasksPerThread = 4;
int prefill_task_heads(const Problem& problem, const prefill::PrefillTile& tile, int64_t items,
                       int threads);

// The decode kernel a paged batch prefill takes where every request has one query token
// (plan_prefill runs it as the decode it is): the kernel table's choice for that decode, on the
// ISA level `isa`. *kernel is nullptr (and the status Ok) for another op, or where
// KVATTN_CPU_KERNEL names a prefill kernel (the prefill's tiles then run it).
Status one_token_cpu_kernel(const Problem& problem, CpuIsa isa, const CpuKernel** kernel);

// Cuts prefill work (fills plan->work, workspace_bytes, num_threads) with the tile of the kernel
// plan->kernel names (the kernel table's choice, made first), which it replaces with a taller
// one where the lengths call for it (prefill_kernel_for_lengths; not where KVATTN_CPU_KERNEL
// decides); args validated. A paged batch of one query token a request is a decode: planned by
// plan_decode with the decode kernel the table chooses for it (its name in plan->kernel), and
// run by run_decode (unless KVATTN_CPU_KERNEL names a prefill kernel).
Status plan_prefill(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                    Plan* plan);
// Runs a prefill plan made by plan_prefill.
Status run_prefill(const Plan& plan, const AttentionArgs& args, void* workspace,
                   std::size_t workspace_bytes);

}  // namespace kvattn::cpu
