// ggml's CPU flash attention (ggml_flash_attn_ext, the op llama.cpp's attention runs) on the
// shapes of kvattn's standard bench cases. Built outside the repository against a ggml checkout
// by build_ggml.sh; not part of the CMake build.
//
//   ggml_fa_bench NAME KVTYPE D BATCH CTX QLEN CAUSAL THREADS REPEATS
//   ggml_fa_bench --check
//
// Layouts are llama.cpp's: Q f32 [d, n_q, 32, n_seq] (llama.cpp keeps activations in f32), K and V
// [d, n_kv, 8, n_seq] in the cache type (f16, bf16 or q8_0), one KV stream per sequence (its
// non-unified cache) so decode needs no mask, an f16 causal mask [n_kv, n_q] for prefill, scale
// 1/sqrt(d), F32 precision, f32 output. The graph, plan and work buffer are made once; one
// warm-up run, then REPEATS timed runs of ggml_graph_compute. Prints one JSON line: name, peer,
// median_ms, min_ms, median_cpu_ms (process CPU time per run, all threads), repeats, threads.
//
// --check runs small problems of every cache type, decode over two sequences and causal
// prefill, against a double-precision reference over the same (dequantized) K/V, so that a
// layout or argument mistake shows as an error rather than as a fast, meaningless time.

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

#ifndef KVATTN_GGML_COMMIT
#define KVATTN_GGML_COMMIT "unknown"
#endif

namespace {

constexpr int kQoHeads = 32;
constexpr int kKvHeads = 8;
constexpr size_t kHugePage = size_t{2} << 20;

struct Shape {
  int head_dim;
  int batch;    // sequences, one KV stream each
  int context;  // KV tokens per sequence
  int q_len;    // query tokens per sequence
  bool causal;
};

double now_s(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

bool parse_type(const std::string& name, ggml_type* type) {
  struct Named {
    const char* name;
    ggml_type type;
  };
  constexpr Named kTypes[] = {{"f16", GGML_TYPE_F16},
                              {"bf16", GGML_TYPE_BF16},
                              {"q8_0", GGML_TYPE_Q8_0},
                              {"f32", GGML_TYPE_F32}};
  for (const Named& t : kTypes) {
    if (name == t.name) {
      *type = t.type;
      return true;
    }
  }
  return false;
}

// Deterministic values in [-amplitude, amplitude): the timing does not depend on them, and a
// counter-based generator fills a 0.5 GB cache in well under a second.
struct Uniform {
  uint64_t state;
  float next(float amplitude) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return amplitude * (float(z >> 40) * (2.0f / float(1 << 24)) - 1.0f);
  }
};

// Fills a tensor of any type with uniform values, converted row by row through
// ggml_quantize_chunk (which also handles f16 and bf16), so no f32 copy of the cache is needed.
void fill(ggml_tensor* t, Uniform* rng, float amplitude) {
  const int64_t row = t->ne[0];
  const int64_t rows = ggml_nrows(t);
  const size_t row_bytes = ggml_row_size(t->type, row);
  GGML_ASSERT(ggml_is_contiguous(t));
  std::vector<float> buf(row);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& x : buf) x = rng->next(amplitude);
    char* dst = static_cast<char*>(t->data) + r * row_bytes;
    if (t->type == GGML_TYPE_F32) {
      std::memcpy(dst, buf.data(), row_bytes);
    } else {
      ggml_quantize_chunk(t->type, buf.data(), dst, 0, 1, row, nullptr);
    }
  }
}

