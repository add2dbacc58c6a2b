// What a decode tile's walk can read from DRAM with the next tile prefetched (issue 23, Zen 4 note
// of 2026-12-06 from 08:30 UTC): the decode kernel's demand orders of a tile, each with the
// kernel's paced software prefetch of the next tile, and without arithmetic, as a ceiling the
// kernel's own arithmetic cannot lift.
//
// 1 GiB on huge pages, cut into 32 KiB pages (a K or V page of bf16 d 128: 16 tokens x 8 KV heads
// x 256 bytes) in a shuffled order; each thread walks its share of the order a group of 4 pages
// at a time (a tile of 32 keys: K pages A and B, V pages A and B). Per group it demand-reads
// the lines in one order (one 512-bit load each, then W FMAs, as paged_interleave.cc) and, paced
// evenly over those loads, prefetches the lines of the group DIST groups on in another order.
//
// Not part of the build (a one-off measurement; AVX-512):
//   g++ -O2 -mavx512f -std=c++20 -pthread bench/probes/tile_prefetch.cc -o /tmp/tile_prefetch
//   /tmp/tile_prefetch THREADS ROUNDS W [SPEC...]   (no SPEC: the set of the table below)
//   /tmp/tile_prefetch mlp                          (one core: DRAM latency, random-line rates)
// SPEC = DEMAND:PREFETCH:DIST:HINT:PACE[:contig|:local]
//   DEMAND   lines     the 4 pages line by line in turn (paged_interleave's n4)
//            blkB      the 4 pages B bytes at a time in turn (blk64 = lines)
//            onehead   per head: K pages' head rows (4 lines a token), then V's
//            kernel1   one head a step as the kernel: per head, K rows of page A's 16 tokens then
//                      B's; V by 2-line chunks (chunk 0 of every token, then chunk 1)
//            stepS     8-head steps as the kernel: K pages by token rows; V per S tokens, per
//                      head, chunk, token (the kernel's PV sub-tiles: S = 8)
//            pairS     8-head steps over key pairs (t, t + 16): K head rows of both pages per
//                      token; V per S tokens of a page, head, chunk, token, page
//            pvrows    K and V each by head rows over their 2 pages
//            hnd1      kernel1 over HND pages (each head's 16 rows 4 KiB in a row)
//   PREFETCH none | lines (the kernel's order: line l of each page in turn) | seq (page by page)
//            | hfirstF (heads [0, F) of every page strided first, then lines for the rest)
//            | lines2 (lines, then every line again) | lines2lag (each line again 256 lines on)
//   DIST     groups ahead (0: no prefetch); HINT t0 | t1 | nta; PACE: all of the group's
//            prefetches issued by PACE % of its demand loads (the rest, if any, at its end)
//   contig   pages in address order (the contiguous read every ratio is taken against: put it
//            first); local: demand reads from a 128 KiB local buffer (L2), prefetches as given
// Output: each spec's median GB/s and the median of its per-round ratio to the first spec.
//
// AMD Zen 4 VM (2 vCPUs, 1 MiB L2 each; 2026-12-06 from 09:35 UTC; two threads, 7-9 rounds;
// the median of each round's ratio to that round's contiguous read, 29-37 GB/s):
//   spec                          W=0    W=12   what it models
//   lines:none                    0.91   0.98   4 pages line by line, demand loads alone
//   blk256 / blk2048:none         --     0.93 / 0.74-0.75
//   blk8192 / blk32768:none       --     0.73 / 0.78
//   kernel1:none                  0.46   0.41   the one-head walk without the prefetch
//   kernel1:lines:1:t0            0.72   0.75-0.78   ... with it: the kernel's walk today
//   kernel1:lines:2:t0            0.73   0.74   two tiles ahead
//   kernel1:lines:1:t1            0.82   0.87   into L2 (the kernel runs 0.87-0.94x as fast so)
//   kernel1:lines:1:nta           --     0.76
//   kernel1:lines:1:t0, PACE 60 / 80 / 150   0.72 / 0.72 / 0.74 (against 0.75 at 100)
//   kernel1:hfirst1 / hfirst2     0.65   0.70 / 0.57   (strided prefetches first: worse)
//   step8:none                    0.68   0.66   8-head steps, no prefetch
//   step8:lines:1:t0              0.80   0.85   8-head steps (KVATTN_CPU_LANE_HEAD_STEPS=1)
//   pair4:lines:1:t0              0.80   0.90   steps over key pairs (t, t + 16)
//   pvrows:lines:1:t0             0.83   0.87   V by head rows (PV cannot take it)
//   hnd1:lines:1:t0               0.69   0.83   (kernel1 0.63 / 0.76 in that run: HND reads
//                                               better, as in the bench: 0.72 / 0.66)
//   kernel1:lines2 / lines2lag    --     0.79 / 0.78 (kernel1 0.79 there): asked twice, no better
//   kernel1:none:local            128 GB/s  93-115 GB/s   the loop's own rate from L2 (the kernel's
//                                                         arithmetic ~48 GB/s on two threads)
// One core (`mlp`, three runs): a dependent chase 187-228 ns a line; random lines, prefetcht0
// back to back 7.5-8.7 GB/s (~25-30 lines in flight), demand loads 4.6-7.1 GB/s: a walk the
// L2's stream prefetcher does not follow is held near that by the core's miss buffers.
// The probe is a model: as ratios it put the one-head walk 0.72-0.78 where the kernel's walk alone
// reads 0.66-0.67 (below; in GB/s about the same, 22-26 against 21.6-22.9), and it ranks the L2
// hint ahead of L1 where the kernel runs slower with it: read it for the demand orders' ceilings.
//
// The decode kernel with its QK and PV products and its softmax taken out (the throwaway
// decode_walk_only.patch beside this file: loads, unpacks, the prefetch walk and the loops
// stay), `kvattn bench`, two threads, two sets of 5 and 6 rounds alternated with the kernel,
// medians of the paired fraction: bf16 d 128 0.665 / 0.672 with one head a step, 0.687 / 0.677
// with the 8-head steps; long_b1 0.48 / 0.675 and 0.699 / 0.677; d64 0.60 / 0.49 and 0.65 /
// 0.61; d256 0.68 / 0.71 and 0.72 / 0.56. The kernel's own time was 1.00-1.11x the walk's at
// bf16 d 128 (long_b1 1.05-1.16x, d64 1.03-1.05x, d256 1.12-1.26x): from DRAM its arithmetic is
// mostly hidden, and with none at all its walks read ~0.67-0.69 of the paired read, not 0.75.
//
// (W here is not paged_interleave.cc's W of before 2026-12-06 09:50 UTC: its loop stored its 16
// accumulators to the stack every line, as this one did until its fold was unrolled, so its
// W = 8 ran ~55 GB/s from L3 where this loop's W = 12 runs 93-115; compare rates, not W.)
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "line_work.h"

