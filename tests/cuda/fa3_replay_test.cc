// fa3's kernel body (src/cuda/fa3/kernels/prefill_cta.h) run on the CPU: the exact code the GPU
// runs, over the SM90 CTA emulator (sm90_emulator.h: three warpgroups as fibers; wgmma with its
// descriptors and fence / commit / wait rules, mbarrier phases, TMA boxes through tensor maps
// checked against cuTensorMapEncodeTiled's rules, cp.async, per-byte proxy fences, named
// barriers, setmaxnreg; fa3_emu_ops.h binds the body's operations to it), with the plan of fa3's
// own plan() and the parameters of the same host function as run() (kernel_params.h), against
// the fp64 reference with the precision-following tolerance of testing/tolerance.h. The split-KV
// merge runs merge.cuh's element function (merge_row.h) on the host.
//
// CI runs a reduced grid; KVATTN_FA3_REPLAY_FULL=1 runs the full one (every declared key in
// every test, both TMA landing schedules everywhere).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/capability.h"
#include "core/status_macros.h"
#include "cuda/fa3/capability.h"
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/kernel_params.h"
#include "cuda/fa3/kernels/merge_row.h"
#include "cuda/fa3/kernels/prefill_cta.h"
#include "cuda/fa3_emu_ops.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"
#include "testing/variants.h"

