#include "tools/case_file.h"

#include <cmath>
#include <cstring>

#include "core/status_macros.h"
#include "kvattn/problem_text.h"
#include "testing/case_builder.h"
#include "tools/case_tensors.h"
#include "tools/safetensors.h"

namespace kvattn::io {
namespace {

// Copies a strided host view into contiguous row-major bytes.
std::vector<std::byte> contiguous_bytes(const TensorView& t) {
  const size_t elem = dtype_size(t.dtype);
  const int64_t n = t.numel();
  std::vector<std::byte> out(static_cast<size_t>(n) * elem);
  if (n == 0) return out;
  const auto* base = static_cast<const std::byte*>(t.data);
  std::array<int64_t, kMaxRank> index{};
  int64_t offset = 0;  // element offset of `index`, kept in step with it
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out.data() + i * elem, base + offset * static_cast<int64_t>(elem), elem);
    for (int d = t.rank - 1; d >= 0; --d) {
      if (++index[d] < t.shape[d]) {
        offset += t.strides[d];
        break;
      }
      offset -= (t.shape[d] - 1) * t.strides[d];
      index[d] = 0;
    }
  }
  return out;
}

std::vector<int64_t> shape_of(const TensorView& t) {
  return std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank);
}

// The bit-packed custom mask (each request from a byte boundary, little-endian bits) as one
// byte per element.
std::vector<std::byte> unpack_mask(const std::vector<std::byte>& packed,
                                   const std::vector<int64_t>& qo_lens,
                                   const std::vector<int64_t>& kv_lens, Status* status) {
  std::vector<std::byte> out;
  int64_t byte_pos = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    const int64_t bits = qo_lens[b] * kv_lens[b];
    if (byte_pos + (bits + 7) / 8 > static_cast<int64_t>(packed.size())) {
      *status = make_error(ErrorCode::kInvalidShape, "custom_mask: ", packed.size(),
                           " packed bytes are too few for the requests' qo_len x kv_len bits");
      return {};
    }
    for (int64_t i = 0; i < bits; ++i) {
      auto byte = static_cast<uint8_t>(packed[static_cast<size_t>(byte_pos + i / 8)]);
      out.push_back(static_cast<std::byte>((byte >> (i % 8)) & 1));
    }
    byte_pos += (bits + 7) / 8;
  }
  *status = Status::Ok();
  return out;
}

void fill_nan(std::vector<std::byte>* buf, DType dtype, int64_t n) {
  buf->assign(static_cast<size_t>(n) * dtype_size(dtype), std::byte{0});
  std::vector<float> nan(static_cast<size_t>(n), NAN);
  testing::from_f32(nan.data(), n, dtype, buf->data());
}

TensorView owned_view(const std::vector<std::byte>& buf, DType dtype,
                      const std::vector<int64_t>& shape) {
  // Views of a const case are handed to kernels as inputs only; outputs are separate buffers.
  void* data = const_cast<std::byte*>(buf.data());
  return TensorView::contiguous(data, dtype, shape.data(), static_cast<int>(shape.size()));
}

Status check_input_view(const Problem& problem, std::string_view name, const TensorView& t) {
  if (t.memory != MemoryKind::kHost) {
    return make_error(ErrorCode::kInvalidArgument, name, ": must be in host memory to be saved");
  }
  DType expected = detail::case_input_dtype(problem, name);
  if (t.dtype != expected) {
    return make_error(ErrorCode::kInvalidDType, name, ": dtype ", dtype_name(t.dtype),
                      ", expected ", dtype_name(expected));
  }
  if (t.rank < 0 || t.rank > kMaxRank) {
    return make_error(ErrorCode::kInvalidShape, name, ": rank ", t.rank);
  }
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0 || t.strides[d] < 0) {
      return make_error(ErrorCode::kInvalidShape, name, ": negative shape or stride");
    }
  }
  const int64_t extent = t.extent_elements() * static_cast<int64_t>(dtype_size(t.dtype));
  if (extent > 0 && (t.data == nullptr || extent > t.buffer_bytes)) {
    return make_error(ErrorCode::kOutOfBounds, name, ": shape ", t.shape_string(),
                      " reaches past its ", t.buffer_bytes, "-byte buffer");
  }
  return Status::Ok();
}

}  // namespace

