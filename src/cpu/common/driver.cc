#include "cpu/common/driver.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "core/status_macros.h"

namespace kvattn::cpu {

Status bind_workspace(const char* op, const WorkspaceLayout& layout, void* workspace,
                      std::size_t workspace_bytes, std::byte** base) {
  *base = nullptr;
  if (layout.bytes() == 0) return Status::Ok();
  if (workspace == nullptr || workspace_bytes < layout.bytes()) {
    return make_error(ErrorCode::kInvalidArgument, "cpu ", op, ": workspace of ", workspace_bytes,
                      " bytes", workspace == nullptr ? " (null)" : "", ", the plan needs ",
                      layout.bytes());
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(workspace);
  *base = static_cast<std::byte*>(workspace) +
          (WorkspaceLayout::kAlign - addr % WorkspaceLayout::kAlign) % WorkspaceLayout::kAlign;
  return Status::Ok();
}

int64_t auto_kv_chunk(int64_t items, int64_t longest, int threads, int tile, int64_t min_chunk) {
  const int64_t target = int64_t{4} * threads;
  if (threads <= 1 || items <= 0 || items >= target) return 0;
  const int64_t pieces = ceil_div(target, items);
  const int64_t chunk = std::max(min_chunk, ceil_div(ceil_div(longest, pieces), tile) * tile);
  return chunk >= longest ? 0 : chunk;
}

std::vector<HeadRun> head_runs(const std::vector<WorkItem>& work, int max_heads) {
  std::vector<HeadRun> runs;
  const int64_t count = static_cast<int64_t>(work.size());
  for (int64_t i = 0; i < count;) {
    const WorkItem& w = work[i];
    int heads = 1;
    while (heads < max_heads && i + heads < count) {
      const WorkItem& x = work[i + heads];
      if (x.request != w.request || x.qo_begin != w.qo_begin || x.qo_end != w.qo_end ||
          x.kv_begin != w.kv_begin || x.kv_end != w.kv_end || x.kv_head != w.kv_head + heads) {
        break;
      }
      ++heads;
    }
    runs.push_back({i, heads});
    i += heads;
  }
  return runs;
}

std::vector<Split> find_splits(const std::vector<WorkItem>& work) {
  std::vector<Split> splits;
  std::map<std::tuple<int, int, int32_t, int32_t>, std::size_t> index;
  for (std::size_t i = 0; i < work.size(); ++i) {
    const WorkItem& w = work[i];
    if (w.partial < 0) continue;
    const auto [at, added] =
        index.try_emplace({w.request, w.kv_head, w.qo_begin, w.qo_end}, splits.size());
    if (added) splits.emplace_back();
    splits[at->second].push_back(static_cast<int64_t>(i));
  }
  return splits;
}

}  // namespace kvattn::cpu
