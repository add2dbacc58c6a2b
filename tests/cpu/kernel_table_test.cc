// The cpu backend's kernel table (src/cpu/kernel_table.h): its entries are well formed, the
// plan-time choice on every CPU class (described here for the kernels this machine cannot run),
// the one override KVATTN_CPU_KERNEL with its errors, the plan and explain naming the kernel, and
// every entry this machine runs against the reference on the variant grid (testing/variants.h).
#include "cpu/kernel_table.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "cpu/prefill/prefill.h"
#include "cpu_test_util.h"
#include "kvattn/selection.h"
#include "testing/variants.h"

namespace kvattn::cputest {
namespace {

using cpu::CpuKernel;
using cpu::KernelOp;
using testing::CaseSpec;

// CPU classes kvattn meets, described (a test of the dispatch to kernels this CPU lacks).
detail::CpuFeatures avx2_class() {  // AMD Zen 3
  detail::CpuFeatures f;
  f.avx2 = f.fma = f.f16c = true;
  f.best = CpuIsa::kAvx2;
  return f;
}
detail::CpuFeatures zen4_class() {  // AVX-512 with BF16 and VBMI, fast vdpbf16ps
  detail::CpuFeatures f = avx2_class();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  f.avx512_bf16 = f.avx512_vbmi = f.fast_bf16_dot = true;
  f.best = CpuIsa::kAvx512;
  return f;
}
detail::CpuFeatures sapphire_rapids_class() {  // as Zen 4, slow vdpbf16ps, AMX granted
  detail::CpuFeatures f = zen4_class();
  f.fast_bf16_dot = false;
  f.avx512_fp16 = true;
  f.amx_bf16 = true;
  return f;
}

Problem decode_problem(DType q, DType kv, int d = 128) {
  Problem p;
  p.op = Op::kBatchDecode;
  p.batch_size = 2;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim_qk = p.head_dim_vo = d;
  p.q_dtype = q;
  p.kv_dtype = kv;
  p.o_dtype = DType::kBF16;
  return p;
}

std::string choice(const Problem& p, CpuIsa isa, const detail::CpuFeatures& f) {
  const CpuKernel* k = nullptr;
  Status s = cpu::choose_cpu_kernel(p, isa, f, &k);
  return s.ok() ? std::string(k->name) : "error: " + s.message();
}

TEST(CpuKernelTable, EntriesAreWellFormed) {
  std::set<std::string_view> names;
  for (const CpuKernel& k : cpu::cpu_kernels()) {
    EXPECT_TRUE(names.insert(k.name).second) << "duplicate name " << k.name;
    const std::string prefix = std::string(cpu::kernel_op_name(k.op)) + "-";
    EXPECT_EQ(std::string(k.name).rfind(prefix, 0), 0u) << k.name << " does not start with the op";
    const int entries = (k.decode != nullptr) + (k.prefill != nullptr) + (k.mla != nullptr);
    EXPECT_EQ(entries, 1) << k.name;
    EXPECT_EQ(k.decode != nullptr, k.op == KernelOp::kDecode) << k.name;
    EXPECT_EQ(k.prefill != nullptr, k.op == KernelOp::kPrefill) << k.name;
    if (!k.strided.empty()) {
      const CpuKernel* s = cpu::find_cpu_kernel(k.strided);
      ASSERT_NE(s, nullptr) << k.name << " names a strided kernel that is not in the table";
      EXPECT_EQ(s->op, k.op) << k.name;
      EXPECT_TRUE(s->strided.empty()) << k.name << ": the strided kernel takes any stride";
      EXPECT_LE(s->isa, k.isa) << k.name;
    }
    // A taller tile is the same code with twice the rows: the same op, level, features, rule,
    // entry and strided fallback; chosen only as the taller of another (never by default).
    if (!k.taller.empty()) {
      const CpuKernel* t = cpu::find_cpu_kernel(k.taller);
      ASSERT_NE(t, nullptr) << k.name << " names a taller kernel that is not in the table";
      EXPECT_EQ(k.op, KernelOp::kPrefill) << k.name;
      EXPECT_EQ(t->op, k.op) << k.name;
      EXPECT_EQ(t->isa, k.isa) << k.name;
      EXPECT_EQ(t->runs_on, k.runs_on) << k.name;
      EXPECT_EQ(t->applies, k.applies) << k.name;
      EXPECT_EQ(t->prefill, k.prefill) << k.name;
      EXPECT_EQ(t->strided, k.strided) << k.name;
      EXPECT_EQ(t->tile.target_rows, 2 * k.tile.target_rows) << k.name;
      EXPECT_EQ(t->tile.kv_tile, k.tile.kv_tile) << k.name;
      EXPECT_EQ(t->tile.odd_staged_pitch, k.tile.odd_staged_pitch) << k.name;
      ASSERT_NE(t->preferred, nullptr) << t->name;
      EXPECT_FALSE(t->preferred(detail::CpuFeatures{})) << t->name;
      const std::string rows = "-r" + std::to_string(t->tile.target_rows) + "k";
      EXPECT_NE(std::string(t->name).find(rows), std::string::npos) << t->name;
    }
  }
  // Each op ends with its portable kernel: scalar, for any problem on any CPU.
  for (KernelOp op : {KernelOp::kDecode, KernelOp::kPrefill, KernelOp::kMla}) {
    const CpuKernel& portable = cpu::portable_cpu_kernel(op);
    EXPECT_EQ(portable.isa, CpuIsa::kScalar) << portable.name;
    EXPECT_TRUE(portable.strided.empty()) << portable.name;
    EXPECT_TRUE(portable.runs_on(detail::CpuFeatures{}).ok()) << portable.name;
    EXPECT_EQ(portable.preferred, nullptr) << portable.name;
  }
}

#if defined(__x86_64__)
// The choice per CPU class, made at plan time from the features (AVX-512 and AMX kernels are
// built on every x86 machine; this one may not run them, but it chooses them for those CPUs).
TEST(CpuKernelTable, DecodeChoicePerCpuClass) {
  const Problem fp8 = decode_problem(DType::kBF16, DType::kE4M3);
  EXPECT_EQ(choice(fp8, CpuIsa::kAvx2, avx2_class()), "decode-avx2-fma-k32");
  EXPECT_EQ(choice(fp8, CpuIsa::kAvx512, zen4_class()), "decode-avx512bf16-fp8table-dot-k32");
  // vdpbf16ps at a quarter of the FMA rate: the table widening with fp32 FMAs.
  EXPECT_EQ(choice(fp8, CpuIsa::kAvx512, sapphire_rapids_class()),
            "decode-avx512vbmi-fp8table-fma-k32");
  // An ISA level lowered below the CPU's: that level's kernels.
  EXPECT_EQ(choice(fp8, CpuIsa::kAvx2, zen4_class()), "decode-avx2-fma-k32");
  EXPECT_EQ(choice(fp8, CpuIsa::kScalar, zen4_class()), "decode-scalar-k32");
  // f16 queries: no bf16 dot products, the table widening still.
  EXPECT_EQ(choice(decode_problem(DType::kF16, DType::kE4M3), CpuIsa::kAvx512, zen4_class()),
            "decode-avx512vbmi-fp8table-fma-k32");
  // Where the table kernels do not apply: the fp32-FMA kernels of the level.
  Problem masked = fp8;
  masked.mask_mode = MaskMode::kCustom;
  EXPECT_EQ(choice(masked, CpuIsa::kAvx512, zen4_class()), "decode-avx512-fma-k32");
  Problem rope = fp8;
  rope.pos_encoding_mode = PosEncoding::kRopeLlama;
  EXPECT_EQ(choice(rope, CpuIsa::kAvx512, zen4_class()), "decode-avx512-fma-k32");
  EXPECT_EQ(choice(decode_problem(DType::kBF16, DType::kE4M3, 96), CpuIsa::kAvx512, zen4_class()),
            "decode-avx512-fma-k32");
  // Per-token scales: the dot-product kernel still (each weight, V scale folded in, as two bf16);
  // the AMX kernel, which would round the scale into one, refuses them.
  Problem per_token = fp8;
  per_token.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
  EXPECT_EQ(choice(per_token, CpuIsa::kAvx512, zen4_class()), "decode-avx512bf16-fp8table-dot-k32");
  const cpu::CpuKernel* amx = cpu::find_cpu_kernel("decode-amx-bf16-fp8table-k32");
  ASSERT_NE(amx, nullptr);
  EXPECT_NE(amx->applies(per_token).message().find("per-head scales"), std::string::npos);
  EXPECT_TRUE(amx->applies(fp8).ok());
  // bf16 caches: bf16 dot products where they are fast, fp32 FMAs where they are not or where the
  // queries are not bf16, a custom mask or fused RoPE is asked.
  const Problem bf16 = decode_problem(DType::kBF16, DType::kBF16);
  EXPECT_EQ(choice(bf16, CpuIsa::kAvx512, zen4_class()), "decode-avx512bf16-dot-k32");
  EXPECT_EQ(choice(bf16, CpuIsa::kAvx512, sapphire_rapids_class()), "decode-avx512-fma-k32");
  EXPECT_EQ(choice(decode_problem(DType::kF16, DType::kBF16), CpuIsa::kAvx512, zen4_class()),
            "decode-avx512-fma-k32");
  Problem bf16_masked = bf16;
  bf16_masked.mask_mode = MaskMode::kCustom;
  EXPECT_EQ(choice(bf16_masked, CpuIsa::kAvx512, zen4_class()), "decode-avx512-fma-k32");
  Problem bf16_rope = bf16;
  bf16_rope.pos_encoding_mode = PosEncoding::kRopeLlama;
  EXPECT_EQ(choice(bf16_rope, CpuIsa::kAvx512, zen4_class()), "decode-avx512-fma-k32");
  EXPECT_EQ(choice(decode_problem(DType::kBF16, DType::kBF16, 96), CpuIsa::kAvx512, zen4_class()),
            "decode-avx512-fma-k32");
  // AVX-512 without VBMI: no table widening.
  detail::CpuFeatures no_vbmi = zen4_class();
  no_vbmi.avx512_vbmi = false;
  EXPECT_EQ(choice(fp8, CpuIsa::kAvx512, no_vbmi), "decode-avx512-fma-k32");
}

// Decode's prefetch per CPU class (CpuFeatures::decode_prefetch), from CPUID leaf 1 signatures:
// L1 by merged page streams on AMD Zen 4 (family 0x19, its models) and Zen 5 (0x1A), L2 by merged
// streams on Zen 3 (family 0x19, its models) and the Intel Xeons.
TEST(CpuKernelTable, DecodePrefetchHintPerCpuClass) {
  EXPECT_EQ(detail::x86_family(0x00A00F11u), 0x19);  // Zen 3 (EPYC Milan)
  EXPECT_EQ(detail::x86_family(0x00A10F11u), 0x19);  // Zen 4 (EPYC Genoa)
  EXPECT_EQ(detail::x86_family(0x00B00F21u), 0x1a);  // Zen 5 (EPYC Turin)
  EXPECT_EQ(detail::x86_family(0x000806F8u), 6);     // Sapphire Rapids
  EXPECT_EQ(detail::x86_model(0x00A00F11u), 0x01);
  EXPECT_EQ(detail::x86_model(0x00A20F10u), 0x21);  // Zen 3 (Ryzen 5000, Vermeer)
  EXPECT_EQ(detail::x86_model(0x00A10F11u), 0x11);
  EXPECT_EQ(detail::x86_model(0x00A60F12u), 0x61);  // Zen 4 (Ryzen 7000, Raphael)
  EXPECT_EQ(detail::x86_model(0x00B00F21u), 0x02);
  EXPECT_EQ(detail::x86_model(0x000806F8u), 0x8F);
  EXPECT_TRUE(detail::amd_zen3(true, 0x19, 0x01));
  EXPECT_TRUE(detail::amd_zen3(true, 0x19, 0x21));
  EXPECT_TRUE(detail::amd_zen3(true, 0x19, 0x50));
  EXPECT_FALSE(detail::amd_zen3(true, 0x19, 0x11));
  EXPECT_FALSE(detail::amd_zen3(true, 0x19, 0x61));
  EXPECT_FALSE(detail::amd_zen3(true, 0x19, 0xA0));
  EXPECT_FALSE(detail::amd_zen3(true, 0x1a, 0x02));
  EXPECT_FALSE(detail::amd_zen3(false, 6, 0x8F));
  using detail::DecodePrefetch;
  using detail::PrefetchHint;
  EXPECT_EQ(detail::decode_prefetch_for(true, 0x19, 0x01), (DecodePrefetch{PrefetchHint::kL2}));
  EXPECT_EQ(detail::decode_prefetch_for(true, 0x19, 0x11), (DecodePrefetch{PrefetchHint::kL1}));
  EXPECT_EQ(detail::decode_prefetch_for(true, 0x1a, 0x02), (DecodePrefetch{PrefetchHint::kL1}));
  EXPECT_EQ(detail::decode_prefetch_for(false, 6, 0x8F), (DecodePrefetch{PrefetchHint::kL2}));
  const detail::CpuFeatures& here = detail::cpu_features();
  EXPECT_EQ(here.decode_prefetch, detail::decode_prefetch_for(here.amd, here.family, here.model));
  // `kvattn devices` names the hint where it is not L2.
  EXPECT_EQ(here.to_string().find("decode_prefetch_l1") != std::string::npos,
            here.decode_prefetch.hint == PrefetchHint::kL1);
}

// The fp32-FMA decode kernels' steps of several heads per CPU class
// (CpuFeatures::decode_fma_head_steps): on AMD Zen 5 and Zen 3, the classes measured with them,
// not on Zen 4 or the Intel Xeons; `kvattn devices` names them where taken.
TEST(CpuKernelTable, DecodeFmaHeadStepsPerCpuClass) {
  EXPECT_TRUE(detail::decode_fma_head_steps_for(true, 0x19, 0x01));   // Zen 3 (Milan)
  EXPECT_TRUE(detail::decode_fma_head_steps_for(true, 0x19, 0x21));   // Zen 3 (Vermeer)
  EXPECT_FALSE(detail::decode_fma_head_steps_for(true, 0x19, 0x11));  // Zen 4 (Genoa)
  EXPECT_FALSE(detail::decode_fma_head_steps_for(true, 0x19, 0x61));  // Zen 4 (Raphael)
  EXPECT_TRUE(detail::decode_fma_head_steps_for(true, 0x1a, 0x02));   // Zen 5 (Turin)
  EXPECT_FALSE(detail::decode_fma_head_steps_for(false, 6, 0x8f));    // Sapphire Rapids
  const detail::CpuFeatures& here = detail::cpu_features();
  EXPECT_EQ(here.decode_fma_head_steps,
            detail::decode_fma_head_steps_for(here.amd, here.family, here.model));
  EXPECT_EQ(here.to_string().find("decode_fma_head_steps") != std::string::npos,
            here.decode_fma_head_steps);
}

// The dot-product decode kernels' steps of several heads with the query rows in the lanes, per
// CPU class (CpuFeatures::decode_lane_head_steps): not on AMD Zen 3 / Zen 4 (family 0x19), where
// one head a step ran faster; on Zen 5 and the Intel Xeons; `kvattn devices` names them where
// taken.
TEST(CpuKernelTable, DecodeLaneHeadStepsPerCpuClass) {
  EXPECT_FALSE(detail::decode_lane_head_steps_for(true, 0x19));
  EXPECT_TRUE(detail::decode_lane_head_steps_for(true, 0x1a));
  EXPECT_TRUE(detail::decode_lane_head_steps_for(false, 6));
  const detail::CpuFeatures& here = detail::cpu_features();
  EXPECT_EQ(here.decode_lane_head_steps, detail::decode_lane_head_steps_for(here.amd, here.family));
  EXPECT_EQ(here.to_string().find("decode_lane_head_steps") != std::string::npos,
            here.decode_lane_head_steps);
}

TEST(CpuKernelTable, PrefillChoicePerCpuClass) {
  Problem p = decode_problem(DType::kBF16, DType::kBF16);
  p.op = Op::kBatchPrefillPaged;
  EXPECT_EQ(choice(p, CpuIsa::kAvx2, avx2_class()), "prefill-avx2-fma-r128k64");
  EXPECT_EQ(choice(p, CpuIsa::kAvx512, zen4_class()), "prefill-avx512bf16-dot-r128k64");
  EXPECT_EQ(choice(p, CpuIsa::kAvx512, sapphire_rapids_class()), "prefill-amx-bf16-r256k128");
  Problem e4m3 = p;
  e4m3.kv_dtype = DType::kE4M3;
  EXPECT_EQ(choice(e4m3, CpuIsa::kAvx512, sapphire_rapids_class()), "prefill-amx-bf16-r256k128");
  // AMX takes 32 dims a step: head dim 96 falls to the FMA kernel on an Intel Xeon (vdpbf16ps is
  // not preferred there).
  Problem d96 = p;
  d96.head_dim_qk = d96.head_dim_vo = 96;
  EXPECT_EQ(choice(d96, CpuIsa::kAvx512, sapphire_rapids_class()), "prefill-amx-bf16-r256k128");
  d96.head_dim_qk = d96.head_dim_vo = 80;
  EXPECT_EQ(choice(d96, CpuIsa::kAvx512, sapphire_rapids_class()), "prefill-avx512-fma-r128k64");
  Problem f16 = p;
  f16.q_dtype = f16.kv_dtype = DType::kF16;
  EXPECT_EQ(choice(f16, CpuIsa::kAvx512, zen4_class()), "prefill-avx512-fma-r128k64");
  Problem rope = p;
  rope.pos_encoding_mode = PosEncoding::kRopeLlama;
  EXPECT_EQ(choice(rope, CpuIsa::kAvx512, zen4_class()), "prefill-avx512-fma-r128k64");
  // Per-token scales: the bf16-dot kernel (V times its scale staged as two bf16); the AMX kernel
  // would round the scale into one and refuses them, so Sapphire Rapids takes fp32 FMAs.
  Problem per_token = p;
  per_token.kv_dtype = DType::kE4M3;
  per_token.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
  EXPECT_EQ(choice(per_token, CpuIsa::kAvx512, zen4_class()), "prefill-avx512bf16-dot-r128k64");
  EXPECT_EQ(choice(per_token, CpuIsa::kAvx512, sapphire_rapids_class()),
            "prefill-avx512-fma-r128k64");
}

// Taller query tiles where the requests' lengths leave work for every thread and the scratch
// fits in L2 (prefill_kernel_for_lengths): the bf16-dot kernel's r256k64 / r512k64.
TEST(CpuKernelTable, PrefillTakesTallerTilesWhereTheLengthsAllow) {
  Problem p = decode_problem(DType::kBF16, DType::kBF16);
  p.op = Op::kBatchPrefillPaged;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;  // group 4: 32 / 64 / 128 tokens a tile of 128 / 256 / 512 rows
  p.mask_mode = MaskMode::kCausal;
  const CpuKernel* base = cpu::find_cpu_kernel("prefill-avx512bf16-dot-r128k64");
  ASSERT_NE(base, nullptr);
  auto pick = [&](const Problem& q, std::vector<int64_t> qo_len, int threads) {
    return std::string(cpu::prefill_kernel_for_lengths(q, *base, qo_len, threads).name);
  };
  // 4096 tokens: 32 tiles of 128 tokens x 8 heads = 256 items, 8 a thread up to 32 threads.
  EXPECT_EQ(pick(p, {4096}, 2), "prefill-avx512bf16-dot-r512k64");
  EXPECT_EQ(pick(p, {4096}, 32), "prefill-avx512bf16-dot-r512k64");
  EXPECT_EQ(pick(p, {4096}, 33), "prefill-avx512bf16-dot-r256k64");
  EXPECT_EQ(pick(p, {4096}, 64), "prefill-avx512bf16-dot-r256k64");
  EXPECT_EQ(pick(p, {4096}, 65), "prefill-avx512bf16-dot-r128k64");
  // One request of 512 tokens: 4 tiles x 8 heads at 512 rows.
  EXPECT_EQ(pick(p, {512}, 4), "prefill-avx512bf16-dot-r512k64");
  EXPECT_EQ(pick(p, {512}, 8), "prefill-avx512bf16-dot-r256k64");
  EXPECT_EQ(pick(p, {512}, 16), "prefill-avx512bf16-dot-r128k64");
  // Short requests count by their tiles (each at least one), and so do empty ones (none); a
  // taller tile than the longest request fills is no gain (16 or 32 tokens: the base's 32; 48:
  // 256 rows' 64).
  EXPECT_EQ(pick(p, std::vector<int64_t>(64, 100), 64), "prefill-avx512bf16-dot-r512k64");
  EXPECT_EQ(pick(p, std::vector<int64_t>(64, 48), 64), "prefill-avx512bf16-dot-r256k64");
  EXPECT_EQ(pick(p, std::vector<int64_t>(64, 32), 1), "prefill-avx512bf16-dot-r128k64");
  EXPECT_EQ(pick(p, std::vector<int64_t>(64, 16), 64), "prefill-avx512bf16-dot-r128k64");
  EXPECT_EQ(pick(p, {0, 0, 0}, 1), "prefill-avx512bf16-dot-r128k64");
  // Head dim 256: 512 rows' scratch (O^T alone 512 KiB) is past 1 MiB; 256 rows are not.
  Problem d256 = p;
  d256.head_dim_qk = d256.head_dim_vo = 256;
  EXPECT_EQ(pick(d256, {4096}, 2), "prefill-avx512bf16-dot-r256k64");
  // A sliding window: a taller tile's tokens at most 1/16 of the keys a row sees (the tile
  // computes its whole span's keys).
  Problem window = p;
  window.window_left = 255;  // 256 keys a row: 32-token tiles (the base's) and no taller
  EXPECT_EQ(pick(window, {4096}, 2), "prefill-avx512bf16-dot-r128k64");
  window.window_left = 1023;  // 1024: 64 tokens
  EXPECT_EQ(pick(window, {4096}, 2), "prefill-avx512bf16-dot-r256k64");
  window.window_left = 2047;  // 2048: 128 tokens
  EXPECT_EQ(pick(window, {4096}, 2), "prefill-avx512bf16-dot-r512k64");
  // A kernel with no taller tiles stays as it is.
  const CpuKernel* avx2 = cpu::find_cpu_kernel("prefill-avx2-fma-r128k64");
  ASSERT_NE(avx2, nullptr);
  EXPECT_EQ(&cpu::prefill_kernel_for_lengths(p, *avx2, {4096}, 2), avx2);
  EXPECT_TRUE(cpu::taller_cpu_kernels(*avx2).empty());
  ASSERT_EQ(cpu::taller_cpu_kernels(*base).size(), 2u);
}

TEST(CpuKernelTable, MlaChoicePerCpuClass) {
  Problem p = make_mla_problem(2, 16, 16, 0.07f);
  p.q_dtype = p.kv_dtype = DType::kBF16;
  EXPECT_EQ(choice(p, CpuIsa::kAvx2, avx2_class()), "mla-avx2-fma-f32-k64");
  EXPECT_EQ(choice(p, CpuIsa::kScalar, avx2_class()), "mla-scalar-f32");
  EXPECT_EQ(choice(p, CpuIsa::kAvx512, zen4_class()), "mla-avx512bf16-dot-k128");
  EXPECT_EQ(choice(p, CpuIsa::kAvx512, sapphire_rapids_class()), "mla-amx-bf16-k128");
  Problem heads8 = make_mla_problem(2, 8, 16, 0.07f);
  // 8 heads: no bf16 tile kernel applies (16-head vectors); the AVX2 f32 one does.
  EXPECT_EQ(choice(heads8, CpuIsa::kAvx512, sapphire_rapids_class()), "mla-avx2-fma-f32-k64");
  Problem heads12 = make_mla_problem(2, 12, 16, 0.07f);
  EXPECT_EQ(choice(heads12, CpuIsa::kAvx512, sapphire_rapids_class()), "mla-scalar-f32");
}
#endif

TEST(CpuKernelTable, OverrideNamesOneKernelOrReference) {
  const Problem decode = decode_problem(DType::kBF16, DType::kE4M3);
  Problem prefill = decode;
  prefill.op = Op::kBatchPrefillPaged;
  const CpuIsa here = detail::cpu_features().best;
  {
    ScopedEnv env("KVATTN_CPU_KERNEL", "reference");
    EXPECT_EQ(choice(decode, here, detail::cpu_features()), "decode-scalar-k32");
    EXPECT_EQ(choice(prefill, here, detail::cpu_features()), "prefill-scalar-r128k64");
    EXPECT_EQ(choice(make_mla_problem(1, 16, 16, 0.07f), here, detail::cpu_features()),
              "mla-scalar-f32");
  }
  const std::string prefill_default = choice(prefill, here, detail::cpu_features());
  {
    ScopedEnv env("KVATTN_CPU_KERNEL", "decode-scalar-k32");
    EXPECT_EQ(choice(decode, here, detail::cpu_features()), "decode-scalar-k32");
    // A kernel of another op leaves this op's default.
    EXPECT_EQ(choice(prefill, here, detail::cpu_features()), prefill_default);
  }
  {
    ScopedEnv env("KVATTN_CPU_KERNEL", "decode-avx1024-magic");
    const std::string e = choice(decode, here, detail::cpu_features());
    EXPECT_NE(e.find("KVATTN_CPU_KERNEL=decode-avx1024-magic is not a cpu kernel"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("decode-scalar-k32"), std::string::npos) << e;  // the names are listed
  }
#if defined(__x86_64__)
  {
    // Not applicable: the rule named.
    ScopedEnv env("KVATTN_CPU_KERNEL", "decode-avx512vbmi-fp8table-fma-k32");
    const std::string e =
        choice(decode_problem(DType::kBF16, DType::kBF16), CpuIsa::kAvx512, zen4_class());
    EXPECT_NE(e.find("does not apply to this problem: it needs an FP8"), std::string::npos) << e;
    // Not runnable on this CPU class: the missing feature named.
    const std::string f = choice(decode, CpuIsa::kAvx2, avx2_class());
    EXPECT_NE(f.find("cannot run here: it needs ISA level avx512"), std::string::npos) << f;
    detail::CpuFeatures no_vbmi = zen4_class();
    no_vbmi.avx512_vbmi = false;
    const std::string g = choice(decode, CpuIsa::kAvx512, no_vbmi);
    EXPECT_NE(g.find("cannot run here: this CPU lacks AVX512_VBMI"), std::string::npos) << g;
  }
#endif
}

// The plan records the kernel; explain (text and JSON) names it; the override reaches both.
TEST(CpuKernelTable, PlanAndExplainNameTheKernel) {
  CaseSpec spec;
  spec.problem = decode_problem(DType::kBF16, DType::kBF16);
  spec.kv_lens = {40, 9};
  testing::Case c = testing::Case::make(spec);
  PlanOptions options;
  options.backend = "cpu";
  Plan plan;
  ASSERT_TRUE(kvattn::plan(c.problem(), c.args(), options, &plan).ok());
  const CpuKernel* expected = nullptr;
  ASSERT_TRUE(cpu::choose_cpu_kernel(c.problem(), cpu::plan_isa(options.device), &expected).ok());
  EXPECT_EQ(plan.kernel, expected->name);
  const Explanation e = explain(c.problem(), Device::cpu());
  EXPECT_NE(e.to_json().find("\"cpu_kernel\": \"" + std::string(expected->name) + "\""),
            std::string::npos)
      << e.to_json();
  EXPECT_NE(e.to_text().find("kernel " + std::string(expected->name)), std::string::npos);
  {
    ScopedEnv env("KVATTN_CPU_KERNEL", "reference");
    Plan forced;
    ASSERT_TRUE(kvattn::plan(c.problem(), c.args(), options, &forced).ok());
    EXPECT_EQ(forced.kernel, "decode-scalar-k32");
    EXPECT_NE(explain(c.problem(), Device::cpu()).to_json().find("\"cpu_kernel\": \"decode-scalar"),
              std::string::npos);
    EXPECT_TRUE(kvattn::run(forced, c.args()).ok());
  }
  {
    ScopedEnv env("KVATTN_CPU_KERNEL", "no-such-kernel");
    Plan bad;
    Status s = kvattn::plan(c.problem(), c.args(), options, &bad);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
    const std::string json = explain(c.problem(), Device::cpu()).to_json();
    EXPECT_NE(json.find("\"cpu_kernel\": null, \"cpu_kernel_error\": \"KVATTN_CPU_KERNEL=no-such"),
              std::string::npos)
        << json;
  }
}

// A prefill plan takes the taller tiles of the kernel chosen for its Problem where its lengths
// allow (explain lists them), and the override's kernel exactly as named.
TEST(CpuKernelTable, PrefillPlanRecordsTheTallerKernel) {
  CaseSpec spec;
  Problem& p = spec.problem;
  p = decode_problem(DType::kBF16, DType::kBF16);
  p.op = Op::kBatchPrefillPaged;
  p.batch_size = 1;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.mask_mode = MaskMode::kCausal;
  spec.qo_lens = spec.kv_lens = {2048};
  testing::Case c = testing::Case::make(spec);
  const AttentionArgs& args = c.args();
  PlanOptions options;
  options.backend = "cpu";
  options.num_threads = 2;
  const CpuKernel* chosen = nullptr;
  ASSERT_TRUE(cpu::choose_cpu_kernel(p, cpu::plan_isa(options.device), &chosen).ok());
  const std::vector<const CpuKernel*> taller = cpu::taller_cpu_kernels(*chosen);
  Plan plan;
  Status s = kvattn::plan(p, args, options, &plan);
  ASSERT_TRUE(s.ok()) << s.message();
  // 2048 tokens, 8 heads, 2 threads: every taller tile leaves 8 items a thread and more.
  EXPECT_EQ(plan.kernel, taller.empty() ? chosen->name : taller.back()->name);
  s = kvattn::run(plan, args);
  EXPECT_TRUE(s.ok()) << s.message();
  const std::string json = explain(p, Device::cpu()).to_json();
  std::string listed = "\"cpu_kernel_taller\": [";
  for (std::size_t i = 0; i < taller.size(); ++i) {
    listed += (i ? ", \"" : "\"") + std::string(taller[i]->name) + "\"";
  }
  EXPECT_NE(json.find(listed + "]"), std::string::npos) << json;
  {
    ScopedEnv env("KVATTN_CPU_KERNEL", std::string(chosen->name).c_str());
    Plan forced;
    ASSERT_TRUE(kvattn::plan(p, args, options, &forced).ok());
    EXPECT_EQ(forced.kernel, chosen->name);
    EXPECT_NE(explain(p, Device::cpu()).to_json().find("\"cpu_kernel_taller\": []"),
              std::string::npos);
  }
}

// Every kernel this machine runs, named, against the reference on the cross-backend variant
// grid (its op's operations, a 16-bit and an FP8 cache, lengths around the tiles and pages);
// a problem the kernel does not compute takes the default choice and is not counted for it.
TEST(CpuKernelTable, EveryRunnableKernelOnTheVariantGrid) {
  const DType kv_dtypes[] = {DType::kBF16, DType::kE4M3};
  for (const CpuKernel& k : cpu::cpu_kernels()) {
    if (!cpu::kernel_runs_on(k, detail::cpu_features().best, detail::cpu_features()).ok()) continue;
    SCOPED_TRACE(std::string(k.name));
    KernelOverride named(k.name);
    int checked = 0;
    if (k.op == KernelOp::kMla) {
      for (bool causal : {false, true}) {
        for (DType kv : kv_dtypes) {
          CaseSpec s;
          s.seed = 91 + checked;
          s.problem = make_mla_problem(2, 16, 16, 0.0721687836f);
          s.problem.kv_dtype = kv;
          if (is_fp8(kv)) s.scalars.k_scale = 0.375f;
          s.problem.mask_mode = causal ? MaskMode::kCausal : MaskMode::kNone;
          s.return_lse = true;
          s.qo_lens = {1, 2};
          s.kv_lens = {300, 129};
          if (!k.applies(s.problem).ok()) continue;
          expect_matches_reference(s, CpuIsa::kAvx512, {.num_threads = 2, .kv_chunk_size = 50});
          ++checked;
        }
      }
      EXPECT_GT(checked, 0);
      continue;
    }
    const std::vector<Op> ops =
        k.op == KernelOp::kDecode
            ? std::vector<Op>{Op::kBatchDecode, Op::kSingleDecode}
            : std::vector<Op>{Op::kBatchPrefillPaged, Op::kBatchPrefillRagged, Op::kSinglePrefill};
    for (Op op : ops) {
      for (DType kv : kv_dtypes) {
        for (const testing::AttentionVariant& v : testing::attention_variants()) {
          CaseSpec s;
          s.seed = 7 + checked;
          Problem& p = s.problem;
          p.op = op;
          p.num_qo_heads = 8;
          p.num_kv_heads = 2;
          p.head_dim_qk = p.head_dim_vo = 64;
          p.q_dtype = p.o_dtype = DType::kBF16;
          p.kv_dtype = kv;
          p.page_size = 16;
          if (is_fp8(kv)) {
            s.scalars.k_scale = 0.5f;
            s.scalars.v_scale = 2.0f;
          }
          if (is_batch(op)) {
            p.batch_size = 4;
            s.kv_lens = {40, 17, 130, 33};
            if (!is_decode(op)) s.qo_lens = {1, 17, 64, 5};
          } else {
            p.batch_size = 1;
            s.kv_lens = {83};
            if (!is_decode(op)) s.qo_lens = {37};
          }
          v.apply(s);
          if (!testing::variant_applies(v, p) || !k.applies(p).ok()) continue;
          SCOPED_TRACE(std::string(op_name(op)) + "/" + v.name + "/" + std::string(dtype_name(kv)));
          expect_matches_reference(s, CpuIsa::kAvx512);
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 10);
  }
}

}  // namespace
}  // namespace kvattn::cputest