namespace kvattn::fa3 {
namespace {

bool full_grid() {
  const char* v = std::getenv("KVATTN_FA3_REPLAY_FULL");
  return v != nullptr && std::string(v) == "1";
}

struct ReplayOptions {
  int64_t kv_chunk_size = 0;  // PlanOptions::kv_chunk_size: 0 the planner's choice
  int ctas = 2;               // persistent CTAs (each walks every ctas-th tile)
  bool tma_lands_early = false;
};

// The kernel body of one key on `ctas` emulated CTAs, one after the other (CTAs share nothing
// but global memory, which the body only reads, or writes disjointly).
template <class Tag, int QK, int VO>
void run_ctas(const PrefillParams& k, int ctas, bool early) {
  using Plan = SmemPlan<Elem<Tag>::kBytes, QK, VO>;
  for (int c = 0; c < ctas; ++c) {
    emu::Sm90Launch l;
    l.threads = kThreads;
    l.smem_bytes = Plan::total();
    l.regs_per_thread = kLaunchRegs;
    l.tma_lands_early = early;
    emu::Sm90Cta cta(l);
    cta.run([&](emu::Sm90Ops& ops, unsigned char* smem) {
      prefill_cta<Tag, QK, VO>(emu::Fa3EmuOps(ops, c, ctas), k, smem);
    });
  }
}

bool dispatch(const KernelKey& key, const PrefillParams& k, int ctas, bool early) {
  const auto is = [&](DType q, DType kv, int dqk, int dvo) {
    return key == KernelKey{q, kv, dqk, dvo};
  };
  if (is(DType::kBF16, DType::kBF16, 128, 128)) {
    run_ctas<cuda::Bf16Tag, 128, 128>(k, ctas, early);
  } else if (is(DType::kE4M3, DType::kE4M3, 128, 128)) {
    run_ctas<E4m3Tag, 128, 128>(k, ctas, early);
  } else {
    return false;
  }
  return true;
}

emu::WgmmaType map_type(DType d) {
  return d == DType::kF16 ? emu::WgmmaType::kF16 : emu::WgmmaType::kBf16;
}

void store_out_host(const PrefillParams& p, int64_t offset, float x) {
  switch (p.out_kind) {
    case OutKind::kF32:
      static_cast<float*>(p.out)[offset] = x;
      break;
    case OutKind::kF16:
      static_cast<uint16_t*>(p.out)[offset] = num::f32_to_f16(x);
      break;
    case OutKind::kBF16:
      static_cast<uint16_t*>(p.out)[offset] = num::f32_to_bf16(x);
      break;
  }
}

// A RunBackend (testing/tolerance.h) that plans with fa3's plan() for an SM90 and runs fa3's
// kernel body on the emulator.
testing::RunBackend run_replay(const ReplayOptions& o) {
  return [o](const Problem& p, const AttentionArgs& args) -> Status {
    PlanOptions options;
    options.backend = "fa3";
    options.device = Device::parse("cuda:sm90").value();
    options.kv_chunk_size = o.kv_chunk_size;
    Plan plan;
    KVATTN_RETURN_IF_ERROR(fa3_backend().plan(p, args, options, &plan));
    std::deque<emu::TensorMap> maps;  // the emulated maps the CUtensorMaps point at
    const EncodeKvMap encode = [&maps](CUtensorMap* cu, const KvMapSpec& m) {
      const uint32_t es[3] = {1, 1, 1};
      maps.push_back(emu::encode_tensor_map_tiled(map_type(m.dtype), 3, m.data, m.dims, m.strides,
                                                  m.box, es, emu::Swizzle::k128B));
      emu::store_emulated_map(cu, &maps.back());
      return true;
    };
    KernelInputs in;
    try {
      KVATTN_RETURN_IF_ERROR(make_kernel_inputs(plan, args, encode, &in));
    } catch (const emu::EmulatorError& e) {
      return make_error(ErrorCode::kInternal, "replay: tensor map: ", e.what());
    }
    if (in.tiles.empty()) return Status::Ok();
    PrefillParams& k = in.params;
    k.requests = in.requests.data();
    k.tiles = in.tiles.data();
    k.kv_indices = in.kv_indices.empty() ? nullptr : in.kv_indices.data();
    const std::size_t states = std::size_t(in.split.num_states) * std::size_t(p.num_qo_heads);
    std::vector<float> partial_o(states * std::size_t(p.head_dim_vo), NAN);
    std::vector<float> partial_lse(states, NAN);
    k.partial_o = partial_o.data();
    k.partial_lse = partial_lse.data();
    try {
      if (!dispatch(kernel_key(p), k, std::min(o.ctas, k.num_tiles), o.tma_lands_early)) {
        return make_error(ErrorCode::kUnavailable, "replay: no host instance for ",
                          kernel_key_string(kernel_key(p)));
      }
    } catch (const emu::EmulatorError& e) {
      return make_error(ErrorCode::kInternal, "replay: ", e.what());
    }
    for (const split_kv::MergeRow& row : in.split.merge_rows) {
      for (int h = 0; h < p.num_qo_heads; ++h) {
        for (int d = 0; d < p.head_dim_vo; ++d) {
          const MergedElement m = merge_element(row, k, h, d, p.head_dim_vo);
          store_out_host(k, row.out_row * k.o_stride_row + h * k.o_stride_head + d, m.o);
          if (k.lse && d == 0)
            k.lse[row.out_row * k.lse_stride_row + h * k.lse_stride_head] = m.lse;
        }
      }
    }
    return Status::Ok();
  };
}

// The GPU test's case (tests/cuda/gpu/fa3_attention_test.cc): a scaled FP8 query and cache, as
// an engine keeps them, with bf16 output.
testing::CaseSpec spec_for(const KernelKey& key, Op op, std::vector<int64_t> qo,
                           std::vector<int64_t> kv, int qo_heads = 8, int kv_heads = 2) {
  testing::CaseSpec s;
  s.problem.op = op;
  s.problem.batch_size = int(kv.size());
  s.problem.num_qo_heads = qo_heads;
  s.problem.num_kv_heads = kv_heads;
  s.problem.head_dim_qk = key.head_dim_qk;
  s.problem.head_dim_vo = key.head_dim_vo;
  s.problem.q_dtype = key.q;
  s.problem.kv_dtype = key.kv;
  s.problem.o_dtype = key.q;
  s.problem.page_size = 16;
  s.qo_lens = std::move(qo);
  s.kv_lens = std::move(kv);
  if (is_fp8(key.kv)) {
    s.problem.o_dtype = DType::kBF16;
    s.problem.q_scale = 0.25f;
    s.problem.k_scale = 0.5f;
    s.problem.v_scale = 2.0f;
  }
  return s;
}

testing::CheckResult replay(const testing::CaseSpec& spec, const ReplayOptions& o = {}) {
  testing::Case c = testing::Case::make(spec);
  return testing::check_against_reference(c, run_replay(o));
}

void expect_matches(const testing::CaseSpec& spec, const std::string& what,
                    const ReplayOptions& o = {}) {
  const testing::CheckResult r = replay(spec, o);
  EXPECT_TRUE(r.ok) << what << " [" << spec.problem.to_string() << "]: " << r.message;
}

const KernelKey kBf16D128{DType::kBF16, DType::kBF16, 128, 128};
const KernelKey kE4m3D128{DType::kE4M3, DType::kE4M3, 128, 128};

TEST(Fa3Replay, FirstCaseBf16Prefill) {
  testing::CaseSpec s = spec_for(kBf16D128, Op::kBatchPrefillPaged, {17, 130}, {40, 300});
  s.problem.mask_mode = MaskMode::kCausal;
  s.problem.return_lse = true;
  expect_matches(s, "paged prefill bf16 d128");
}

}  // namespace
}  // namespace kvattn::fa3
