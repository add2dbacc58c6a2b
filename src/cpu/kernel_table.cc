// The cpu backend's kernel table (kernel_table.h): the one place that says which CPU kernel runs.
#include "cpu/kernel_table.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/status_macros.h"

namespace kvattn::cpu {
namespace {

using detail::CpuFeatures;

Status ok() { return Status::Ok(); }
Status missing(std::string_view feature) {
  return make_error(ErrorCode::kNotSupported, "this CPU lacks ", feature);
}
Status rule(const auto&... parts) { return make_error(ErrorCode::kNotSupported, parts...); }

// --- What the kernels need of the CPU beyond their ISA level.
Status any_cpu(const CpuFeatures&) { return ok(); }
Status has_vbmi(const CpuFeatures& f) { return f.avx512_vbmi ? ok() : missing("AVX512_VBMI"); }
Status has_bf16(const CpuFeatures& f) { return f.avx512_bf16 ? ok() : missing("AVX512_BF16"); }
Status has_bf16_vbmi(const CpuFeatures& f) {
  if (!f.avx512_bf16) return missing("AVX512_BF16");
  return has_vbmi(f);
}
// The amx level's files are built with AVX512_BF16 and VBMI too (src/cpu/CMakeLists.txt).
Status has_amx(const CpuFeatures& f) {
  KVATTN_RETURN_IF_ERROR(has_bf16_vbmi(f));
  return f.amx_bf16 ? ok() : missing("AMX-BF16 tiles granted by the OS");
}
// vdpbf16ps at about the FMA instruction rate (AMD; a quarter of it on the Intel Xeons measured,
// where the fp32-FMA kernels are faster: issue 14).
bool fast_bf16_dot(const CpuFeatures& f) { return f.fast_bf16_dot; }
// Only when named (the AMX kernels on emulated tiles: for tests), or taken as another's taller
// tiles by the plan.
[[maybe_unused]] bool named_only(const CpuFeatures&) { return false; }

// --- What the kernels need of the problem.
Status any_problem(const Problem&) { return ok(); }
bool dims_64_128_256(const Problem& p) {
  const int d = p.head_dim_qk;
  return p.head_dim_vo == d && (d == 64 || d == 128 || d == 256);
}
// The table and dot-product tiles (decode_dot_tiles.h) keep NaN/inf in K/V as they are, so a
// masked key's zero probability times a NaN V must not reach the output: no custom mask; the rows
// are not rotated: no fused RoPE; their tiles are unrolled for head dims 64, 128, 256 (equal).
Status decode_tiles_rule(const Problem& p) {
  if (!dims_64_128_256(p)) {
    return rule("needs equal head dims 64, 128 or 256, not ", p.head_dim_qk, "/", p.head_dim_vo);
  }
  if (p.pos_encoding_mode == PosEncoding::kRopeLlama) return rule("needs no fused RoPE");
  if (p.mask_mode == MaskMode::kCustom) return rule("needs no custom mask");
  return ok();
}
// The bf16 dot products: bf16 queries (exact in bf16: P rounds to their type; a run's q_scale is
// folded into the score scale, DecodeParams) and no fp16 QK rounding.
Status bf16_dot_queries_rule(const Problem& p) {
  if (p.q_dtype != DType::kBF16) return rule("needs bf16 queries, not ", dtype_name(p.q_dtype));
  if (p.use_fp16_qk_reduction) return rule("needs no fp16 QK reduction");
  return ok();
}
Status decode_fp8_table_rule(const Problem& p) {
  if (!is_fp8(p.kv_dtype))
    return rule("needs an FP8 (e4m3/e5m2) cache, not ", dtype_name(p.kv_dtype));
  return decode_tiles_rule(p);
}
Status decode_fp8_bf16_dot_rule(const Problem& p) {
  KVATTN_RETURN_IF_ERROR(decode_fp8_table_rule(p));
  return bf16_dot_queries_rule(p);
}
// The AMX tiles: a padded group of at most 16 rows (one tile's rows or columns). Per-token V
// scales would be folded into the bf16 weights, rounding each token's scale to bf16: the key of
// the largest score (weight exactly 1) then errs by up to 2^-9 of its value where the plain
// baseline does not err at all (one key: `kvattn run --op batch_decode ... --kv-len 1
// --kv-scale-granularity per_token_head --check` failed at 0.0036 against a bound of 3e-5). The
// dot-product kernel takes those caches with each weight split into two bf16 (DotTiles::pv).
Status decode_fp8_amx_rule(const Problem& p) {
  KVATTN_RETURN_IF_ERROR(decode_fp8_bf16_dot_rule(p));
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    return rule("needs per-tensor or per-head scales");
  }
  if (p.group_size() > 16) return rule("needs a GQA group of at most 16, not ", p.group_size());
  return ok();
}
Status decode_bf16_dot_rule(const Problem& p) {
  if (p.kv_dtype != DType::kBF16) return rule("needs a bf16 cache, not ", dtype_name(p.kv_dtype));
  KVATTN_RETURN_IF_ERROR(decode_tiles_rule(p));
  return bf16_dot_queries_rule(p);
}
// The bf16 dot products round P to bf16, which bf16 queries allow; q and K/V widen exactly to
// bf16, and neither the rotation nor the fp16 rounding of the raw dot may change them first.
Status prefill_bf16_dot_rule(const Problem& p) {
  if (p.q_dtype != DType::kBF16) return rule("needs bf16 queries, not ", dtype_name(p.q_dtype));
  if (p.kv_dtype != DType::kBF16 && !is_fp8(p.kv_dtype)) {
    return rule("needs a bf16 or FP8 cache, not ", dtype_name(p.kv_dtype));
  }
  if (p.pos_encoding_mode == PosEncoding::kRopeLlama) return rule("needs no fused RoPE");
  if (p.use_fp16_qk_reduction) return rule("needs no fp16 QK reduction");
  if (p.head_dim_qk % 2 != 0) return rule("needs an even head_dim_qk, not ", p.head_dim_qk);
  return ok();
}
// The AMX tiles take 32 dims a step and 16 value columns a tile. Per-token V scales: its P tiles
// are one bf16 each, which would round the scale folded in (the dot-product kernel keeps each
// weight as two bf16: softmax_pack<true>, bf16_pairs.h).
Status prefill_amx_rule(const Problem& p) {
  KVATTN_RETURN_IF_ERROR(prefill_bf16_dot_rule(p));
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    return rule("needs per-tensor or per-head scales");
  }
  if (p.head_dim_qk % 32 != 0 || p.head_dim_vo % 32 != 0) {
    return rule("needs head dims that are multiples of 32, not ", p.head_dim_qk, "/",
                p.head_dim_vo);
  }
  return ok();
}
Status mla_bf16_rule(const Problem& p, int kpe_multiple) {
  if (p.q_dtype != DType::kBF16) return rule("needs bf16 queries, not ", dtype_name(p.q_dtype));
  if (p.kv_dtype != DType::kBF16 && !is_fp8(p.kv_dtype)) {
    return rule("needs a bf16 or FP8 cache, not ", dtype_name(p.kv_dtype));
  }
  const int heads = p.num_qo_heads;
  if (heads % 16 != 0 || heads > kMlaMaxRows) {
    return rule("needs a multiple of 16 heads up to ", kMlaMaxRows, ", not ", heads);
  }
  if (p.head_dim_ckv % 64 != 0 || p.head_dim_kpe % kpe_multiple != 0 ||
      p.head_dim_ckv + p.head_dim_kpe > 1024) {
    return rule("needs D_ckv % 64 == 0, D_kpe % ", kpe_multiple,
                " == 0 and D_ckv + D_kpe <= 1024,"
                " not ",
                p.head_dim_ckv, "/", p.head_dim_kpe);
  }
  return ok();
}
// The AVX2 kernel computes in f32: any 16-bit or f32 query over a 16-bit or FP8 cache.
Status mla_avx2_rule(const Problem& p) {
  if (p.q_dtype != DType::kBF16 && p.q_dtype != DType::kF16 && p.q_dtype != DType::kF32) {
    return rule("needs bf16, f16 or f32 queries, not ", dtype_name(p.q_dtype));
  }
  if (p.kv_dtype != DType::kBF16 && p.kv_dtype != DType::kF16 && !is_fp8(p.kv_dtype)) {
    return rule("needs a bf16, f16 or FP8 cache, not ", dtype_name(p.kv_dtype));
  }
  const int heads = p.num_qo_heads;
  if (heads % 8 != 0 || heads > kMlaMaxRows) {
    return rule("needs a multiple of 8 heads up to ", kMlaMaxRows, ", not ", heads);
  }
  if (p.head_dim_ckv % 8 != 0 || p.head_dim_kpe % 8 != 0) {
    return rule("needs D_ckv % 8 == 0 and D_kpe % 8 == 0, not ", p.head_dim_ckv, "/",
                p.head_dim_kpe);
  }
  return ok();
}
Status mla_amx_rule(const Problem& p) { return mla_bf16_rule(p, 32); }
Status mla_avx512_bf16_rule(const Problem& p) { return mla_bf16_rule(p, 16); }

