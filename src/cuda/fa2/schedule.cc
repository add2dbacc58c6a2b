#include "cuda/fa2/schedule.h"

#include <algorithm>
#include <cstring>

#include "core/attention_math.h"
#include "core/split_kv.h"
#include "cuda/fa2/kernels/unit_math.h"

namespace kvattn::fa2 {
namespace {

// Splitting a chunk smaller than this costs more in the merge than it gains in parallelism.
constexpr int64_t kMinChunkKeys = 256;

// The keys a unit loads (the kernel's own unit_key_range): its cost, up to the row count.
int64_t unit_keys(const Problem& p, const Schedule& s, const WorkUnit& w) {
  AttentionParams params;
  params.causal = p.mask_mode == MaskMode::kCausal;
  params.window_left = p.window_left;
  params.group = p.group_size();
  params.chunk_size = s.chunk_size;
  const split::ChunkRange keys = unit_key_range(params, w, s.requests[w.request]);
  return keys.end > keys.begin ? keys.end - keys.begin : 0;
}

// CTAs start in grid order: with causal masks (and windows, and requests of different lengths)
// the units' costs differ by up to the whole context, and starting the longest last leaves the
// GPU waiting on a tail of them. Costliest first (stable, so equal units keep their order).
void order_costliest_first(const Problem& p, Schedule* s) {
  std::vector<std::pair<int64_t, WorkUnit>> keyed;
  keyed.reserve(s->work.size());
  for (const WorkUnit& w : s->work) keyed.emplace_back(unit_keys(p, *s, w), w);
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = 0; i < keyed.size(); ++i) s->work[i] = keyed[i].second;
}

}  // namespace

Schedule make_schedule(const Problem& p, const std::vector<int64_t>& qo_len,
                       const std::vector<int64_t>& kv_len, const RequestStarts& starts,
                       bool custom_mask_packed, int64_t requested_chunk, int num_sms) {
  Schedule s;
  const int group = p.group_size();
  const int batch = p.batch_size;
  int64_t max_rows = 0;
  for (int b = 0; b < batch; ++b) max_rows = std::max(max_rows, qo_len[b] * group);
  s.decode_tile = max_rows <= kDecodeRows;
  s.tile_rows = s.decode_tile ? kDecodeRows : prefill_rows(p.head_dim_qk);
  const int64_t tile_rows = s.tile_rows;

  int64_t row_tiles = 0;
  for (int b = 0; b < batch; ++b) row_tiles += (qo_len[b] * group + tile_rows - 1) / tile_rows;
  const int64_t units = row_tiles * p.num_kv_heads;
  if (requested_chunk > 0) {
    s.chunk_size = requested_chunk;
  } else if (requested_chunk == 0 && batch > 0) {
    const int64_t per_request = std::max<int64_t>(1, units / batch);
    s.chunk_size = split::choose_chunk_size(kv_len.data(), batch, per_request,
                                            int64_t(2) * std::max(1, num_sms), kMinChunkKeys);
  }

  int64_t mask_offset = 0;
  s.requests.resize(batch);
  for (int b = 0; b < batch; ++b) {
    RequestInfo& r = s.requests[b];
    r.q_row = starts.q_row[b];
    r.qo_len = qo_len[b];
    r.kv_len = kv_len[b];
    r.kv_first = starts.kv_first[b];
    r.mask_offset = mask_offset;
    mask_offset += math::custom_mask_bytes(qo_len[b], kv_len[b], custom_mask_packed);
    r.chunks = split::num_chunks(kv_len[b], s.chunk_size);
    r.partial_base = s.num_partial_states;
    if (r.chunks > 1) {
      s.num_partial_states += qo_len[b] * r.chunks;
      for (int64_t i = 0; i < qo_len[b]; ++i) {
        s.merge_rows.push_back(MergeRow{r.q_row + i, r.partial_base + i * r.chunks, r.chunks});
      }
    }
    const int64_t rows = qo_len[b] * group;
    for (int h = 0; h < p.num_kv_heads; ++h) {
      for (int64_t row = 0; row < rows; row += tile_rows) {
        for (int64_t c = 0; c < r.chunks; ++c) {
          WorkUnit w;
          w.request = b;
          w.kv_head = h;
          w.row_begin = int32_t(row);
          w.row_end = int32_t(std::min(rows, row + tile_rows));
          w.chunk = r.chunks > 1 ? int32_t(c) : -1;
          s.work.push_back(w);
        }
      }
    }
  }
  order_costliest_first(p, &s);
  return s;
}

WorkspaceLayout workspace_layout(const Schedule& s, std::size_t num_kv_indices, int num_qo_heads,
                                 int head_dim_vo) {
  constexpr std::size_t kAlign = 256;
  std::size_t at = 0;
  const auto take = [&](std::size_t bytes) {
    const std::size_t offset = at;
    at += (bytes + kAlign - 1) / kAlign * kAlign;
    return offset;
  };
  WorkspaceLayout l;
  l.requests = take(s.requests.size() * sizeof(RequestInfo));
  l.work = take(s.work.size() * sizeof(WorkUnit));
  l.merge_rows = take(s.merge_rows.size() * sizeof(MergeRow));
  l.kv_indices = take(num_kv_indices * sizeof(int32_t));
  l.staged_bytes = at;
  const std::size_t states = std::size_t(s.num_partial_states) * std::size_t(num_qo_heads);
  l.partial_o = take(states * std::size_t(head_dim_vo) * sizeof(float));
  l.partial_lse = take(states * sizeof(float));
  l.total_bytes = at;
  return l;
}

void fill_staging(const Schedule& s, const std::vector<int32_t>& kv_indices,
                  const WorkspaceLayout& l, std::byte* staging) {
  std::memset(staging, 0, l.staged_bytes);
  const auto put = [&](std::size_t offset, const auto& v) {
    if (!v.empty()) std::memcpy(staging + offset, v.data(), v.size() * sizeof(v[0]));
  };
  put(l.requests, s.requests);
  put(l.work, s.work);
  put(l.merge_rows, s.merge_rows);
  put(l.kv_indices, kv_indices);
}

std::vector<WorkItem> describe(const Schedule& s, int group) {
  std::vector<WorkItem> items;
  items.reserve(s.work.size());
  for (const WorkUnit& w : s.work) {
    const RequestInfo& r = s.requests[w.request];
    WorkItem item;
    item.request = w.request;
    item.kv_head = w.kv_head;
    item.qo_begin = w.row_begin / group;
    item.qo_end = (w.row_end + group - 1) / group;
    split::ChunkRange keys = w.chunk < 0 ? split::ChunkRange{0, r.kv_len}
                                         : split::chunk_range(r.kv_len, s.chunk_size, w.chunk);
    item.kv_begin = keys.begin;
    item.kv_end = keys.end;
    item.partial = w.chunk;
    items.push_back(item);
  }
  return items;
}

}  // namespace kvattn::fa2
