// The decode kernel's paced prefetch of the next tile (decode_kernel.h), its own concept: which
// bytes the next tile reads, as streams, and when each line is asked for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/cpu_features.h"

namespace kvattn::cpu::decode_detail {

// Prefetch of the next tile, paced. The next tile's K and V bytes, as contiguous streams (NHD
// with every head of the token in the task: one per page and K/V; HND: one per page, head and
// K/V), are issued a few lines at a time from inside the QK and PV loops of the current
// tile, line j of each stream in turn, spread evenly over the head steps. Issuing the same lines
// in one burst per head step ran no faster than no prefetch at all (issue 14): once the core's
// miss buffers are full the burst stalls the arithmetic queued behind it, where a steady trickle
// keeps loads in flight while the FMAs run.
//
// Where the lines go and how the streams are cut is the CPU class's (DecodeParams::prefetch,
// chosen when the params are built, CpuFeatures::decode_prefetch): into L2 (prefetcht1), merged,
// on the Intel Xeons (issue 14: the tile of all heads does not fit L1) and on AMD Zen 3 (issue
// 23's Zen 3 note of 2026-12-07); into L1 (prefetcht0) on the other AMD classes, merged (on Zen 4
// the L2 hint ran every decode case slower, the bf16 llama3 case 1.27x,
// prefetchnta was between the two: issue 23's Zen 4 note; on Zen 5 token rows ran 1.8-2.4x
// slower, and once NHD tasks read 8 heads a step the merged streams into L1 ran 1.05-1.14x faster
// than prefetchnta, which had been 1.02-1.20x faster than L2 when they read one head a step:
// issue 23's Zen 5 notes). Zen 3 and Zen 4 took token rows (a stream per NHD token row) until
// 2026-12-05, when on Zen 4 they ran every NHD case 1.31-1.89x slower than merged streams
// (CpuFeatures::decode_prefetch); they are gone.
using PrefetchHint = ::kvattn::detail::PrefetchHint;
using DecodePrefetch = ::kvattn::detail::DecodePrefetch;

class TilePrefetcher {
 public:
  static constexpr int kMaxStreams = 64;

  explicit TilePrefetcher(PrefetchHint hint) : hint_(hint) {}

  // Empties the plan; streams are then added in the order they should be read.
  void reset() {
    count_ = 0;
    total_ = issued_ = budget_ = per_call_ = 0;
    line_ = 0;
    stream_ = 0;
  }
  // Adds [p, p + bytes), merged with the previous stream when it continues it.
  void add(const std::byte* p, int64_t bytes) {
    if (bytes <= 0) return;
    if (count_ > 0 && end_[count_ - 1] == p) {
      end_[count_ - 1] = p + bytes;
      return;
    }
    if (count_ == kMaxStreams) return;  // unusual strides: the rest is left to the hardware
    begin_[count_] = p;
    end_[count_] = p + bytes;
    ++count_;
  }
  // Done adding: lines per stream counted from 64-byte-aligned starts.
  void seal() {
    total_ = 0;
    for (int s = 0; s < count_; ++s) {
      const auto b = reinterpret_cast<uintptr_t>(begin_[s]) & ~uintptr_t{63};
      begin_[s] = reinterpret_cast<const std::byte*>(b);
      lines_[s] = (reinterpret_cast<uintptr_t>(end_[s]) - b + 63) / 64;
      total_ += lines_[s];
    }
  }
  // A step may issue up to (step + 1) / steps of all the lines, spread over `calls` calls of
  // tick(). decode_task counts by heads: step = the step's last head, steps = the task's heads.
  void begin_step(int step, int steps, int calls) {
    // Never past the plan's lines (issue_lines walks until it has issued what it was asked).
    budget_ = std::min(total_, total_ * (step + 1) / std::max(steps, 1));
    per_call_ = calls > 0 ? (budget_ - issued_ + calls - 1) / calls : budget_ - issued_;
  }
  // A few lines; call from inside the loops. Always inline (and issue, issue_lines): a call left
  // in the AVX-512 loops spills every live vector register around it. GCC left one there once
  // decode_task grew by the per-token PV (DotTiles::pv_heads' kSplit): e4m3 decode then ran at
  // 0.76x on Zen 5.
  [[gnu::always_inline]] void tick() { issue(per_call_); }
  // Whatever the step's share still holds.
  void finish_step() { issue(budget_ - issued_); }

  // Lines and streams of the sealed plan, and how many lines have been asked for (tests).
  int64_t total_lines() const { return total_; }
  int stream_count() const { return count_; }
  int64_t issued_lines() const { return issued_; }

 private:
  // The lines are walked round-robin over the streams (line 0 of each, then line 1, ...) in
  // locals, the members written back once per call. n <= total_ - issued_ (issue), and every line
  // not yet asked for lies at or after the walk's position, so the walk finds n lines before it
  // passes the longest stream: no bound on `line` per line (nor a longest stream kept). (Without
  // that check, one thread on Zen 5: cache-resident bf16 NHD 1.04-1.08x, f16 NHD 1.02-1.07x,
  // HND 1.0-1.06x, e4m3 level; from DRAM within the noise: bf16 NHD 0.96-1.07x in five pairs,
  // e4m3 and f16 1.01-1.06x, HND level; two threads level.) The order, line by line across the
  // streams, is what the DRAM side wants: visiting one stream a call for its whole share (runs of
  // 4 lines) ran one Zen 4 thread from DRAM at 0.85x (cache-resident 1.07x), runs of 2 lines at
  // 0.97x; whole rounds without the per-line test ran 0.92x cache-resident (2026-12-05).
  [[gnu::always_inline]] void issue(int64_t n) {
    n = std::min(n, budget_ - issued_);
    if (n <= 0) return;
    // Inline: GCC drops a call to a function whose body is only __builtin_prefetch.
    if (hint_ == PrefetchHint::kL1) {
      issue_lines<3>(n);
    } else {
      issue_lines<2>(n);
    }
  }
  template <int kLocality>
  [[gnu::always_inline]] void issue_lines(int64_t n) {
    int64_t line = line_, left = n;
    int stream = stream_;
    while (left > 0) {
      if (line < lines_[stream]) {
        __builtin_prefetch(begin_[stream] + 64 * line, 0, kLocality);
        --left;
      }
      if (++stream == count_) {
        stream = 0;
        ++line;
      }
    }
    issued_ += n - left;
    line_ = line;
    stream_ = stream;
  }

  const std::byte* begin_[kMaxStreams];
  const std::byte* end_[kMaxStreams];
  int64_t lines_[kMaxStreams];
  PrefetchHint hint_;
  int count_ = 0;
  int64_t total_ = 0, issued_ = 0, budget_ = 0, per_call_ = 0;
  int64_t line_ = 0;
  int stream_ = 0;
};

}  // namespace kvattn::cpu::decode_detail
