#include "core/capability.h"

#include <algorithm>
#include <sstream>

#include "core/status_macros.h"

namespace kvattn {
namespace {

template <class T>
bool contains(std::span<const T> set, const T& value) {
  return std::find(set.begin(), set.end(), value) != set.end();
}

std::string_view name_of(DType d) { return dtype_name(d); }
std::string_view name_of(Op o) { return op_name(o); }
std::string_view name_of(MaskMode m) { return mask_mode_name(m); }
std::string_view name_of(PosEncoding p) { return pos_encoding_name(p); }
std::string_view name_of(KVLayout l) { return kv_layout_name(l); }
std::string_view name_of(KVScaleGranularity g) { return kv_scale_granularity_name(g); }

template <class T>
std::string list(std::span<const T> set) {
  std::ostringstream os;
  os << '{';
  for (std::size_t i = 0; i < set.size(); ++i) os << (i ? ", " : "") << name_of(set[i]);
  os << '}';
  return os.str();
}

std::string list(std::span<const HeadDimPair> set) {
  std::ostringstream os;
  os << '{';
  for (std::size_t i = 0; i < set.size(); ++i) {
    os << (i ? ", " : "") << '(' << set[i].qk << ',' << set[i].vo << ')';
  }
  os << '}';
  return os.str();
}

template <class T>
Status check_member(const CapabilityDecl& decl, std::string_view what, std::span<const T> set,
                    const T& value) {
  if (contains(set, value)) return Status::Ok();
  return make_error(ErrorCode::kNotSupported, decl.backend, ": ", what, " ", name_of(value),
                    " is not supported (supported: ", list(set), ")");
}

}  // namespace

Status check_capability(const CapabilityDecl& decl, const Problem& p, const Device& device) {
  const char* b = decl.backend;
  if (decl.device_kind == Device::Kind::kCpu && !device.is_cpu()) {
    return make_error(ErrorCode::kNotSupported, b, ": runs on the CPU only, not on device ",
                      device.to_string());
  }
  if (decl.device_kind == Device::Kind::kCuda) {
    if (!device.is_cuda()) {
      return make_error(ErrorCode::kNotSupported, b, ": needs a CUDA GPU, device is ",
                        device.to_string());
    }
    if (decl.min_sm && device.sm < decl.min_sm) {
      return make_error(ErrorCode::kNotSupported, b, ": needs SM", decl.min_sm,
                        decl.max_sm == decl.min_sm ? "" : " or newer", ", device is sm",
                        device.sm);
    }
    if (decl.max_sm && device.sm > decl.max_sm) {
      return make_error(ErrorCode::kNotSupported, b, ": needs SM", decl.max_sm,
                        decl.max_sm == decl.min_sm ? "" : " or older", ", device is sm",
                        device.sm);
    }
  }
  if (is_mla(p.op) && decl.mla_unsupported_reason) {
    return make_error(ErrorCode::kNotSupported, b, ": operation batch_mla_paged is not supported (",
                      decl.mla_unsupported_reason, ")");
  }
  KVATTN_RETURN_IF_ERROR(check_member(decl, "operation", decl.ops, p.op));
  KVATTN_RETURN_IF_ERROR(check_member(decl, "q dtype", decl.q_dtypes, p.q_dtype));
  KVATTN_RETURN_IF_ERROR(check_member(decl, "kv dtype", decl.kv_dtypes, p.kv_dtype));
  KVATTN_RETURN_IF_ERROR(check_member(decl, "o dtype", decl.o_dtypes, p.o_dtype));
  if (!decl.head_dims.empty() &&
      !contains(decl.head_dims, HeadDimPair{p.head_dim_qk, p.head_dim_vo})) {
    return make_error(ErrorCode::kNotSupported, b, ": head dims (qk ", p.head_dim_qk, ", vo ",
                      p.head_dim_vo, ") are not supported (supported (qk,vo): ",
                      list(decl.head_dims), ")");
  }
  KVATTN_RETURN_IF_ERROR(check_member(decl, "mask mode", decl.mask_modes, p.mask_mode));
  KVATTN_RETURN_IF_ERROR(
      check_member(decl, "pos_encoding_mode", decl.pos_encodings, p.pos_encoding_mode));
  KVATTN_RETURN_IF_ERROR(check_member(decl, "kv layout", decl.kv_layouts, p.kv_layout));
  if (!decl.soft_cap && p.logits_soft_cap > 0) {
    return make_error(ErrorCode::kNotSupported, b, ": logits_soft_cap ", p.logits_soft_cap,
                      " is not supported (no soft cap)");
  }
  if (!decl.sliding_window && p.window_left >= 0) {
    return make_error(ErrorCode::kNotSupported, b, ": window_left ", p.window_left,
                      " is not supported (no sliding window)");
  }
  if (!decl.fp16_qk_reduction && p.use_fp16_qk_reduction) {
    return make_error(ErrorCode::kNotSupported, b,
                      ": use_fp16_qk_reduction=true is not supported (fp32 QK reduction only)");
  }
  if (!decl.sinks && p.use_sinks) {
    return make_error(ErrorCode::kNotSupported, b,
                      ": use_sinks=true is not supported (no attention sinks)");
  }
  if (decl.kv_scale_granularities.empty()) {
    if (p.kv_scale_granularity != KVScaleGranularity::kPerTensor) {
      return make_error(ErrorCode::kNotSupported, b, ": kv_scale_granularity ",
                        kv_scale_granularity_name(p.kv_scale_granularity),
                        " is not supported (supported: {per_tensor})");
    }
  } else {
    KVATTN_RETURN_IF_ERROR(check_member(decl, "kv_scale_granularity", decl.kv_scale_granularities,
                                        p.kv_scale_granularity));
  }
  for (CapabilityRule rule : decl.rules) KVATTN_RETURN_IF_ERROR(rule(p, device));
  return Status::Ok();
}

}  // namespace kvattn
