// CPU feature detection, once per process.
#pragma once

#include <cstdint>
#include <string>

#include "kvattn/device.h"

namespace kvattn::detail {

// A software prefetch's target: L2 (prefetcht1) or L1 (prefetcht0).
enum class PrefetchHint : uint8_t { kL2, kL1 };

// How decode's paced prefetch of its next tile asks for the lines (src/cpu/decode/
// decode_prefetch.h): where they go. (For NHD caches each page's rows of the task's heads are one
// stream, which the walk reads token by token. A stream per token row, so that the walk asked for
// head 0's lines of every token first, was Zen 3 / Zen 4's until the morning of 2026-12-05 and was
// removed that night (issue 23): with the kernels of then, one Zen 4 thread from DRAM read bf16 at
// 6.1-6.3 GB/s by token rows into L1, 13.0-13.6 by merged streams.)
struct DecodePrefetch {
  PrefetchHint hint = PrefetchHint::kL2;
  friend bool operator==(const DecodePrefetch&, const DecodePrefetch&) = default;
};

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, avx512_vbmi = false;
  // vdpbf16ps retires at about the FMA instruction rate (two products per lane: twice the FMA
  // throughput), as on AMD Zen 4. On the Intel Xeons measured (Sapphire-Rapids class) it retires
  // at a quarter of the FMA rate, and the fp32-FMA kernels are faster there (issue 14 note):
  // set from the vendor (AMD), the kernels' choice between the two.
  bool fast_bf16_dot = false;
  // AMD (Zen): the prefill kernels prefetch the next KV tile into L1 (prefetcht0), the Intel
  // Xeons into L2 (on Zen 5 the two ran level, issue 23's Zen 5 note).
  bool amd = false;
  // The x86 family (CPUID leaf 1, base + extended): 0x19 for AMD Zen 3 and Zen 4, 0x1A for Zen 5,
  // 6 for the Intel Xeons; and the model (amd_zen3 tells Zen 3 from Zen 4 by it).
  int family = 0;
  int model = 0;
  // How decode's paced prefetch of its next tile asks for the lines (decode_prefetch_for): into
  // L1 on AMD but Zen 3, into L2 on Zen 3 (its AVX2 kernels, two threads from DRAM, four sets:
  // bf16 llama3 0.79-0.98x the time, e4m3 0.86-0.98x, long_b1 0.82-1.07x, short_b64 0.88-1.05x,
  // d64 0.86-0.95x, d256 0.96-1.00x, gqa7 0.95x, f16 0.87x, HND 0.85x; MHA 1.00-1.08x slower
  // (its next tile of 32 heads is 512 KiB, L2 itself): issue 23's Zen 3 note of 2026-12-07). On
  // Zen 5 token rows ran the bf16 llama3 case 1.8-2.4x slower, and the merged streams into L1
  // 1.05-1.14x faster than prefetchnta and 1.1x faster than L2 once the task's heads were read 8 a
  // step (issue 23's Zen 5 notes). Zen 3 and Zen 4 (family 0x19) took token
  // rows until issue 23's Zen 4 pass of 2026-12-05: with the kernels of the Zen 5 passes, token
  // rows ran every NHD decode case 1.31-1.89x slower on Zen 4 (f16, one head a step, 1.89x; bf16
  // llama3 1.41x); the L2 hint was level to 1.06x faster over NHD but 1.21x slower over HND, as it
  // was slower on Zen 4 before. Zen 4 again on 2026-12-05 late, query-lane tasks one head a step
  // (two threads, `kvattn bench`, 3 rounds, L1 -> L2): llama3 bf16 10.6 -> 12.6 ms, f16 12.3 ->
  // 14.5, HND 11.6 -> 13.3, long_b1 5.8 -> 6.8, d64 6.2 -> 6.9, d256 24.2 -> 22.0, MHA 10.5 ->
  // 9.8, gqa7 13.8 -> 13.3 (one thread from DRAM bf16 13.0-13.6 -> 15.2-15.8 GB/s: the second
  // core takes the gain back). Into L2 on the Intel Xeons, their best.
  DecodePrefetch decode_prefetch;
  // Whether decode over the fp32-FMA kernels (f16 / f32 KV on AVX-512; every KV type on AVX2 and
  // on the Intel Xeons' AVX-512) reads 8 KV heads a step on NHD caches, as the bf16-dot kernels
  // do (decode_fma_head_steps_for): on AMD Zen 5 and later (family >= 0x1A), where one thread read
  // bf16 from DRAM 1.3-1.4x as fast and f16 decode ran 1.2x faster (issue 23's sixth Zen 5 pass);
  // on Zen 3 (its AVX2 kernels, blocks of up to 4 query rows: FmaTiles::kStepHeads), where two
  // threads from DRAM ran bf16 llama3 0.97-1.00x the time, d64 0.87-0.97x, d256 0.90-1.01x, MHA
  // 0.89-0.94x, short_b64 0.94-1.04x, long_b1 0.96-1.07x, f16 1.01x, and one thread cache-resident
  // bf16 0.955x (issue 23's Zen 3 note of 2026-12-07). Off on Zen 4 (with the merged prefetch,
  // f16: two threads level, 1.03x within the noise; cache-resident 0.83x: issue 23's Zen 4 note
  // of 2026-12-05) and on the Intel Xeons (not measured with it).
  bool decode_fma_head_steps = false;
  // Whether decode over the bf16 dot-product kernels (bf16 and FP8 KV on AVX512_BF16) reads
  // several KV heads a step on NHD caches where a task's query rows sit in the vector lanes and one
  // head a step would keep them in registers (GQA groups of 3 or more at head dims 64 and 128:
  // DotTiles::kLaneQueriesInRegisters; decode_lane_head_steps_for). Off on AMD Zen 3 /
  // Zen 4 (family 0x19): there one head a step keeps the head's queries in registers, where a step
  // of 8 reloads them from L1 per key, and ran the bf16 llama3 case 1.05-1.08x faster in three
  // sets of four (0.96x in one) with the merged prefetch of 2026-12-05 (e4m3 1.07-1.12x, gqa7
  // 1.02-1.19x, d64 1.05-1.09x, short_b64 1.06x, long_b1 1.0-1.10x; cache-resident bf16 1.05x,
  // e4m3 1.03-1.07x: issue 23's Zen 4 note of 2026-12-05).
  // On elsewhere: on Zen 5, where the steps were measured (1.29-1.34x from DRAM on one thread),
  // and on the Intel Xeons, not measured either way (the dot-product kernels run there only when
  // named: fast_bf16_dot).
  bool decode_lane_head_steps = false;
  // AMX-BF16 and AMX-TILE (CPUID), with the tile state granted by the OS (Linux hands it out
  // only on request: arch_prctl ARCH_REQ_XCOMP_PERM, asked once here).
  bool amx_bf16 = false;
  CpuIsa best = CpuIsa::kScalar;  // what the hardware and OS allow
  std::string to_string() const;
};
const CpuFeatures& cpu_features();