// --- Entries.
DecodeItemFn decode_scalar(const Problem& p, int gp) {
  return find_decode_kernel_scalar(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp);
}
MlaItemFn mla_portable(const MlaParams&) { return mla_item_portable; }
#if defined(__x86_64__)
DecodeItemFn decode_avx2(const Problem& p, int gp) {
  return find_decode_kernel_avx2(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp);
}
DecodeItemFn decode_avx512(const Problem& p, int gp) {
  return find_decode_kernel_avx512(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp);
}
DecodeItemFn decode_fp8_table_fma(const Problem& p, int gp) {
  return find_decode_kernel_fp8_table_avx512(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp, false);
}
DecodeItemFn decode_fp8_table_bf16_dot(const Problem& p, int gp) {
  return find_decode_kernel_fp8_table_avx512(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp, true);
}
DecodeItemFn decode_fp8_amx(const Problem& p, int gp) {
  return find_decode_kernel_fp8_amx(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp);
}
#if defined(KVATTN_CPU_AMX_EMULATION)
DecodeItemFn decode_fp8_amx_emulated(const Problem& p, int gp) {
  return find_decode_kernel_fp8_amx_emulated(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp);
}
#endif
DecodeItemFn decode_bf16_dot(const Problem& p, int gp) {
  return find_decode_kernel_bf16_dot_avx512(p.kv_dtype, p.head_dim_qk, p.head_dim_vo, gp);
}
#endif