namespace {

using probe::consume;
using probe::fold;
using probe::zero;

constexpr std::size_t kTotal = std::size_t{1} << 30;
constexpr std::size_t kPage = 32768;
constexpr int kGroup = 4;  // pages a tile: K A, K B, V A, V B
constexpr int kTokens = 16, kHeads = 8, kToken = 2048, kHead = 256;

// A line of a group: page s of the group, byte offset in it.
struct Line {
  uint32_t page, offset;
};

struct Spec {
  std::string text;
  std::vector<Line> demand, prefetch;  // one group's lines, in order
  int dist = 0;
  int hint = _MM_HINT_T0;
  int pace = 100;
  bool contiguous = false, local = false;
};

char* g_base;

// One prefetch with the spec's hint (the hint must be a constant to the intrinsic).
[[gnu::always_inline]] inline void prefetch_line(const char* a, int hint) {
  if (hint == _MM_HINT_T0) {
    _mm_prefetch(a, _MM_HINT_T0);
  } else if (hint == _MM_HINT_T1) {
    _mm_prefetch(a, _MM_HINT_T1);
  } else {
    _mm_prefetch(a, _MM_HINT_NTA);
  }
}

// A group's demand loads in order (W FMAs after each) and, where `ahead` is set, the prefetches
// of the group `ahead` holds, issued as the pace allows (the rest at the end).
template <int W>
[[gnu::always_inline]] inline void demand_run(const Spec& spec, const char* const* page,
                                              const char* const* ahead, __m512* acc) {
  const Line* demand = spec.demand.data();
  const Line* later = spec.prefetch.data();
  const std::size_t m = spec.demand.size(), np = spec.prefetch.size();
  const std::size_t pace = spec.pace;
  const int hint = spec.hint;
  std::size_t k = 0;
  for (std::size_t i = 0; i < m; i += 2) {
    if (ahead != nullptr) {
      const std::size_t target = std::min(np, (i + 2) * np * 100 / (m * pace));
      for (; k < target; ++k) prefetch_line(ahead[later[k].page] + later[k].offset, hint);
    }
    const Line x = demand[i], y = demand[i + 1];
    consume<W, 0>(_mm512_load_ps(reinterpret_cast<const float*>(page[x.page] + x.offset)), acc);
    consume<W, 1>(_mm512_load_ps(reinterpret_cast<const float*>(page[y.page] + y.offset)), acc);
  }
  for (; ahead != nullptr && k < np; ++k) {
    prefetch_line(ahead[later[k].page] + later[k].offset, hint);
  }
}

// Groups of pages [p0, p1) of `order`.
template <int W>
float walk(const Spec& spec, const std::vector<uint32_t>& order, std::size_t p0, std::size_t p1) {
  __m512 acc[16];
  zero(acc);
  static thread_local std::vector<char> local(kGroup * kPage + 64, 0x3f);
  char* local_base =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(local.data()) + 63) & ~uintptr_t{63});
  const int dist = spec.dist;
  const bool demand_local = spec.local;
  for (std::size_t p = p0; p + kGroup <= p1; p += kGroup) {
    const char* page[kGroup];
    const char* ahead[kGroup];
    const std::size_t next = p + std::size_t{kGroup} * dist;
    const bool have_ahead = dist > 0 && next + kGroup <= p1;
    for (int s = 0; s < kGroup; ++s) {
      page[s] = demand_local ? local_base + s * kPage : g_base + std::size_t{order[p + s]} * kPage;
      ahead[s] = have_ahead ? g_base + std::size_t{order[next + s]} * kPage : nullptr;
    }
    // Two calls, so that the inlined copy without a group ahead has no prefetch test in its loop.
    if (have_ahead) {
      demand_run<W>(spec, page, ahead, acc);
    } else {
      demand_run<W>(spec, page, nullptr, acc);
    }
  }
  return fold(acc);
}

