// fa2's operations that are not attention: merging attention states, appending to a paged cache
// (quantizing to FP8) and RoPE by positions. Elementwise kernels over generic strides; the index
// tensors are host memory, resolved on the host into per-row device arrays. Every allocation,
// copy and launch goes to OpOptions::stream through RuntimeCalls; the caller's device is
// restored on return.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/attention_math.h"
#include "core/numeric.h"
#include "core/paged_kv.h"
#include "cuda/common/element_io.cuh"
#include "cuda/fa2/launch.h"
#include "cuda/fa2/launch_kernel.h"
#include "cuda/fa2/runtime_calls.h"

namespace kvattn::fa2 {
namespace {

constexpr int kThreads = 256;

// Per-call device scratch, allocated and freed in the order of the call's stream, so that a call
// returns before the GPU is done with it.
class StreamBuffer {
 public:
  explicit StreamBuffer(void* stream) : stream_(stream) {}
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  ~StreamBuffer() {
    if (ptr_) (void)runtime().free_async(ptr_, stream_);
  }
  // Allocates and copies a host vector (pageable: the runtime stages it before returning).
  template <class T>
  Status upload(const std::vector<T>& host) {
    if (host.empty()) return Status::Ok();
    const std::size_t bytes = host.size() * sizeof(T);
    KVATTN_RETURN_IF_ERROR(
        runtime_status("cudaMallocAsync", runtime().malloc_async(&ptr_, bytes, stream_)));
    return runtime_status("cudaMemcpyAsync",
                          runtime().copy_to_device_async(ptr_, host.data(), bytes, stream_));
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* stream_;
  void* ptr_ = nullptr;
};

cuda::Strides4 strides_of(const TensorView& t) {
  cuda::Strides4 s;
  for (int i = 0; i < t.rank && i < 4; ++i) s.s[i] = t.strides[i];
  return s;
}

Dim3 blocks_for(int64_t n) { return Dim3{unsigned((n + kThreads - 1) / kThreads)}; }
constexpr Dim3 kBlock{kThreads};

Status expect_device(std::initializer_list<const TensorView*> views) {
  for (const TensorView* t : views) {
    if (!t->empty() && t->memory != MemoryKind::kCuda) {
      return make_error(ErrorCode::kInvalidArgument,
                        "fa2: the tensors of this operation must be in CUDA device memory "
                        "(the index tensors in host memory)");
    }
  }
  return Status::Ok();
}
Status expect_host(const TensorView& t, const char* name) {
  if (t.empty() || t.memory == MemoryKind::kHost) return Status::Ok();
  return make_error(ErrorCode::kInvalidArgument, "fa2: ", name, " must be in host memory");
}

std::vector<int32_t> read_i32(const TensorView& t) {
  std::vector<int32_t> v(size_t(t.shape[0]));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<const int32_t*>(t.data)[i * t.strides[0]];
  return v;
}

struct StateView {
  const void* v;
  DType v_dtype;
  cuda::Strides4 vs;
  const float* s;
  cuda::Strides4 ss;
};
struct OutView {
  void* v;
  DType v_dtype;
  cuda::Strides4 vs;
  float* s;  // may be null
  cuda::Strides4 ss;
};

// Rows x heads x dims threads; each merges `states` states of its (row, head) for its dim.
// states_axis: the merge_states layout [N, S, H, D] (true) or two separate tensors (false).
__global__ void merge_kernel(StateView a, StateView b, bool states_axis, int64_t states,
                             int64_t rows, int64_t heads, int64_t dim, OutView out) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * heads * dim) return;
  const int64_t d = idx % dim, h = (idx / dim) % heads, n = idx / (dim * heads);
  math::StateMerger merger;
  float o = 0.0f;
  bool nan = false;
  for (int64_t k = 0; k < states; ++k) {
    const StateView& sv = states_axis || k == 0 ? a : b;
    const float lse = states_axis ? sv.s[sv.ss.at(n, k, h)] : sv.s[sv.ss.at(n, h)];
    if (lse != lse) nan = true;
    // A state that saw no key is skipped, not multiplied by 0: its o may hold anything.
    if (lse == -INFINITY) continue;
    const float v = states_axis ? cuda::load_f32(sv.v, sv.v_dtype, sv.vs.at(n, k, h, d))
                                : cuda::load_f32(sv.v, sv.v_dtype, sv.vs.at(n, h, d));
    float scale_acc = 0.0f, scale_k = 0.0f;
    merger.add(lse, &scale_acc, &scale_k);
    o = o * scale_acc + v * scale_k;
  }
  const float lse = nan ? NAN : merger.lse();
  o = nan ? NAN : o * merger.inv_sum();
  cuda::store_f32(out.v, out.v_dtype, out.vs.at(n, h, d), o);
  if (out.s && d == 0) out.s[out.ss.at(n, h)] = lse;
}

// One thread per (token, head, dim) of append_k or append_v; page_slot[i] = (page, slot).
__global__ void append_kernel(const void* src, DType src_dtype, cuda::Strides4 src_strides,
                              int64_t nnz, int64_t heads, int64_t dim, const int64_t* page_slot,
                              void* cache, DType cache_dtype, paged::CacheStrides cache_strides,
                              float scale) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= nnz * heads * dim) return;
  const int64_t d = idx % dim, h = (idx / dim) % heads, i = idx / (dim * heads);
  if (page_slot[2 * i] < 0) return;  // a padded row (batch index -1)
  // Divided, not multiplied by a reciprocal: stored = round(real / scale) exactly as the other
  // backends quantize (x * (1/s) can differ from x / s in the last bit, and so in the code).
  const float x = cuda::load_f32(src, src_dtype, src_strides.at(i, h, d)) / scale;
  cuda::store_f32(cache, cache_dtype,
                  cache_strides.offset(page_slot[2 * i], page_slot[2 * i + 1], h, d), x);
}