using RunsOn = Status (*)(const CpuFeatures&);
using Applies = Status (*)(const Problem&);
using Preferred = bool (*)(const CpuFeatures&);

constexpr CpuKernel decode_kernel(std::string_view name, CpuIsa isa, RunsOn runs_on,
                                  Applies applies, Preferred preferred,
                                  DecodeItemFn (*entry)(const Problem&, int),
                                  std::string_view strided) {
  return {.name = name,
          .op = KernelOp::kDecode,
          .isa = isa,
          .runs_on = runs_on,
          .applies = applies,
          .preferred = preferred,
          .decode = entry,
          .strided = strided};
}
constexpr CpuKernel prefill_kernel(std::string_view name, CpuIsa isa, RunsOn runs_on,
                                   Applies applies, Preferred preferred,
                                   prefill::PrefillItemFn (*entry)(), std::string_view strided,
                                   prefill::TilePolicy tile = {}, std::string_view taller = "") {
  return {.name = name,
          .op = KernelOp::kPrefill,
          .isa = isa,
          .runs_on = runs_on,
          .applies = applies,
          .preferred = preferred,
          .prefill = entry,
          .strided = strided,
          .tile = tile,
          .taller = taller};
}
constexpr CpuKernel mla_kernel(std::string_view name, CpuIsa isa, RunsOn runs_on, Applies applies,
                               MlaItemFn (*entry)(const MlaParams&), std::string_view strided,
                               Preferred preferred = nullptr) {
  return {.name = name,
          .op = KernelOp::kMla,
          .isa = isa,
          .runs_on = runs_on,
          .applies = applies,
          .preferred = preferred,
          .mla = entry,
          .strided = strided};
}

constexpr std::string_view kDecodePortable = "decode-scalar-k32";
constexpr std::string_view kPrefillFma512 = "prefill-avx512-fma-r128k64";
constexpr std::string_view kMlaPortable = "mla-scalar-f32";