float walk_w(int w, const Spec& spec, const std::vector<uint32_t>& order, std::size_t p0,
             std::size_t p1) {
  switch (w) {
    case 0:
      return walk<0>(spec, order, p0, p1);
    case 4:
      return walk<4>(spec, order, p0, p1);
    case 8:
      return walk<8>(spec, order, p0, p1);
    case 12:
      return walk<12>(spec, order, p0, p1);
    default:
      return walk<16>(spec, order, p0, p1);
  }
}

// The number after `prefix` characters of s, or -1 where there is none.
int number_after(const std::string& s, std::size_t prefix) {
  const char* start = s.c_str() + prefix;
  char* end = nullptr;
  const long v = std::strtol(start, &end, 10);
  return end == start || *end != '\0' || v < 0 || v > (1 << 20) ? -1 : static_cast<int>(v);
}

// A group's lines in the named order; false if the name is not one.
bool lines_of(const std::string& name, std::vector<Line>* out) {
  out->clear();
  auto add = [out](int s, int offset) { out->push_back({uint32_t(s), uint32_t(offset)}); };
  // Head j's row of token t in page s: 4 lines.
  auto head_row = [&add](int s, int t, int j) {
    for (int l = 0; l < 4; ++l) add(s, t * kToken + j * kHead + 64 * l);
  };
  if (name == "lines" || name == "blk64") {
    for (int l = 0; l < int{kPage}; l += 64) {
      for (int s = 0; s < kGroup; ++s) add(s, l);
    }
  } else if (name.rfind("blk", 0) == 0) {
    const int block = number_after(name, 3);
    if (block < 64 || block % 64 != 0 || kPage % block != 0) return false;
    for (int b0 = 0; b0 < int{kPage}; b0 += block) {
      for (int s = 0; s < kGroup; ++s) {
        for (int l = b0; l < b0 + block; l += 64) add(s, l);
      }
    }
  } else if (name == "seq") {
    for (int s = 0; s < kGroup; ++s) {
      for (int l = 0; l < int{kPage}; l += 64) add(s, l);
    }
  } else if (name == "onehead") {
    for (int j = 0; j < kHeads; ++j) {
      for (int s = 0; s < kGroup; ++s) {
        for (int t = 0; t < kTokens; ++t) head_row(s, t, j);
      }
    }
  } else if (name == "kernel1") {
    for (int j = 0; j < kHeads; ++j) {
      for (int s = 0; s < 2; ++s) {
        for (int t = 0; t < kTokens; ++t) head_row(s, t, j);
      }
      for (int c = 0; c < 2; ++c) {
        for (int s = 2; s < 4; ++s) {
          for (int t = 0; t < kTokens; ++t) {
            for (int l = 0; l < 2; ++l) add(s, t * kToken + j * kHead + 128 * c + 64 * l);
          }
        }
      }
    }
  } else if (name.rfind("step", 0) == 0 || name.rfind("pair", 0) == 0) {
    const bool pairs = name[0] == 'p';
    const int sub = number_after(name, 4);
    if (sub < 1 || (pairs ? kTokens : 2 * kTokens) % sub != 0) return false;
    if (pairs) {
      for (int t = 0; t < kTokens; ++t) {
        for (int j = 0; j < kHeads; ++j) {
          for (int s = 0; s < 2; ++s) head_row(s, t, j);
        }
      }
      for (int t0 = 0; t0 < kTokens; t0 += sub) {
        for (int j = 0; j < kHeads; ++j) {
          for (int c = 0; c < 2; ++c) {
            for (int t = t0; t < t0 + sub; ++t) {
              for (int s = 2; s < 4; ++s) {
                for (int l = 0; l < 2; ++l) add(s, t * kToken + j * kHead + 128 * c + 64 * l);
              }
            }
          }
        }
      }
    } else {
      for (int s = 0; s < 2; ++s) {
        for (int l = 0; l < int{kPage}; l += 64) add(s, l);
      }
      for (int t0 = 0; t0 < 2 * kTokens; t0 += sub) {
        for (int j = 0; j < kHeads; ++j) {
          for (int c = 0; c < 2; ++c) {
            for (int t = t0; t < t0 + sub; ++t) {
              for (int l = 0; l < 2; ++l) {
                add(2 + t / kTokens, (t % kTokens) * kToken + j * kHead + 128 * c + 64 * l);
              }
            }
          }
        }
      }
    }
  } else if (name == "hnd1") {  // one head a step over HND pages: head j's 16 rows in a row
    for (int j = 0; j < kHeads; ++j) {
      for (int s = 0; s < 2; ++s) {
        for (int l = 0; l < kTokens * kHead; l += 64) add(s, j * kTokens * kHead + l);
      }
      for (int c = 0; c < 2; ++c) {
        for (int s = 2; s < 4; ++s) {
          for (int t = 0; t < kTokens; ++t) {
            for (int l = 0; l < 2; ++l) add(s, (j * kTokens + t) * kHead + 128 * c + 64 * l);
          }
        }
      }
    }
  } else if (name == "lines2" || name == "lines2lag") {  // every line twice
    std::vector<Line> once;
    lines_of("lines", &once);
    if (name == "lines2") {
      out->insert(out->end(), once.begin(), once.end());
      out->insert(out->end(), once.begin(), once.end());
    } else {  // each line again 256 lines later
      for (std::size_t i = 0; i < once.size() + 256; ++i) {
        if (i < once.size()) out->push_back(once[i]);
        if (i >= 256) out->push_back(once[i - 256]);
      }
    }
  } else if (name == "pvrows") {
    for (int half = 0; half < 2; ++half) {
      for (int t = 0; t < kTokens; ++t) {
        for (int j = 0; j < kHeads; ++j) {
          for (int s = 2 * half; s < 2 * half + 2; ++s) head_row(s, t, j);
        }
      }
    }
  } else if (name.rfind("hfirst", 0) == 0) {
    const int first = number_after(name, 6);
    if (first < 0 || first > kHeads) return false;
    for (int j = 0; j < first; ++j) {
      for (int s = 0; s < kGroup; ++s) {
        for (int t = 0; t < kTokens; ++t) head_row(s, t, j);
      }
    }
    for (int l = 0; l < int{kPage}; l += 64) {
      for (int s = 0; s < kGroup; ++s) {
        if ((l % kToken) / kHead >= first) add(s, l);
      }
    }
  } else if (name != "none") {
    return false;
  }
  return true;
}