// per_token_head (DESIGN.md §2): one warp per (token, head) row finds amax|x|, stores the row's
// scale amax / fp8_max (1 for amax 0) at its slot of the scale cache and the row divided by it.
__global__ void append_per_token_kernel(const void* src, DType src_dtype,
                                        cuda::Strides4 src_strides, int64_t nnz, int64_t heads,
                                        int64_t dim, const int64_t* page_slot, void* cache,
                                        DType cache_dtype, paged::CacheStrides cache_strides,
                                        float* scales, paged::CacheStrides scale_strides) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= nnz * heads) return;  // whole warps leave together
  const int64_t h = row % heads, i = row / heads;
  if (page_slot[2 * i] < 0) return;  // a padded row (batch index -1); the whole warp leaves
  float amax = 0.0f;
  for (int64_t d = lane; d < dim; d += 32) {
    amax = fmaxf(amax, fabsf(cuda::load_f32(src, src_dtype, src_strides.at(i, h, d))));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float scale = num::per_token_fp8_scale(amax, cache_dtype == DType::kE5M2);
  const int64_t page = page_slot[2 * i], slot = page_slot[2 * i + 1];
  if (lane == 0) scales[scale_strides.offset(page, slot, h, 0)] = scale;
  for (int64_t d = lane; d < dim; d += 32) {
    const float x = cuda::load_f32(src, src_dtype, src_strides.at(i, h, d));
    cuda::store_f32(cache, cache_dtype, cache_strides.offset(page, slot, h, d), x / scale);
  }
}

// What selects the angle of rotation pair t: a cos/sin cache row per position, or
// theta^(-2t/R) with the position scaled, or with Llama 3.1's per-frequency blend (FlashInfer's
// smooth_a / smooth_b form: weight = clamp(f * smooth_a + smooth_b, 0, 1) keeps f, 1 - weight
// divides it by rope_scale).
struct RopeAngles {
  float theta, scale;
  bool llama31;
  float smooth_a, smooth_b;
  const float* cache;  // null: computed
  int64_t cache_row_stride, cache_col_stride;
};

// One thread per (token, head, rotation pair) and per pass-through element [R, D): reads both
// elements of its pair before writing, so out may be in itself.
__global__ void rope_kernel(const void* in, DType in_dtype, cuda::Strides4 in_strides, void* out,
                            DType out_dtype, cuda::Strides4 out_strides, int64_t nnz, int64_t heads,
                            int dim, int rotary_dim, const int32_t* pos_ids, RopeAngles a,
                            bool interleave) {
  const int half = rotary_dim / 2;
  const int per_head = half + (dim - rotary_dim);
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= nnz * heads * per_head) return;
  const int t = int(idx % per_head);
  const int64_t h = (idx / per_head) % heads, i = idx / (int64_t(per_head) * heads);
  if (t >= half) {
    const int d = rotary_dim + (t - half);
    cuda::store_f32(out, out_dtype, out_strides.at(i, h, d),
                    cuda::load_f32(in, in_dtype, in_strides.at(i, h, d)));
    return;
  }
  const math::RopePair e = math::rope_pair(t, rotary_dim, interleave);
  const float x1 = cuda::load_f32(in, in_dtype, in_strides.at(i, h, e.first));
  const float x2 = cuda::load_f32(in, in_dtype, in_strides.at(i, h, e.second));
  math::Rotated r;
  if (a.cache != nullptr) {
    const float* row = a.cache + int64_t(pos_ids[i]) * a.cache_row_stride;
    const float c = row[t * a.cache_col_stride], s = row[(half + t) * a.cache_col_stride];
    r = math::Rotated{x1 * c - x2 * s, x2 * c + x1 * s};
  } else if (a.llama31) {
    const float f = powf(a.theta, -2.0f * float(t) / float(rotary_dim));
    const float w = fminf(fmaxf(f * a.smooth_a + a.smooth_b, 0.0f), 1.0f);
    r = math::rope_rotate(x1, x2, float(pos_ids[i]) * ((1.0f - w) * (f / a.scale) + w * f));
  } else {
    r = math::rope_rotate(x1, x2, math::rope_angle(pos_ids[i], t, rotary_dim, a.theta, a.scale));
  }
  cuda::store_f32(out, out_dtype, out_strides.at(i, h, e.first), r.first);
  cuda::store_f32(out, out_dtype, out_strides.at(i, h, e.second), r.second);
}

