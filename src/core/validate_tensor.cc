#include "core/validate_tensor.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <string>

#include "core/status_macros.h"

namespace kvattn::validation {
namespace {

std::string strides_string(const TensorView& t) {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < t.rank; ++i) os << (i ? ", " : "") << t.strides[i];
  os << ']';
  return os.str();
}

bool known_dtype(DType d) {
  switch (d) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kE4M3:
    case DType::kE5M2:
    case DType::kI32:
    case DType::kU8:
      return true;
  }
  return false;
}

std::string_view memory_name(MemoryKind m) { return m == MemoryKind::kHost ? "host" : "cuda"; }

// The reachable byte extent of a view whose dims and strides are known to be >= 0; false on
// int64 overflow.
bool extent_bytes(const TensorView& t, int64_t* bytes) {
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) {
      *bytes = 0;
      return true;
    }
  }
  for (int i = 0; i < t.rank; ++i) {
    int64_t step = 0;
    if (!checked_mul(t.shape[i] - 1, t.strides[i], &step) || !checked_add(last, step, &last)) {
      return false;
    }
  }
  int64_t elements = 0;
  return checked_add(last, 1, &elements) &&
         checked_mul(elements, static_cast<int64_t>(dtype_size(t.dtype)), bytes);
}

}  // namespace

Status check_view(const TensorView& t, std::string_view name) {
  if (t.rank < 1 || t.rank > kMaxRank) {
    return make_error(ErrorCode::kInvalidShape, name, ": rank ", t.rank, ": must be in [1, ",
                      kMaxRank, "]");
  }
  if (!known_dtype(t.dtype)) {
    return make_error(ErrorCode::kInvalidDType, name, ": dtype code ", static_cast<int>(t.dtype),
                      " is not a kvattn dtype");
  }
  if (t.memory != MemoryKind::kHost && t.memory != MemoryKind::kCuda) {
    return make_error(ErrorCode::kInvalidArgument, name, ": memory kind code ",
                      static_cast<int>(t.memory), " is neither host nor cuda");
  }
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) {
      return make_error(ErrorCode::kInvalidShape, name, ".shape[", i, "] = ", t.shape[i],
                        ": must be >= 0");
    }
  }
  for (int i = 0; i < t.rank; ++i) {
    if (t.strides[i] < 0) {
      return make_error(ErrorCode::kOutOfBounds, name, ".strides[", i, "] = ", t.strides[i],
                        ": must be >= 0 (a negative stride reaches below data)");
    }
  }
  if (t.buffer_bytes < 0) {
    return make_error(ErrorCode::kOutOfBounds, name, ".buffer_bytes = ", t.buffer_bytes,
                      ": must be >= 0");
  }
  int64_t bytes = 0;
  if (!extent_bytes(t, &bytes)) {
    return make_error(ErrorCode::kOverflow, name, ": shape ", t.shape_string(), " with strides ",
                      strides_string(t), " reaches a byte offset past the int64 range");
  }
  if (bytes == 0) return Status::Ok();
  if (t.data == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, name, ".data is null, but shape ",
                      t.shape_string(), " has elements");
  }
  if (bytes > t.buffer_bytes) {
    return make_error(ErrorCode::kOutOfBounds, name, ": shape ", t.shape_string(), " with strides ",
                      strides_string(t), " reaches ", bytes,
                      " bytes: must be <= buffer_bytes = ", t.buffer_bytes);
  }
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  if (begin + static_cast<uintptr_t>(bytes) < begin) {
    return make_error(ErrorCode::kOverflow, name, ": ", bytes,
                      " bytes from data wrap around the address space");
  }
  return Status::Ok();
}

Status check_given(const TensorView& t, std::string_view name, std::string_view op) {
  if (t.empty()) {
    return make_error(ErrorCode::kInvalidArgument, name, ": not given; ", op, " needs it");
  }
  return check_view(t, name);
}