// Names: op, ISA (and the extension the kernel is built on), arithmetic, and the tile policy
// (decode: kDecodeTileKeys keys a tile; prefill: its TilePolicy's rows x keys; MLA:
// kMlaTileKeys keys shared by all heads).
constexpr auto kKernels = std::to_array<CpuKernel>({
#if defined(__x86_64__)
  // Not measured yet (no AMX CPU in the sessions since it was built): named only until an A/B
  // on one says where it wins.
  decode_kernel("decode-amx-bf16-fp8table-k32", CpuIsa::kAvx512, has_amx, decode_fp8_amx_rule,
                named_only, decode_fp8_amx, kDecodePortable),
#if defined(KVATTN_CPU_AMX_EMULATION)
      decode_kernel("decode-amx-bf16-fp8table-k32-emulated", CpuIsa::kAvx512, has_bf16_vbmi,
                    decode_fp8_amx_rule, named_only, decode_fp8_amx_emulated, kDecodePortable),
#endif
      decode_kernel("decode-avx512bf16-fp8table-dot-k32", CpuIsa::kAvx512, has_bf16_vbmi,
                    decode_fp8_bf16_dot_rule, fast_bf16_dot, decode_fp8_table_bf16_dot,
                    kDecodePortable),
      decode_kernel("decode-avx512bf16-dot-k32", CpuIsa::kAvx512, has_bf16, decode_bf16_dot_rule,
                    fast_bf16_dot, decode_bf16_dot, kDecodePortable),
      decode_kernel("decode-avx512vbmi-fp8table-fma-k32", CpuIsa::kAvx512, has_vbmi,
                    decode_fp8_table_rule, nullptr, decode_fp8_table_fma, kDecodePortable),
      decode_kernel("decode-avx512-fma-k32", CpuIsa::kAvx512, any_cpu, any_problem, nullptr,
                    decode_avx512, kDecodePortable),
      decode_kernel("decode-avx2-fma-k32", CpuIsa::kAvx2, any_cpu, any_problem, nullptr,
                    decode_avx2, kDecodePortable),
#endif
      decode_kernel(kDecodePortable, CpuIsa::kScalar, any_cpu, any_problem, nullptr, decode_scalar,
                    ""),
#if defined(__x86_64__)
      prefill_kernel("prefill-amx-bf16-r256k128", CpuIsa::kAvx512, has_amx, prefill_amx_rule,
                     nullptr, prefill::prefill_item_fn_amx, kPrefillFma512, {256, 128}),
#if defined(KVATTN_CPU_AMX_EMULATION)
      prefill_kernel("prefill-amx-bf16-r256k128-emulated", CpuIsa::kAvx512, has_bf16_vbmi,
                     prefill_amx_rule, named_only, prefill::prefill_item_fn_amx_emulated,
                     kPrefillFma512, {256, 128}),
#endif
      // Taller tiles share each staged K and V pair tile among more rows. Their time against 128
      // rows, AMD Zen 4, 2 threads, causal, bf16 queries (issue 23's note of 2026-12-07 15:00;
      // 256 / 512 rows): 4096 tokens d 128 0.93-0.95x / 0.90-0.95x, d 64 0.94x / 0.92x, d 256
      // 0.94-0.96x / 0.96-0.98x (so 256 there: 512 rows' scratch is past 1 MiB), an e4m3 cache
      // 0.93x / 0.92x; 64 x 128 tokens 0.96-0.98x / 0.96x; 16 x 512 0.89x (256).
      prefill_kernel("prefill-avx512bf16-dot-r128k64", CpuIsa::kAvx512, has_bf16,
                     prefill_bf16_dot_rule, fast_bf16_dot, prefill::prefill_item_fn_avx512_bf16,
                     kPrefillFma512, {}, "prefill-avx512bf16-dot-r256k64"),
      prefill_kernel("prefill-avx512bf16-dot-r256k64", CpuIsa::kAvx512, has_bf16,
                     prefill_bf16_dot_rule, named_only, prefill::prefill_item_fn_avx512_bf16,
                     kPrefillFma512, {.target_rows = 256}, "prefill-avx512bf16-dot-r512k64"),
      prefill_kernel("prefill-avx512bf16-dot-r512k64", CpuIsa::kAvx512, has_bf16,
                     prefill_bf16_dot_rule, named_only, prefill::prefill_item_fn_avx512_bf16,
                     kPrefillFma512, {.target_rows = 512}),
      prefill_kernel(kPrefillFma512, CpuIsa::kAvx512, any_cpu, any_problem, nullptr,
                     prefill::prefill_item_fn_avx512, ""),
      prefill_kernel("prefill-avx2-fma-r128k64", CpuIsa::kAvx2, any_cpu, any_problem, nullptr,
                     prefill::prefill_item_fn_avx2, "", {.odd_staged_pitch = true}),
      // Zen 3's kernel with 256-row tiles, named only: on Zen 4 it ran 0.955-0.97x the 128-row
      // time at 4096 tokens, 0.87x at 16 x 512, 0.95-1.16x at 64 x 128 (causal d 128, two
      // A/Bs of 6 rounds, the host noisy); Zen 3, whose L2 (512 KiB) holds less of
      // its f32 scratch (~460 KiB at d 128), is not measured with it, so it is not r128k64's
      // taller there until a Zen 3 A/B says so (KVATTN_CPU_KERNEL=prefill-avx2-fma-r256k64).
      prefill_kernel("prefill-avx2-fma-r256k64", CpuIsa::kAvx2, any_cpu, any_problem, named_only,
                     prefill::prefill_item_fn_avx2, "",
                     {.target_rows = 256, .odd_staged_pitch = true}),
#endif
      prefill_kernel("prefill-scalar-r128k64", CpuIsa::kScalar, any_cpu, any_problem, nullptr,
                     prefill::prefill_item_fn_scalar, ""),
#if defined(__x86_64__)
      mla_kernel("mla-amx-bf16-k128", CpuIsa::kAvx512, has_amx, mla_amx_rule, find_mla_kernel_amx,
                 kMlaPortable),
#if defined(KVATTN_CPU_AMX_EMULATION)
      mla_kernel("mla-amx-bf16-k128-emulated", CpuIsa::kAvx512, has_bf16_vbmi, mla_amx_rule,
                 find_mla_kernel_amx_emulated, kMlaPortable, named_only),
#endif
      mla_kernel("mla-avx512bf16-dot-k128", CpuIsa::kAvx512, has_bf16, mla_avx512_bf16_rule,
                 find_mla_kernel_avx512_bf16, kMlaPortable),
      mla_kernel("mla-avx2-fma-f32-k64", CpuIsa::kAvx2, any_cpu, mla_avx2_rule,
                 find_mla_kernel_avx2, kMlaPortable),
#endif
      mla_kernel(kMlaPortable, CpuIsa::kScalar, any_cpu, any_problem, mla_portable, ""),
});