StateView state_view(const TensorView& v, const TensorView& s) {
  return StateView{v.data, v.dtype, strides_of(v), static_cast<const float*>(s.data),
                   strides_of(s)};
}
OutView out_view(const TensorView& v, const TensorView& s) {
  return OutView{v.data, v.dtype, strides_of(v), s.empty() ? nullptr : static_cast<float*>(s.data),
                 strides_of(s)};
}

}  // namespace

Status run_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                       const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                       const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(expect_device({&v_a, &s_a, &v_b, &s_b, &v_out, &s_out}));
  const int64_t rows = v_a.shape[0], heads = v_a.shape[1], dim = v_a.shape[2];
  const int64_t n = rows * heads * dim;
  if (n == 0) return Status::Ok();
  DeviceGuard guard;
  KVATTN_RETURN_IF_ERROR(guard.enter(options.device.index));
  return launch_kernel("fa2 merge_state kernel", merge_kernel, blocks_for(n), kBlock, 0,
                       options.stream, state_view(v_a, s_a), state_view(v_b, s_b), false, 2, rows,
                       heads, dim, out_view(v_out, s_out));
}

Status run_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                        const TensorView& s_out, const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(expect_device({&v, &s, &v_out, &s_out}));
  const int64_t rows = v.shape[0], states = v.shape[1], heads = v.shape[2], dim = v.shape[3];
  const int64_t n = rows * heads * dim;
  if (n == 0) return Status::Ok();
  DeviceGuard guard;
  KVATTN_RETURN_IF_ERROR(guard.enter(options.device.index));
  return launch_kernel("fa2 merge_states kernel", merge_kernel, blocks_for(n), kBlock, 0,
                       options.stream, state_view(v, s), state_view(v, s), true, states, rows,
                       heads, dim, out_view(v_out, s_out));
}