namespace detail {

DType case_input_dtype(const Problem& problem, std::string_view name) {
  if (name == "q" || name == "q_nope" || name == "q_pe") return problem.q_dtype;
  if (name == "k" || name == "v" || name == "paged_k_cache" || name == "paged_v_cache" ||
      name == "ckv_cache" || name == "kpe_cache") {
    return problem.kv_dtype;
  }
  if (name == "custom_mask") return DType::kU8;
  if (name == "alibi_slopes" || name == "sinks" || name == "k_scale" || name == "v_scale" ||
      name == "k_scale_cache" || name == "v_scale_cache") {
    return DType::kF32;
  }
  return DType::kI32;
}

TensorView* case_input_slot(AttentionArgs* args, std::string_view name) {
  if (name == "q") return &args->q;
  if (name == "k") return &args->k;
  if (name == "v") return &args->v;
  if (name == "paged_k_cache") return &args->paged_k_cache;
  if (name == "paged_v_cache") return &args->paged_v_cache;
  if (name == "qo_indptr") return &args->qo_indptr;
  if (name == "kv_indptr") return &args->kv_indptr;
  if (name == "kv_indices") return &args->kv_indices;
  if (name == "kv_last_page_len") return &args->kv_last_page_len;
  if (name == "custom_mask") return &args->custom_mask;
  if (name == "alibi_slopes") return &args->alibi_slopes;
  if (name == "sinks") return &args->sinks;
  if (name == "k_scale") return &args->k_scale;
  if (name == "v_scale") return &args->v_scale;
  if (name == "k_scale_cache") return &args->k_scale_cache;
  if (name == "v_scale_cache") return &args->v_scale_cache;
  if (name == "q_nope") return &args->q_nope;
  if (name == "q_pe") return &args->q_pe;
  if (name == "ckv_cache") return &args->ckv_cache;
  if (name == "kpe_cache") return &args->kpe_cache;
  return nullptr;
}

}  // namespace detail

AttentionArgs OwnedCase::inputs_view() const {
  AttentionArgs a;
  a.scalars = run.scalars();
  for (const auto& [name, bytes] : inputs) {
    TensorView* slot = detail::case_input_slot(&a, name);
    auto shape = input_shapes.find(name);
    if (!slot || shape == input_shapes.end()) continue;
    *slot = owned_view(bytes, detail::case_input_dtype(problem, name), shape->second);
  }
  return a;
}

std::vector<int64_t> OwnedCase::out_shape() const {
  if (problem.op == Op::kSingleDecode) return {problem.num_qo_heads, problem.head_dim_vo};
  return {total_qo(), problem.num_qo_heads, problem.head_dim_vo};
}

AttentionArgs OwnedCase::args_with_outputs(OutputBuffers* buffers, DType o_dtype,
                                           bool with_lse) const {
  AttentionArgs a = inputs_view();
  std::vector<int64_t> shape = out_shape();
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  fill_nan(&buffers->out, o_dtype, n);
  a.out = owned_view(buffers->out, o_dtype, shape);
  if (with_lse) {
    shape.pop_back();
    fill_nan(&buffers->lse, DType::kF32, n / problem.head_dim_vo);
    a.lse = owned_view(buffers->lse, DType::kF32, shape);
  } else {
    buffers->lse.clear();
  }
  return a;
}

int64_t OwnedCase::total_qo() const {
  int64_t n = 0;
  for (int64_t l : qo_lens) n += l;
  return n;
}

int64_t OwnedCase::bytes_moved() const {
  const Problem& p = problem;
  int64_t total_kv = 0;
  for (int64_t l : kv_lens) total_kv += l;
  const int64_t qo = total_qo();
  int64_t bytes = qo * p.num_qo_heads * p.head_dim_qk * static_cast<int64_t>(dtype_size(p.q_dtype));
  // MLA reads each latent (ckv + kpe = head_dim_qk) once: its values are the ckv already read.
  bytes += total_kv * p.num_kv_heads *
           (is_mla(p.op) ? p.head_dim_qk : p.head_dim_qk + p.head_dim_vo) *
           static_cast<int64_t>(dtype_size(p.kv_dtype));
  bytes += qo * p.num_qo_heads * p.head_dim_vo * static_cast<int64_t>(dtype_size(p.o_dtype));
  if (run.return_lse) bytes += qo * p.num_qo_heads * 4;
  // Per-(token, head) scales: one f32 per key and KV head, for K and for V.
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    bytes += total_kv * p.num_kv_heads * 2 * 4;
  }
  return bytes;
}