// One flash-attention problem: its ggml context lives on transparent huge pages, as kvattn
// bench's K/V caches and a serving engine's KV pool do.
class Problem {
 public:
  Problem(const Shape& s, ggml_type kv_type, int threads) : shape_(s), threads_(threads) {
    const int64_t n_seq = s.batch;
    size_t bytes = 0;
    auto add = [&](ggml_type type, int64_t ne0, int64_t rows) {
      bytes += GGML_PAD(ggml_row_size(type, ne0) * rows, GGML_MEM_ALIGN);
    };
    add(GGML_TYPE_F32, s.head_dim, int64_t{s.q_len} * kQoHeads * n_seq);  // q
    add(kv_type, s.head_dim, int64_t{s.context} * kKvHeads * n_seq);      // k
    add(kv_type, s.head_dim, int64_t{s.context} * kKvHeads * n_seq);      // v
    if (s.causal) add(GGML_TYPE_F16, s.context, s.q_len);                 // mask
    add(GGML_TYPE_F32, s.head_dim, int64_t{s.q_len} * kQoHeads * n_seq);  // out
    bytes += 8 * ggml_tensor_overhead() + ggml_graph_overhead() + (size_t{1} << 20);
    arena_bytes_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    arena_ =
        mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    GGML_ASSERT(arena_ != MAP_FAILED);
    madvise(arena_, arena_bytes_, MADV_HUGEPAGE);

    ggml_init_params params = {arena_bytes_, arena_, false};
    ctx_ = ggml_init(params);
    q_ = ggml_new_tensor_4d(ctx_, GGML_TYPE_F32, s.head_dim, s.q_len, kQoHeads, n_seq);
    k_ = ggml_new_tensor_4d(ctx_, kv_type, s.head_dim, s.context, kKvHeads, n_seq);
    v_ = ggml_new_tensor_4d(ctx_, kv_type, s.head_dim, s.context, kKvHeads, n_seq);
    if (s.causal) {
      mask_ = ggml_new_tensor_4d(ctx_, GGML_TYPE_F16, s.context, s.q_len, 1, 1);
      // Query t sits at position context - q_len + t and sees keys up to it.
      auto* m = static_cast<ggml_fp16_t*>(mask_->data);
      const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f);
      const ggml_fp16_t minus_inf = ggml_fp32_to_fp16(-INFINITY);
      for (int t = 0; t < s.q_len; ++t) {
        const int last = s.context - s.q_len + t;
        for (int j = 0; j < s.context; ++j)
          m[int64_t{t} * s.context + j] = j <= last ? zero : minus_inf;
      }
    }
    out_ = ggml_flash_attn_ext(ctx_, q_, k_, v_, mask_, 1.0f / std::sqrt(float(s.head_dim)), 0.0f,
                               0.0f);
    ggml_flash_attn_ext_set_prec(out_, GGML_PREC_F32);
    graph_ = ggml_new_graph(ctx_);
    ggml_build_forward_expand(graph_, out_);
    plan_ = ggml_graph_plan(graph_, threads_, nullptr);
    work_.resize(plan_.work_size);
    plan_.work_data = work_.data();
  }
  ~Problem() {
    ggml_free(ctx_);
    munmap(arena_, arena_bytes_);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  void fill_inputs(uint64_t seed, float q_amplitude) {
    Uniform rng{seed};
    fill(q_, &rng, q_amplitude);
    fill(k_, &rng, 1.0f);
    fill(v_, &rng, 1.0f);
  }
  void run() { GGML_ASSERT(ggml_graph_compute(graph_, &plan_) == GGML_STATUS_SUCCESS); }

  // Largest |ggml - reference| and largest |reference|, reference in double over the K/V that
  // ggml holds (dequantized), so only the kernel's own rounding is measured.
  void compare(double* max_err, double* max_ref) const {
    const Shape& s = shape_;
    const auto* traits = ggml_get_type_traits(k_->type);
    const int64_t kv_rows = int64_t{s.context} * kKvHeads * s.batch;
    const size_t row_bytes = ggml_row_size(k_->type, s.head_dim);
    std::vector<float> k(kv_rows * s.head_dim), v(kv_rows * s.head_dim);
    for (int64_t r = 0; r < kv_rows; ++r) {
      traits->to_float(static_cast<const char*>(k_->data) + r * row_bytes, &k[r * s.head_dim],
                       s.head_dim);
      traits->to_float(static_cast<const char*>(v_->data) + r * row_bytes, &v[r * s.head_dim],
                       s.head_dim);
    }
    const auto* q = static_cast<const float*>(q_->data);
    const auto* o = static_cast<const float*>(out_->data);
    const double scale = 1.0 / std::sqrt(double(s.head_dim));
    *max_err = *max_ref = 0.0;
    std::vector<double> logits(s.context), acc(s.head_dim);
    for (int seq = 0; seq < s.batch; ++seq) {
      for (int h = 0; h < kQoHeads; ++h) {
        const int kvh = h / (kQoHeads / kKvHeads);
        const int64_t kv_base = (int64_t{seq} * kKvHeads + kvh) * s.context;
        for (int t = 0; t < s.q_len; ++t) {
          const float* qrow = q + ((int64_t{seq} * kQoHeads + h) * s.q_len + t) * s.head_dim;
          const int visible = s.causal ? s.context - s.q_len + t + 1 : s.context;
          double max_logit = -INFINITY;
          for (int j = 0; j < visible; ++j) {
            double dot = 0.0;
            for (int i = 0; i < s.head_dim; ++i)
              dot += double(qrow[i]) * k[(kv_base + j) * s.head_dim + i];
            logits[j] = dot * scale;
            max_logit = std::max(max_logit, logits[j]);
          }
          double sum = 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int j = 0; j < visible; ++j) {
            const double p = std::exp(logits[j] - max_logit);
            sum += p;
            for (int i = 0; i < s.head_dim; ++i) acc[i] += p * v[(kv_base + j) * s.head_dim + i];
          }
          // out: [d, n_head, n_q, n_seq]
          const float* orow = o + ((int64_t{seq} * s.q_len + t) * kQoHeads + h) * s.head_dim;
          for (int i = 0; i < s.head_dim; ++i) {
            const double ref = acc[i] / sum;
            *max_err = std::max(*max_err, std::fabs(double(orow[i]) - ref));
            *max_ref = std::max(*max_ref, std::fabs(ref));
          }
        }
      }
    }
  }

 private:
  Shape shape_;
  int threads_;
  size_t arena_bytes_ = 0;
  void* arena_ = nullptr;
  ggml_context* ctx_ = nullptr;
  ggml_tensor* q_ = nullptr;
  ggml_tensor* k_ = nullptr;
  ggml_tensor* v_ = nullptr;
  ggml_tensor* mask_ = nullptr;
  ggml_tensor* out_ = nullptr;
  ggml_cgraph* graph_ = nullptr;
  ggml_cplan plan_{};
  std::vector<uint8_t> work_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int check() {
  // Q amplitude 8 makes the softmax peaked (logit spread of a few units), so that a wrong key
  // or head mapping moves the output by O(max|o|), far above the rounding of the cache types.
  const Shape shapes[] = {{128, 2, 300, 1, false},
                          {64, 2, 300, 1, false},
                          {128, 1, 300, 300, true},
                          {256, 1, 200, 200, true}};
  double worst = 0.0;
  for (const char* type_name : {"f16", "bf16", "q8_0"}) {
    ggml_type type{};
    parse_type(type_name, &type);
    for (const Shape& s : shapes) {
      Problem p(s, type, 2);
      p.fill_inputs(7, 8.0f);
      p.run();
      double err = 0.0, ref = 0.0;
      p.compare(&err, &ref);
      const double rel = err / ref;
      worst = std::max(worst, rel);
      std::printf(
          "{\"check\": \"%s\", \"head_dim\": %d, \"batch\": %d, \"context\": %d, "
          "\"q_len\": %d, \"causal\": %s, \"max_abs_err\": %.6f, \"max_abs_ref\": %.4f}\n",
          type_name, s.head_dim, s.batch, s.context, s.q_len, s.causal ? "true" : "false", err,
          ref);
    }
  }
  // q8_0 quantizes Q to 8 bits as well (ggml converts Q to K's dot type): ~1e-2 of max|o|;
  // a layout error gives errors of the order of max|o|.
  std::printf("{\"check_worst_relative\": %.5f}\n", worst);
  return worst < 0.05 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ggml_cpu_init();
  if (argc == 2 && std::string(argv[1]) == "--check") return check();
  if (argc != 10) {
    std::fprintf(stderr,
                 "usage: %s NAME KVTYPE(f16|bf16|q8_0) D BATCH CTX QLEN CAUSAL(0|1) THREADS "
                 "REPEATS\n       %s --check\n",
                 argv[0], argv[0]);
    return 2;
  }
  const std::string name = argv[1], type_name = argv[2];
  ggml_type type{};
  if (!parse_type(type_name, &type)) {
    std::fprintf(stderr, "unknown KV type %s\n", type_name.c_str());
    return 2;
  }
  const Shape shape{std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]),
                    std::atoi(argv[7]) != 0};
  const int threads = std::atoi(argv[8]);
  const int repeats = std::max(1, std::atoi(argv[9]));

  Problem problem(shape, type, threads);
  problem.fill_inputs(1234, 1.0f);
  problem.run();  // warm-up
  std::vector<double> wall_ms, cpu_ms;
  for (int i = 0; i < repeats; ++i) {
    const double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    problem.run();
    cpu_ms.push_back(1e3 * (now_s(CLOCK_PROCESS_CPUTIME_ID) - c0));
    wall_ms.push_back(1e3 * (now_s(CLOCK_MONOTONIC) - w0));
  }
  std::printf(
      "{\"name\": \"%s\", \"peer\": \"ggml-fa-%s\", \"median_ms\": %.4f, "
      "\"min_ms\": %.4f, \"median_cpu_ms\": %.4f, \"repeats\": %d, \"threads\": %d, "
      "\"kv_type\": \"%s\", \"head_dim\": %d, \"batch\": %d, \"context\": %d, "
      "\"q_len\": %d, \"causal\": %s, \"ggml\": \"%s\"}\n",
      name.c_str(), type_name.c_str(), median(wall_ms),
      *std::min_element(wall_ms.begin(), wall_ms.end()), median(cpu_ms), repeats, threads,
      type_name.c_str(), shape.head_dim, shape.batch, shape.context, shape.q_len,
      shape.causal ? "true" : "false", KVATTN_GGML_COMMIT);
  return 0;
}
