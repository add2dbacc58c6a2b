// fa3's kernel body replayed on the CPU (fa3_replay.h).
#include "cuda/fa3/fa3_replay.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <vector>

#include "core/backend.h"
#include "core/numeric.h"
#include "core/status_macros.h"
#include "cuda/fa3/kernel_params.h"
#include "cuda/fa3/fa3_emu_ops.h"
#include "cuda/fa3/fa3_replay_ctas.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/tile_size.h"

namespace kvattn::fa3 {
namespace {

// A tensor map's element type (its size is what TMA uses): FP8 K/V are encoded as bytes.
emu::WgmmaType map_type(DType d) {
  if (d == DType::kE4M3) return emu::WgmmaType::kE4m3;
  if (d == DType::kE5M2) return emu::WgmmaType::kE5m2;
  return d == DType::kF16 ? emu::WgmmaType::kF16 : emu::WgmmaType::kBf16;
}

}  // namespace

bool replay_kernel(const KernelKey& key, const PrefillParams& k, int ctas, bool early) {
  return replay_kernel16(key, k, ctas, early) || replay_kernel8(key, k, ctas, early);
}

testing::RunBackend run_replay(const ReplayOptions& o) {
  return [o](const Problem& p, const AttentionArgs& args) -> Status {
    PlanOptions options;
    options.backend = "fa3";
    options.device = Device::parse("cuda:sm90").value();
    options.kv_chunk_size = o.kv_chunk_size;
    Plan plan;
    KVATTN_RETURN_IF_ERROR(fa3_backend().plan(p, args, options, &plan));
    // The emulated maps the parameters' CUtensorMaps point at (fa3_emu_ops.h).
    std::deque<emu::TensorMap> maps;
    const EncodeKvMap encode = [&maps](CUtensorMap* cu, const KvMapSpec& m) {
      const uint32_t es[4] = {1, 1, 1, 1};
      maps.push_back(emu::encode_tensor_map_tiled(map_type(m.dtype), 4, m.data, m.dims, m.strides,
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
    // The workspace run() copies to the device, here on the host.
    PrefillParams& k = in.params;
    k.requests = in.requests.data();
    k.tiles = in.tiles.data();
    k.kv_indices = in.kv_indices.empty() ? nullptr : in.kv_indices.data();
    const std::size_t states = std::size_t(in.split.num_states) * std::size_t(p.num_qo_heads);
    std::vector<float> partial_o(states * std::size_t(p.head_dim_vo), NAN);
    std::vector<float> partial_lse(states, NAN);
    k.partial_o = partial_o.data();
    k.partial_lse = partial_lse.data();
    // The K/V blocks the tile list asks for (ReplayCounters::kv_blocks): what the scheduler gives
    // every tile (tile_scheduler.h), as the kernel's producer and consumers take it.
    const int block_n =
        tile_shape(p.head_dim_qk, p.head_dim_vo, is_fp8(p.kv_dtype) ? 1 : 2).block_n;
    for (const sched::Tile& tile : in.tiles) {
      const RequestInfo& r = in.requests[std::size_t(tile.request)];
      const sched::KvRange kr =
          sched::tile_kv_range(tile, r.qo_len, r.kv_len, k.causal, k.window_left, block_n,
                               k.rows_per_token, r.chunks, k.chunk_blocks);
      if (kr.end > kr.begin) emu::replay_counters().kv_blocks += kr.end - kr.begin;
    }
    // The Q rows the tile list asks for (ReplayCounters::q_rows): each tile's 64 rows per
    // computing consumer warpgroup, padding included (the Q warp zero-fills rows past qo_len).
    emu::replay_counters().q_rows +=
        int64_t(in.tiles.size()) * k.consumer_warpgroups * frag::kWarpgroupRows;
    try {
      if (!replay_kernel(kernel_key(p), k, std::min(o.ctas, k.num_tiles), o.tma_lands_early)) {
        return make_error(ErrorCode::kUnavailable, "replay: no kernel for ",
                          kernel_key_string(kernel_key(p)));
      }
    } catch (const emu::EmulatorError& e) {
      return make_error(ErrorCode::kInternal, "replay: ", e.what());
    }
    // The split-KV merge kernel's grid, CTA by CTA (cuda/common/split_merge.h: its body).
    cuda::merge_on_host(merge_params(k, in.split.merge_rows.data(), in.split, p));
    return Status::Ok();
  };
}

}  // namespace kvattn::fa3