bool parse(const std::string& text, Spec* spec) {
  std::vector<std::string> f;
  for (std::size_t a = 0;;) {
    const std::size_t b = text.find(':', a);
    f.push_back(text.substr(a, b == std::string::npos ? std::string::npos : b - a));
    if (b == std::string::npos) break;
    a = b + 1;
  }
  if (f.size() < 5 || f.size() > 6) return false;
  spec->text = text;
  if (!lines_of(f[0], &spec->demand) || spec->demand.size() != kGroup * kPage / 64) return false;
  if (!lines_of(f[1], &spec->prefetch)) return false;
  spec->dist = std::atoi(f[2].c_str());
  if (f[3] == "t0") {
    spec->hint = _MM_HINT_T0;
  } else if (f[3] == "t1") {
    spec->hint = _MM_HINT_T1;
  } else if (f[3] == "nta") {
    spec->hint = _MM_HINT_NTA;
  } else {
    return false;
  }
  spec->pace = std::atoi(f[4].c_str());
  if (spec->dist < 0 || spec->pace < 1) return false;
  if (spec->prefetch.empty()) spec->dist = 0;
  if (f.size() == 6) {
    if (f[5] != "contig" && f[5] != "local") return false;
    spec->contiguous = f[5] == "contig";
    spec->local = f[5] == "local";
  }
  return true;
}