// The x86 family and model from CPUID leaf 1's EAX (the base family, plus the extended one when
// the base is 0xF; the model with its extended bits above where the base family is 6 or 0xF), and
// decode's prefetch and head-step choices for a CPU.
int x86_family(unsigned leaf1_eax);
int x86_model(unsigned leaf1_eax);
// AMD Zen 3 (family 0x19, the models that are not Zen 4's): 00h-0Fh (Milan), 20h-2Fh (Vermeer),
// 40h-5Fh (Rembrandt, Cezanne).
bool amd_zen3(bool amd, int family, int model);
DecodePrefetch decode_prefetch_for(bool amd, int family, int model);
// CpuFeatures::decode_fma_head_steps
bool decode_fma_head_steps_for(bool amd, int family, int model);
bool decode_lane_head_steps_for(bool amd, int family);  // CpuFeatures::decode_lane_head_steps

// The ISA level kernels use: the hardware's best, lowered by set_cpu_isa_limit (tests). Which
// kernel runs is the cpu backend's kernel table's choice (src/cpu/kernel_table.h; its one
// override is KVATTN_CPU_KERNEL).
CpuIsa effective_cpu_isa();
void set_cpu_isa_limit(CpuIsa isa);  // for tests and debugging
void clear_cpu_isa_limit();

}  // namespace kvattn::detail
