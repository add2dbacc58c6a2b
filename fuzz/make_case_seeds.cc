// Writes the seed corpus of fuzz_case_file: small random cases of every operation (layouts,
// masks, position encodings, dtypes) serialized by the case-file writer itself, plus a bare
// .safetensors file. Usage: make_case_seeds OUT_DIR
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "testing/case_builder.h"
#include "tools/case_file.h"
#include "tools/safetensors.h"

namespace {

bool write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvattn;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_case_seeds OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const Op ops[] = {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode, Op::kBatchPrefillPaged,
                    Op::kBatchPrefillRagged};
  int written = 0;
  for (Op op : ops) {
    for (int variant = 0; variant < 4; ++variant) {
      testing::CaseSpec spec;
      Problem& p = spec.problem;
      p.op = op;
      p.batch_size = is_batch(op) ? 2 : 1;
      p.num_qo_heads = 2;
      p.num_kv_heads = 1;
      p.head_dim_qk = 4;
      p.head_dim_vo = variant == 1 ? 2 : 4;
      p.page_size = 3;
      p.kv_layout = variant == 2 ? KVLayout::kHND : KVLayout::kNHD;
      p.q_dtype = variant == 0 ? DType::kF32 : DType::kBF16;
      p.kv_dtype = variant == 2 ? DType::kE4M3 : p.q_dtype;
      p.o_dtype = variant == 1 ? DType::kF16 : DType::kF32;
      p.mask_mode = static_cast<MaskMode>(variant);
      p.pos_encoding_mode = static_cast<PosEncoding>((variant + 1) % 3);
      spec.return_lse = variant != 0;
      spec.kv_lens = is_batch(op) ? std::vector<int64_t>{4, 2} : std::vector<int64_t>{5};
      spec.packed_custom_mask = variant == 2;
      if (variant == 3) {
        // Issue 11: attention sinks over an e5m2 cache with per-(token, head) scales.
        p.mask_mode = MaskMode::kCausal;
        p.pos_encoding_mode = PosEncoding::kNone;
        p.kv_dtype = DType::kE5M2;
        p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
        p.use_sinks = true;
      }
      // The seeds of variants 0-2 are those of the committed files; issue 11's variant 3 has its
      // own.
      const int op_index = static_cast<int>(op);
      spec.seed = variant < 3 ? 100 + op_index * 3 + variant : 300 + op_index;
      testing::Case c = testing::Case::make(spec);
      io::OwnedCase owned;
      std::vector<uint8_t> bytes;
      Status s = io::capture_case(c, &owned);
      if (s.ok()) s = io::serialize_case(owned, &bytes);
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", p.to_string().c_str(), s.to_string().c_str());
        return 1;
      }
      const std::string name = dir + "/" + std::string(op_name(op)) + "_" + std::to_string(variant);
      if (!write_file(name + ".safetensors", bytes)) return 1;
      ++written;
    }
  }
  // MLA: decode and causal prefill, bf16 and e4m3 latent caches.
  for (int variant = 0; variant < 2; ++variant) {
    testing::CaseSpec spec;
    spec.problem = make_mla_problem(2, 16, 3, 0.25f, /*head_dim_ckv=*/8, /*head_dim_kpe=*/4);
    Problem& p = spec.problem;
    p.kv_dtype = variant == 1 ? DType::kE4M3 : DType::kBF16;
    if (variant == 1) spec.scalars.k_scale = 0.5f;
    p.mask_mode = variant == 1 ? MaskMode::kCausal : MaskMode::kNone;
    spec.return_lse = variant == 1;
    spec.qo_lens = variant == 1 ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1, 1};
    spec.kv_lens = {4, 2};
    spec.seed = 100 + written;
    testing::Case c = testing::Case::make(spec);
    io::OwnedCase owned;
    std::vector<uint8_t> bytes;
    Status s = io::capture_case(c, &owned);
    if (s.ok()) s = io::serialize_case(owned, &bytes);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", p.to_string().c_str(), s.to_string().c_str());
      return 1;
    }
    const std::string name = dir + "/batch_mla_paged_" + std::to_string(variant);
    if (!write_file(name + ".safetensors", bytes)) return 1;
    ++written;
  }
  // A plain .safetensors file with metadata and no case fields.
  std::vector<float> values = {1.0f, -2.0f, 0.5f, 4.0f};
  std::vector<io::TensorToWrite> tensors = {
      {"x", DType::kF32, {2, 2}, std::as_bytes(std::span<const float>(values))}};
  std::vector<uint8_t> bytes;
  if (!io::serialize_safetensors(tensors, {{"note", "seed"}}, &bytes).ok()) return 1;
  if (!write_file(dir + "/plain.safetensors", bytes)) return 1;
  std::printf("wrote %d case files and 1 plain file to %s\n", written, dir.c_str());
  return 0;
}