// One core: latency of a dependent chase over 1 GiB, and the rate of random lines asked for by
// prefetcht0 and by demand loads back to back.
void mlp() {
  std::mt19937_64 rng(1);
  const std::size_t n = std::size_t{1} << 22;
  std::vector<char*> address(n);
  for (auto& a : address) a = g_base + rng() % (kTotal / 64) * 64;
  const std::size_t hops = std::size_t{1} << 20;
  std::vector<std::size_t> perm(hops);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (std::size_t i = 0; i < hops; ++i) {
    char* at = g_base + perm[i] * 1024;
    char* to = g_base + perm[(i + 1) % hops] * 1024;
    std::memcpy(at, &to, sizeof(to));
  }
  const auto seconds = [](auto t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  char* p = g_base + perm[0] * 1024;
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < hops; ++i) std::memcpy(&p, p, sizeof(p));
  std::printf("dependent chase: %.1f ns a line (%p)\n", seconds(t0) / hops * 1e9,
              static_cast<void*>(p));
  for (int rep = 0; rep < 3; ++rep) {
    t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < n; ++i) _mm_prefetch(address[i], _MM_HINT_T0);
    const double pf = n * 64 / seconds(t0) / 1e9;
    t0 = std::chrono::steady_clock::now();
    uint64_t sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += *static_cast<volatile char*>(address[i]);
    std::printf("random lines: prefetcht0 %.2f GB/s, demand loads %.2f GB/s (%llu)\n", pf,
                n * 64 / seconds(t0) / 1e9, static_cast<unsigned long long>(sum));
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_base = static_cast<char*>(std::aligned_alloc(std::size_t{2} << 20, kTotal));
  madvise(g_base, kTotal, MADV_HUGEPAGE);
  std::memset(g_base, 0x3f, kTotal);  // floats of 0.75: no subnormal products
  if (argc > 1 && std::string(argv[1]) == "mlp") {
    mlp();
    return 0;
  }
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s THREADS ROUNDS W [SPEC...] | %s mlp\n", argv[0], argv[0]);
    return 2;
  }
  const int threads = std::atoi(argv[1]), rounds = std::atoi(argv[2]), work = std::atoi(argv[3]);
  if (threads < 1 || rounds < 1 ||
      (work != 0 && work != 4 && work != 8 && work != 12 && work != 16)) {
    std::fprintf(stderr, "THREADS and ROUNDS must be >= 1, W one of 0, 4, 8, 12, 16\n");
    return 2;
  }
  std::vector<std::string> texts(argv + 4, argv + argc);
  if (texts.empty()) {
    texts = {"seq:none:0:t0:100:contig",   "lines:none:0:t0:100",      "blk2048:none:0:t0:100",
             "kernel1:none:0:t0:100",      "kernel1:lines:1:t0:100",   "kernel1:lines:2:t0:100",
             "kernel1:lines:1:t1:100",     "kernel1:hfirst1:1:t0:100", "step8:none:0:t0:100",
             "step8:lines:1:t0:100",       "pair4:lines:1:t0:100",     "pvrows:lines:1:t0:100",
             "kernel1:none:0:t0:100:local"};
  }
  std::vector<Spec> specs(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    if (!parse(texts[i], &specs[i])) {
      std::fprintf(stderr, "bad spec %s (see the header of tile_prefetch.cc)\n", texts[i].c_str());
      return 2;
    }
  }
  const std::size_t pages = kTotal / kPage;
  std::vector<uint32_t> address_order(pages), shuffled;
  std::iota(address_order.begin(), address_order.end(), 0);
  shuffled = address_order;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(1));
  std::vector<std::vector<double>> gbps(specs.size());
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto& order = specs[i].contiguous ? address_order : shuffled;
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> team;
      std::vector<float> out(threads);
      for (int t = 0; t < threads; ++t) {
        team.emplace_back([&, t] {
          out[t] = walk_w(work, specs[i], order, pages * t / threads, pages * (t + 1) / threads);
        });
      }
      for (auto& t : team) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (float o : out) sink = sink + o;
      gbps[i].push_back(kTotal / s / 1e9);
    }
  }
  std::printf("%d threads, W = %d, %d rounds\n", threads, work, rounds);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<double> ratio;
    for (int r = 0; r < rounds; ++r) ratio.push_back(gbps[i][r] / gbps[0][r]);
    std::printf("  %-32s %6.1f GB/s  ratio to the first %.3f (%.2f-%.2f)\n", specs[i].text.c_str(),
                median(gbps[i]), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                *std::max_element(ratio.begin(), ratio.end()));
  }
  return 0;
}