Status check_unused(const TensorView& t, std::string_view name, std::string_view op) {
  if (!t.empty()) {
    return make_error(ErrorCode::kInvalidArgument, name, ": given, but ", op,
                      " does not read it (leave it empty)");
  }
  return Status::Ok();
}

Status check_dtype(const TensorView& t, std::string_view name, DType expected) {
  if (t.dtype != expected) {
    return make_error(ErrorCode::kInvalidDType, name, ": dtype ", dtype_name(t.dtype), ": must be ",
                      dtype_name(expected));
  }
  return Status::Ok();
}

Status check_host(const TensorView& t, std::string_view name) {
  if (t.memory != MemoryKind::kHost) {
    return make_error(ErrorCode::kInvalidArgument, name, ": memory ", memory_name(t.memory),
                      ": must be host memory (validation and planning read it)");
  }
  return Status::Ok();
}

Status check_same_memory(const TensorView& t, std::string_view name, const TensorView& ref,
                         std::string_view ref_name) {
  if (t.memory != ref.memory ||
      (t.memory == MemoryKind::kCuda && t.device_index != ref.device_index)) {
    return make_error(ErrorCode::kInvalidArgument, name, ": memory ", memory_name(t.memory), ":",
                      t.device_index, ": must be the memory of ", ref_name, " (",
                      memory_name(ref.memory), ":", ref.device_index, ")");
  }
  return Status::Ok();
}

Status check_shape(const TensorView& t, std::string_view name, std::string_view layout,
                   std::initializer_list<DimRule> dims) {
  if (t.rank != static_cast<int>(dims.size())) {
    return make_error(ErrorCode::kInvalidShape, name, ": rank ", t.rank, " (shape ",
                      t.shape_string(), "): must be ", dims.size(), ", ", layout);
  }
  int i = 0;
  for (const DimRule& rule : dims) {
    if (rule.size >= 0 && t.shape[i] != rule.size) {
      return make_error(ErrorCode::kInvalidShape, name, ".shape[", i, "] = ", t.shape[i],
                        ": must equal ", rule.meaning, " = ", rule.size, " (", name, " is ", layout,
                        ")");
    }
    ++i;
  }
  return Status::Ok();
}

int64_t reachable_bytes(const TensorView& t) {
  int64_t bytes = 0;
  return extent_bytes(t, &bytes) ? bytes : 0;
}

namespace {

// A view as runs of contiguous bytes: `run` bytes starting at every
// sum_k i_k * stride[k] (bytes, 0 <= i_k < shape[k]) over its outer dims, smallest stride first.
struct Runs {
  int64_t run = 0;
  int n = 0;
  std::array<int64_t, kMaxRank> shape{}, stride{};
  // Each outer stride steps past everything the smaller dims reach (no two runs interleave): then
  // the largest run start <= x is found greedily, one dim at a time, largest stride first.
  bool nested = false;
  int64_t count = 1;  // number of runs (saturating)
};

Runs runs_of(const TensorView& t) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  std::array<int, kMaxRank> order{};
  int n = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] > 1) order[n++] = i;
  }
  std::sort(order.begin(), order.begin() + n,
            [&](int x, int y) { return t.strides[x] < t.strides[y]; });
  Runs r;
  r.run = es;
  int k = 0;
  // Inner dims whose stride is exactly the run so far extend it (checked arithmetic: the view
  // was checked, so every product below is within its extent).
  while (k < n && t.strides[order[k]] * es == r.run) {
    r.run *= t.shape[order[k]];
    ++k;
  }
  int64_t reach = r.run;  // bytes from a run's start to one past the farthest byte so far
  r.nested = true;
  for (; k < n; ++k) {
    const int i = order[k];
    const int64_t stride = t.strides[i] * es;
    if (stride < reach) r.nested = false;
    r.shape[r.n] = t.shape[i];
    r.stride[r.n] = stride;
    ++r.n;
    reach += (t.shape[i] - 1) * stride;
    r.count = r.count > (int64_t{1} << 40) / t.shape[i] ? (int64_t{1} << 40) : r.count * t.shape[i];
  }
  return r;
}