double OwnedCase::flops() const {
  const Problem& p = problem;
  double total = 0;
  for (size_t b = 0; b < kv_lens.size() && b < qo_lens.size(); ++b) {
    double lq = static_cast<double>(qo_lens[b]), lkv = static_cast<double>(kv_lens[b]);
    double pairs =
        p.mask_mode == MaskMode::kCausal ? std::max(0.0, (2 * lkv - lq) * lq) : 2 * lq * lkv;
    total += pairs * p.num_qo_heads * (p.head_dim_qk + p.head_dim_vo);
  }
  return total;
}

Status capture_case(const Problem& problem, const AttentionArgs& args, OwnedCase* out) {
  OwnedCase c;
  c.problem = problem;
  c.run.q_scale = args.scalars.q_scale;
  c.run.k_scale = args.scalars.k_scale;
  c.run.v_scale = args.scalars.v_scale;
  c.run.return_lse = !args.lse.empty();
  AttentionArgs views = args;  // case_input_slot hands out fields of a non-const AttentionArgs
  for (const char* name : kCaseInputNames) {
    const TensorView* view = detail::case_input_slot(&views, name);
    if (!view->empty()) KVATTN_RETURN_IF_ERROR(check_input_view(problem, name, *view));
  }
  KVATTN_RETURN_IF_ERROR(detail::case_request_lengths(problem, args, &c.qo_lens, &c.kv_lens));
  for (const char* name : kCaseInputNames) {
    const TensorView* view = detail::case_input_slot(&views, name);
    if (view->empty()) continue;
    std::vector<std::byte> bytes = contiguous_bytes(*view);
    std::vector<int64_t> shape = shape_of(*view);
    if (std::string_view(name) == "custom_mask") {
      if (args.custom_mask_packed) {
        Status s;
        bytes = unpack_mask(bytes, c.qo_lens, c.kv_lens, &s);
        KVATTN_RETURN_IF_ERROR(s);
      }
      shape = {static_cast<int64_t>(bytes.size())};
    }
    c.inputs.emplace(name, std::move(bytes));
    c.input_shapes.emplace(name, std::move(shape));
  }
  *out = std::move(c);
  return Status::Ok();
}

Status capture_case(testing::Case& c, OwnedCase* out) {
  KVATTN_RETURN_IF_ERROR(capture_case(c.problem(), c.args(), out));
  out->extra_metadata["seed"] = std::to_string(c.spec().seed);
  return Status::Ok();
}

Status serialize_case(const OwnedCase& c, std::vector<uint8_t>* bytes) {
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, data] : c.inputs) {
    tensors.push_back(
        {name, detail::case_input_dtype(c.problem, name), c.input_shapes.at(name), data});
  }
  auto metadata = problem_to_fields(c.problem, c.run);
  metadata["qo_len"] = format_length_list(c.qo_lens);
  metadata["kv_len"] = format_length_list(c.kv_lens);
  for (const auto& [k, v] : c.extra_metadata) metadata[k] = v;
  return serialize_safetensors(tensors, metadata, bytes);
}

Status save_case(const std::string& path, const OwnedCase& c) {
  std::vector<uint8_t> bytes;
  KVATTN_RETURN_IF_ERROR(serialize_case(c, &bytes));
  return write_file(path, bytes);
}

Status save_output(const std::string& path, const Problem& problem, const RunValues& run,
                   const TensorView& out, const TensorView& lse,
                   const std::map<std::string, std::string, std::less<>>& metadata) {
  std::vector<std::byte> out_bytes = contiguous_bytes(out);
  std::vector<std::byte> lse_bytes;
  std::vector<TensorToWrite> tensors = {{"out", out.dtype, shape_of(out), out_bytes}};
  if (!lse.empty()) {
    lse_bytes = contiguous_bytes(lse);
    tensors.push_back({"lse", DType::kF32, shape_of(lse), lse_bytes});
  }
  auto all = problem_to_fields(problem, run);
  for (const auto& [k, v] : metadata) all[k] = v;
  return write_safetensors_file(path, tensors, all);
}

}  // namespace kvattn::io