struct Override {
  std::string name;  // empty: none
  bool only_where_it_applies = false;
};
std::mutex g_override_mutex;
Override g_override;  // set_cpu_kernel_override's
bool g_override_set = false;

// Read at every plan (a getenv is nothing beside a plan), so a test or a shell sets it at will.
Override current_override() {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  if (g_override_set) return g_override;
  const char* env = std::getenv("KVATTN_CPU_KERNEL");
  return {env ? std::string(env) : std::string(), false};
}

std::string all_names() {
  std::string names = "reference";
  for (const CpuKernel& k : kKernels) names += ", " + std::string(k.name);
  return names;
}

}  // namespace

std::string_view kernel_op_name(KernelOp op) {
  switch (op) {
    case KernelOp::kDecode:
      return "decode";
    case KernelOp::kPrefill:
      return "prefill";
    case KernelOp::kMla:
      return "mla";
  }
  return "?";
}

KernelOp kernel_op_of(const Problem& problem) {
  if (is_mla(problem.op)) return KernelOp::kMla;
  if (is_decode(problem.op)) return KernelOp::kDecode;
  return KernelOp::kPrefill;
}

std::span<const CpuKernel> cpu_kernels() { return kKernels; }

const CpuKernel* find_cpu_kernel(std::string_view name) {
  for (const CpuKernel& k : kKernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

const CpuKernel& portable_cpu_kernel(KernelOp op) {
  const CpuKernel* last = nullptr;
  for (const CpuKernel& k : kKernels) {
    if (k.op == op) last = &k;
  }
  return *last;  // every op ends with its scalar kernel
}

const CpuKernel& strided_cpu_kernel(const CpuKernel& k) {
  if (k.strided.empty()) return k;
  return *find_cpu_kernel(k.strided);  // the table's own names (kernel_table_test checks them)
}

Status kernel_runs_on(const CpuKernel& k, CpuIsa isa, const CpuFeatures& cpu) {
  if (k.isa > isa) {
    return make_error(ErrorCode::kNotSupported, "it needs ISA level ", cpu_isa_name(k.isa),
                      ", the plan's is ", cpu_isa_name(isa));
  }
  return k.runs_on(cpu);
}

CpuIsa plan_isa(const Device& device) { return std::min(device.isa, detail::effective_cpu_isa()); }

Status choose_cpu_kernel(const Problem& problem, CpuIsa isa, const CpuKernel** out) {
  return choose_cpu_kernel(problem, isa, detail::cpu_features(), out);
}

Status choose_cpu_kernel(const Problem& problem, CpuIsa isa, const CpuFeatures& cpu,
                         const CpuKernel** out) {
  const KernelOp op = kernel_op_of(problem);
  const Override over = current_override();
  const std::string& forced = over.name;
  if (forced == "reference") {
    *out = &portable_cpu_kernel(op);
    return Status::Ok();
  }
  if (!forced.empty()) {
    const CpuKernel* k = find_cpu_kernel(forced);
    if (k == nullptr) {
      return make_error(ErrorCode::kInvalidArgument, "KVATTN_CPU_KERNEL=", forced,
                        " is not a cpu kernel (expected one of: ", all_names(), ")");
    }
    if (k->op == op) {
      Status here = kernel_runs_on(*k, isa, cpu);
      // The tests' hook also takes the default where they lowered the ISA level below it.
      if (!here.ok() && !over.only_where_it_applies) {
        return make_error(ErrorCode::kNotSupported, "KVATTN_CPU_KERNEL=", forced,
                          " cannot run here: ", here.message());
      }
      Status fits = k->applies(problem);
      if (here.ok() && fits.ok()) {
        *out = k;
        return Status::Ok();
      }
      if (!over.only_where_it_applies) {
        return make_error(ErrorCode::kNotSupported, "KVATTN_CPU_KERNEL=", forced,
                          " does not apply to this problem: it ", fits.message());
      }
    }
    // A kernel of another op (or, for tests, one that does not apply): the default choice.
  }
  for (const CpuKernel& k : kKernels) {
    if (k.op != op || !kernel_runs_on(k, isa, cpu).ok() || !k.applies(problem).ok()) continue;
    if (k.preferred != nullptr && !k.preferred(cpu)) continue;
    *out = &k;
    return Status::Ok();
  }
  *out = &portable_cpu_kernel(op);
  return Status::Ok();
}

bool cpu_kernel_forced(KernelOp op) {
  const Override over = current_override();
  if (over.name == "reference") return true;
  const CpuKernel* k = over.name.empty() ? nullptr : find_cpu_kernel(over.name);
  return k != nullptr && k->op == op;
}

std::vector<const CpuKernel*> taller_cpu_kernels(const CpuKernel& k) {
  std::vector<const CpuKernel*> out;
  for (const CpuKernel* at = &k; !at->taller.empty();) {
    at = find_cpu_kernel(at->taller);  // the table's own names (kernel_table_test checks them)
    out.push_back(at);
  }
  return out;
}

void set_cpu_kernel_override(std::string_view name, bool only_where_it_applies) {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  g_override = {std::string(name), only_where_it_applies};
  g_override_set = true;
}

void clear_cpu_kernel_override() {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  g_override = {};
  g_override_set = false;
}

Status planned_cpu_kernel(const std::string& name, KernelOp op, const CpuKernel** out) {
  const CpuKernel* k = find_cpu_kernel(name);
  if (k == nullptr || k->op != op) {
    return make_error(ErrorCode::kInternal, "cpu: the plan names kernel '", name,
                      "', which is not a ", kernel_op_name(op), " kernel of this build");
  }
  *out = k;
  return Status::Ok();
}

}  // namespace kvattn::cpu