// Whether some run of `r` (offsets relative to its data) shares a byte with [lo, hi). `r` nested.
bool hits(const Runs& r, int64_t lo, int64_t hi) {
  if (hi <= 0) return false;
  // The largest run start <= hi - 1.
  int64_t x = hi - 1, start = 0;
  for (int k = r.n - 1; k >= 0; --k) {
    const int64_t i = std::min(x / r.stride[k], r.shape[k] - 1);
    x -= i * r.stride[k];
    start += i * r.stride[k];
  }
  return start + r.run > lo;
}

// The most runs enumerated to decide one pair exactly; past it the byte ranges decide.
constexpr int64_t kMaxRunsEnumerated = int64_t{1} << 22;

// Whether a run of `a` shares a byte with a run of `b` (b nested), `delta` = a.data - b.data.
bool runs_meet(const Runs& a, const Runs& b, int64_t delta) {
  std::array<int64_t, kMaxRank> idx{};
  int64_t offset = delta;
  while (true) {
    if (hits(b, offset, offset + a.run)) return true;
    int k = 0;
    for (; k < a.n; ++k) {
      offset += a.stride[k];
      if (++idx[k] < a.shape[k]) break;
      offset -= idx[k] * a.stride[k];
      idx[k] = 0;
    }
    if (k == a.n) return false;
  }
}

}  // namespace

bool overlaps(const TensorView& a, const TensorView& b) {
  if (a.empty() || b.empty()) return false;
  if (a.memory != b.memory || (a.memory == MemoryKind::kCuda && a.device_index != b.device_index)) {
    return false;
  }
  const int64_t a_bytes = reachable_bytes(a), b_bytes = reachable_bytes(b);
  if (a_bytes == 0 || b_bytes == 0) return false;
  const uintptr_t a_begin = reinterpret_cast<uintptr_t>(a.data);
  const uintptr_t b_begin = reinterpret_cast<uintptr_t>(b.data);
  if (!(a_begin < b_begin + static_cast<uintptr_t>(b_bytes) &&
        b_begin < a_begin + static_cast<uintptr_t>(a_bytes))) {
    return false;
  }
  // The byte ranges meet; element-exact from here (views of one packed qkv tensor interleave
  // without sharing a byte). Runs of one view are tested against the other's, which must not
  // interleave its own runs; when neither can be decided within the budget, the byte ranges
  // decide (a refusal, never a missed overlap).
  const Runs ra = runs_of(a), rb = runs_of(b);
  const int64_t delta = static_cast<int64_t>(a_begin - b_begin);
  if (rb.nested && ra.count <= kMaxRunsEnumerated && (!ra.nested || ra.count <= rb.count)) {
    return runs_meet(ra, rb, delta);
  }
  if (ra.nested && rb.count <= kMaxRunsEnumerated) return runs_meet(rb, ra, -delta);
  if (!ra.nested && !rb.nested && ra.count <= kMaxRunsEnumerated / rb.count) {
    // Both interleave their own runs (broadcast or repeating strides): split b along its largest
    // stride until it does not.
    int dim = -1;
    for (int i = 0; i < b.rank; ++i) {
      if (b.shape[i] > 1 && (dim < 0 || b.strides[i] > b.strides[dim])) dim = i;
    }
    TensorView part = b;
    part.shape[dim] = 1;
    const int64_t step = b.strides[dim] * static_cast<int64_t>(dtype_size(b.dtype));
    for (int64_t i = 0; i < b.shape[dim]; ++i) {
      part.data = static_cast<char*>(b.data) + i * step;
      if (overlaps(a, part)) return true;
    }
    return false;
  }
  return true;
}