Status run_append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 const PagedKVCache& cache, const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(expect_device({&append_k, &append_v, &cache.k_cache, &cache.v_cache,
                                        &cache.k_scale_cache, &cache.v_scale_cache}));
  for (const auto& [t, name] : {std::pair{&batch_indices, "batch_indices"},
                                {&positions, "positions"},
                                {&cache.kv_indptr, "kv_indptr"},
                                {&cache.kv_indices, "kv_indices"},
                                {&cache.kv_last_page_len, "kv_last_page_len"}}) {
    KVATTN_RETURN_IF_ERROR(expect_host(*t, name));
  }
  const bool hnd = cache.layout == KVLayout::kHND;
  const int64_t page_size = hnd ? cache.k_cache.shape[2] : cache.k_cache.shape[1];
  const int64_t nnz = append_k.shape[0];
  if (nnz == 0) return Status::Ok();
  const std::vector<int32_t> b_of = read_i32(batch_indices), pos_of = read_i32(positions);
  const std::vector<int32_t> indptr = read_i32(cache.kv_indptr),
                             indices = read_i32(cache.kv_indices);
  const int64_t num_pages = cache.k_cache.shape[0];
  std::vector<int64_t> page_slot(size_t(2 * nnz));
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t b = b_of[size_t(i)], pos = pos_of[size_t(i)];
    if (b == kPaddedAppendRow) {  // a padded row writes nothing: the kernels skip page -1
      page_slot[size_t(2 * i)] = -1;
      page_slot[size_t(2 * i + 1)] = 0;
      continue;
    }
    // Validation proves these; re-checked because a wrong page here is a write outside the cache.
    if (b < 0 || b + 1 >= int64_t(indptr.size()) || pos < 0 ||
        indptr[size_t(b)] + pos / page_size >= indptr[size_t(b + 1)]) {
      return make_error(ErrorCode::kInvalidArgument, "append_paged_kv_cache: entry ", i,
                        " (batch index ", b, ", position ", pos, ") is outside the page table");
    }
    const int64_t page = indices[size_t(indptr[size_t(b)] + pos / page_size)];
    if (page < 0 || page >= num_pages) {
      return make_error(ErrorCode::kInvalidPageTable, "append_paged_kv_cache: page id ", page,
                        " is outside [0, ", num_pages, ")");
    }
    page_slot[size_t(2 * i)] = page;
    page_slot[size_t(2 * i + 1)] = pos % page_size;
  }
  DeviceGuard guard;
  KVATTN_RETURN_IF_ERROR(guard.enter(options.device.index));
  StreamBuffer slots(options.stream);
  KVATTN_RETURN_IF_ERROR(slots.upload(page_slot));
  const bool per_token = cache.scale_granularity == KVScaleGranularity::kPerTokenHead;
  const auto append = [&](const TensorView& src, const TensorView& dst, float scale,
                          const TensorView& scales) {
    const int64_t heads = src.shape[1], dim = src.shape[2];
    const int64_t n = nnz * heads * dim;
    if (n == 0) return Status::Ok();
    if (per_token) {
      // The scale cache is [P, page_size, H] for either cache layout.
      paged::CacheStrides ss;
      ss.page = scales.strides[0];
      ss.slot = scales.strides[1];
      ss.head = scales.strides[2];
      return launch_kernel(
          "fa2 append_paged_kv_cache (per_token_head) kernel", append_per_token_kernel,
          blocks_for(nnz * heads * 32), kBlock, 0, options.stream, src.data, src.dtype,
          strides_of(src), nnz, heads, dim, slots.as<const int64_t>(), dst.data, dst.dtype,
          paged::cache_strides(dst.strides.data(), hnd), static_cast<float*>(scales.data), ss);
    }
    return launch_kernel("fa2 append_paged_kv_cache kernel", append_kernel, blocks_for(n), kBlock,
                         0, options.stream, src.data, src.dtype, strides_of(src), nnz, heads, dim,
                         slots.as<const int64_t>(), dst.data, dst.dtype,
                         paged::cache_strides(dst.strides.data(), hnd), scale);
  };
  KVATTN_RETURN_IF_ERROR(append(append_k, cache.k_cache, cache.k_scale, cache.k_scale_cache));
  return append(append_v, cache.v_cache, cache.v_scale, cache.v_scale_cache);
}

Status run_apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                      const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                      const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(expect_device({&q, &k, &q_out, &k_out}));
  KVATTN_RETURN_IF_ERROR(expect_host(pos_ids, "pos_ids"));
  const TensorView& cache = rope.cos_sin_cache;
  if (!cache.empty()) KVATTN_RETURN_IF_ERROR(expect_device({&cache}));
  DeviceGuard guard;
  KVATTN_RETURN_IF_ERROR(guard.enter(options.device.index));
  StreamBuffer positions(options.stream);
  KVATTN_RETURN_IF_ERROR(positions.upload(read_i32(pos_ids)));
  RopeAngles angles{rope.rope_theta,
                    rope.rope_scale,
                    rope.llama31.has_value(),
                    0.0f,
                    0.0f,
                    static_cast<const float*>(cache.data),
                    0,
                    0};
  if (rope.llama31) {
    const Llama31Scaling& l = *rope.llama31;
    constexpr float two_pi = 6.28318530717958647692f;
    angles.smooth_a =
        l.old_context_len / (two_pi * l.high_freq_factor - two_pi * l.low_freq_factor);
    angles.smooth_b = -1.0f / (l.high_freq_factor / l.low_freq_factor - 1.0f);
  }
  if (!cache.empty()) {
    angles.cache_row_stride = cache.strides[0];
    angles.cache_col_stride = cache.strides[1];
  }
  const auto rotate = [&](const TensorView& in, const TensorView& out) {
    if (in.empty() || out.empty()) return Status::Ok();
    const int64_t nnz = in.shape[0], heads = in.shape[1];
    const int dim = int(in.shape[2]);
    const int rotary_dim = !cache.empty()         ? int(cache.shape[1])
                           : rope.rotary_dim == 0 ? dim
                                                  : rope.rotary_dim;
    const int64_t n = nnz * heads * (rotary_dim / 2 + (dim - rotary_dim));
    if (n == 0) return Status::Ok();
    return launch_kernel("fa2 apply_rope kernel", rope_kernel, blocks_for(n), kBlock, 0,
                         options.stream, in.data, in.dtype, strides_of(in), out.data, out.dtype,
                         strides_of(out), nnz, heads, dim, rotary_dim,
                         positions.as<const int32_t>(), angles, rope.interleave);
  };
  KVATTN_RETURN_IF_ERROR(rotate(q, q_out));
  return rotate(k, k_out);
}

}  // namespace kvattn::fa2
