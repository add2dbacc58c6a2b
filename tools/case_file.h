// Case files make any attention problem replayable (docs/case-files.md): a .safetensors file
// with the inputs under fixed names (q, paged_k_cache, paged_v_cache, kv_indptr, kv_indices,
// kv_last_page_len, qo_indptr, k, v, custom_mask, alibi_slopes) and every problem parameter in
// __metadata__ under FlashInfer's snake_case names, values spelled as on the command line.
// An output file holds `out` (and `lse` when the problem returns it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/problem_text.h"
#include "kvattn/status.h"

namespace kvattn::testing {
class Case;
}

namespace kvattn::io {

// Tensor names of the case files.
inline constexpr const char* kCaseInputNames[] = {
    "q",           "k",         "v",          "paged_k_cache",    "paged_v_cache",
    "qo_indptr",   "kv_indptr", "kv_indices", "kv_last_page_len", "custom_mask",
    "alibi_slopes", "sinks",    "k_scale",    "v_scale",          "k_scale_cache",
    "v_scale_cache",
    // batch_mla_paged
    "q_nope", "q_pe", "ckv_cache", "kpe_cache"};

// Outputs of one attention call, owned.
struct OutputBuffers {
  std::vector<std::byte> out, lse;
};

// A problem with its inputs, owned (host memory, contiguous). Movable (the buffers keep their
// addresses), not copyable.
class OwnedCase {
 public:
  OwnedCase() = default;
  OwnedCase(OwnedCase&&) = default;
  OwnedCase& operator=(OwnedCase&&) = default;
  OwnedCase(const OwnedCase&) = delete;
  OwnedCase& operator=(const OwnedCase&) = delete;

  Problem problem;
  // The per-layer run values (metadata q_scale, k_scale, v_scale, return_lse): inputs_view()
  // carries the scales; return_lse says whether a run writes an lse.
  RunValues run;
  std::vector<int64_t> qo_lens, kv_lens;                           // per request
  std::map<std::string, std::string, std::less<>> extra_metadata;  // e.g. seed
  // Inputs by case-file name, and the shape each was given with.
  std::map<std::string, std::vector<std::byte>, std::less<>> inputs;
  std::map<std::string, std::vector<int64_t>, std::less<>> input_shapes;

  // The inputs viewed together with outputs allocated in `buffers`: out of `o_dtype` and, when
  // `with_lse`, lse f32. Outputs start as NaN so that a skipped write shows.
  AttentionArgs args_with_outputs(OutputBuffers* buffers, DType o_dtype, bool with_lse) const;
  // The inputs only.
  AttentionArgs inputs_view() const;
  // Shape of `out`: [N, H_qo, D_vo], or [H_qo, D_vo] for single_decode; lse drops the last dim.
  std::vector<int64_t> out_shape() const;

  int64_t total_qo() const;  // rows of out (H_qo rows of single_decode count as one)
  // Bytes read and written by one attention call (q, k, v, o and lse), for GB/s.
  int64_t bytes_moved() const;
  // FLOPs by DESIGN.md §5: 2*Lq*Lkv*H_qo*(D_qk + D_vo) per request, causal (2*Lkv - Lq)*Lq in
  // place of 2*Lq*Lkv.
  double flops() const;
};

// Copies the inputs of `args` (views in any layout: strided, combined K/V cache, packed custom
// mask) into contiguous case-file form. Index tensors are checked enough to derive the request
// lengths safely: a view outside its buffer is kOutOfBounds, a wrong dtype kInvalidDType, a bad
// shape or page table kInvalidShape / kInvalidPageTable.
Status capture_case(const Problem& problem, const AttentionArgs& args, OwnedCase* out);
// The same for a random case of the case builder; its seed goes into the metadata.
Status capture_case(testing::Case& c, OwnedCase* out);

Status save_case(const std::string& path, const OwnedCase& c);
// Serializes to memory (what save_case writes).
Status serialize_case(const OwnedCase& c, std::vector<uint8_t>* bytes);

// Loads a case file; every inconsistency between metadata and tensors is a kParseError.
Status load_case(const std::string& path, OwnedCase* out);
Status parse_case(const uint8_t* data, size_t size, OwnedCase* out);

// Writes `out` [N, H_qo, D_vo] (single_decode [H_qo, D_vo]) in its dtype and, when not empty,
// `lse` f32, with the problem and `metadata` (e.g. backend) in __metadata__.
Status save_output(const std::string& path, const Problem& problem, const RunValues& run,
                   const TensorView& out, const TensorView& lse,
                   const std::map<std::string, std::string, std::less<>>& metadata);

}  // namespace kvattn::io
