// The cpu backend's one workspace layout: every region of a run's workspace, of a thread's
// scratch and of a kernel's scratch is taken in order from a WorkspaceLayout, 64-byte aligned, by
// one function per buffer that runs both where the size is needed (plan time, the scratch size)
// and where the regions are found (run time, the kernel), so the two cannot disagree
// (FlashInfer's AlignedAllocator idea).
#pragma once

#include <cstddef>

#include "core/int_math.h"

namespace kvattn::cpu {

class WorkspaceLayout {
 public:
  static constexpr std::size_t kAlign = 64;

  // Reserves `bytes`; returns the region's offset.
  constexpr std::size_t take(std::size_t bytes) {
    const std::size_t at = used_;
    used_ = align_up(used_ + bytes, kAlign);
    return at;
  }
  // `per_thread` bytes for each of `threads` threads; returns the first thread's offset.
  constexpr std::size_t take_per_thread(std::size_t per_thread, int threads) {
    thread_stride_ = align_up(per_thread, kAlign);
    return take(thread_stride_ * static_cast<std::size_t>(threads));
  }
  constexpr std::size_t thread_stride() const { return thread_stride_; }
  // The regions' extent (a layout inside an aligned region, such as a thread's scratch).
  constexpr std::size_t size() const { return used_; }
  // What the caller provides for a whole workspace: the regions plus room to align its pointer.
  constexpr std::size_t bytes() const { return used_ == 0 ? 0 : used_ + kAlign; }

 private:
  std::size_t used_ = 0, thread_stride_ = 0;
};

// A WorkspaceLayout over a buffer: take() returns each region's address (null while only sizing,
// base null).
class RegionCursor {
 public:
  explicit RegionCursor(std::byte* base) : base_(base) {}
  template <class T = std::byte>
  T* take(std::size_t bytes) {
    const std::size_t at = layout_.take(bytes);
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  std::size_t size() const { return layout_.size(); }

 private:
  std::byte* base_;
  WorkspaceLayout layout_;
};

}  // namespace kvattn::cpu