Status check_no_overlap(const TensorView& out, std::string_view out_name, const TensorView& in,
                        std::string_view in_name) {
  if (overlaps(out, in)) {
    return make_error(ErrorCode::kAliasing, out_name, " (", reachable_bytes(out), " bytes at ",
                      out.data, ") overlaps ", in_name, " (", reachable_bytes(in), " bytes at ",
                      in.data, "): an output must not share memory with an input");
  }
  return Status::Ok();
}

Status check_output_layout(const TensorView& t, std::string_view name) {
  if (reachable_bytes(t) == 0) return Status::Ok();
  // Dims of size > 1 by increasing stride: each stride must step past everything the smaller
  // ones reach, else two elements share an address.
  std::array<int, kMaxRank> order{};
  int n = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] > 1) order[n++] = i;
  }
  std::sort(order.begin(), order.begin() + n,
            [&](int x, int y) { return t.strides[x] < t.strides[y]; });
  int64_t reached = 0;  // largest offset the dims so far reach
  for (int k = 0; k < n; ++k) {
    const int i = order[k];
    if (t.strides[i] <= reached) {
      return make_error(ErrorCode::kAliasing, name, ": strides ", strides_string(t), " with shape ",
                        t.shape_string(), " map two elements to one address (dim ", i, ")");
    }
    reached += t.strides[i] * (t.shape[i] - 1);
  }
  return Status::Ok();
}

Status check_index_tensor(const TensorView& t, std::string_view name, std::string_view op,
                          int64_t length, std::string_view length_meaning) {
  KVATTN_RETURN_IF_ERROR(check_given(t, name, op));
  KVATTN_RETURN_IF_ERROR(check_dtype(t, name, DType::kI32));
  KVATTN_RETURN_IF_ERROR(check_host(t, name));
  return check_shape(t, name, "[n] int32", {{length, length_meaning}});
}

Status check_indptr(const TensorView& indptr, std::string_view name, int64_t batch,
                    int64_t* total) {
  if (index_at(indptr, 0) != 0) {
    return make_error(ErrorCode::kInvalidPageTable, name, "[0] = ", index_at(indptr, 0),
                      ": must be 0");
  }
  for (int64_t b = 1; b <= batch; ++b) {
    const int32_t prev = index_at(indptr, b - 1), cur = index_at(indptr, b);
    if (cur < prev) {
      return make_error(ErrorCode::kInvalidPageTable, name, "[", b, "] = ", cur,
                        ": must be >= ", name, "[", b - 1, "] = ", prev, " (non-decreasing)");
    }
  }
  *total = index_at(indptr, batch);
  return Status::Ok();
}

Status check_page_table(const TensorView& kv_indptr, const TensorView& kv_indices,
                        const TensorView& kv_last_page_len, int64_t batch, int64_t num_pages,
                        int64_t page_size) {
  int64_t total_pages = 0;
  KVATTN_RETURN_IF_ERROR(check_indptr(kv_indptr, "kv_indptr", batch, &total_pages));
  if (total_pages > kv_indices.shape[0]) {
    return make_error(ErrorCode::kInvalidPageTable, "kv_indptr[", batch, "] = ", total_pages,
                      ": must be <= the length of kv_indices = ", kv_indices.shape[0],
                      " (total pages)");
  }
  for (int64_t i = 0; i < total_pages; ++i) {
    const int32_t page = index_at(kv_indices, i);
    if (page < 0 || page >= num_pages) {
      return make_error(ErrorCode::kInvalidPageTable, "kv_indices[", i, "] = ", page,
                        ": must be in [0, num_pages = ", num_pages, ")");
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (index_at(kv_indptr, b + 1) == index_at(kv_indptr, b)) continue;
    const int32_t last = index_at(kv_last_page_len, b);
    if (last < 1 || last > page_size) {
      return make_error(ErrorCode::kInvalidPageTable, "kv_last_page_len[", b, "] = ", last,
                        ": must be in [1, page_size = ", page_size, "] for a request with pages");
    }
  }
  return Status::Ok();
}

}  // namespace kvattn::validation
