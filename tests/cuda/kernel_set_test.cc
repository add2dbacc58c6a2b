// fa2's (and, below, fa3's) kernel set against its capability: the full set is the capability's
// (q, kv, head dims) product (also a static_assert in backend.cc), the built set is a subset of
// it, and a problem whose kernel this build lacks is reported as unavailable naming the key.
#include <gtest/gtest.h>

#include <iterator>

#include "core/backend.h"
#include "core/cuda_query.h"
#include "cuda/fa2/capability.h"
#include "cuda/fa2/kernel_keys.h"
#include "cuda/fa3/capability.h"
#include "cuda/fa3/kernel_keys.h"

namespace kvattn::fa2 {
namespace {

Problem problem_for(const KernelKey& k) {
  Problem p;
  p.op = Op::kBatchDecode;
  p.q_dtype = k.q;
  p.kv_dtype = k.kv;
  p.o_dtype = k.q;
  p.head_dim_qk = k.head_dim_qk;
  p.head_dim_vo = k.head_dim_vo;
  return p;
}

bool built(const KernelKey& key) {
  for (int i = 0; i < kBuiltKernelCount; ++i) {
    if (kBuiltKernelKeysStorage[i] == key) return true;
  }
  return false;
}

TEST(Fa2KernelSetTest, EveryFullKeyIsDeclaredAndEveryDeclaredComboHasAKey) {
  const size_t full = sizeof(kFullKernelKeys) / sizeof(KernelKey);
  EXPECT_EQ(full, kQDTypes.size() * kKVDTypes.size() * kHeadDims.size());
  for (const KernelKey& k : kFullKernelKeys) {
    EXPECT_TRUE(fa2_backend().can_implement(problem_for(k), Device::cuda_sm(90)).ok())
        << kernel_key_string(k);
  }
}

// The kernels accumulate q.k in f32: use_fp16_qk_reduction is refused by name, never accepted and
// computed otherwise (issue 13).
TEST(Fa2KernelSetTest, Fp16QkReductionIsDeclaredUnsupported) {
  Problem p = problem_for(kFullKernelKeys[0]);
  p.use_fp16_qk_reduction = true;
  const Status s = fa2_backend().can_implement(p, Device::cuda_sm(90));
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_NE(s.message().find("use_fp16_qk_reduction"), std::string::npos) << s.message();
}

TEST(Fa2KernelSetTest, BuiltKeysAreASubsetOfTheFullSet) {
  for (int i = 0; i < kBuiltKernelCount; ++i) {
    bool in_full = false;
    for (const KernelKey& k : kFullKernelKeys) in_full = in_full || k == kBuiltKernelKeysStorage[i];
    EXPECT_TRUE(in_full) << kernel_key_string(kBuiltKernelKeysStorage[i]);
  }
}

TEST(Fa2KernelSetTest, KernelBuiltNamesTheMissingKey) {
  for (const KernelKey& k : kFullKernelKeys) {
    Status s = fa2_backend().kernel_built(problem_for(k), Device::cuda_sm(90));
    if (built(k)) {
      EXPECT_TRUE(s.ok()) << s.message();
    } else {
      EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
      EXPECT_NE(s.message().find(kernel_key_string(k)), std::string::npos) << s.message();
    }
  }
}

TEST(Fa2KernelSetTest, CudaBuildsCompileTheFoundingCase) {
  if (!detail::cuda_support_built()) GTEST_SKIP() << "CUDA support is not built";
  EXPECT_TRUE(built(KernelKey{DType::kBF16, DType::kE4M3, 128, 128}));
  EXPECT_TRUE(built(KernelKey{DType::kBF16, DType::kBF16, 128, 128}));
}

}  // namespace
}  // namespace kvattn::fa2

// fa3's kernel set against its declaration (fa3/capability.h, with its rules) and what this build
// compiled.

namespace kvattn::fa3 {
namespace {

Problem prefill_for(const KernelKey& k) {
  Problem p;
  p.op = Op::kBatchPrefillPaged;
  p.q_dtype = k.q;
  p.kv_dtype = k.kv;
  p.o_dtype = DType::kBF16;
  p.head_dim_qk = k.head_dim_qk;
  p.head_dim_vo = k.head_dim_vo;
  return p;
}

template <size_t N>
bool contains(const KernelKey (&keys)[N], int count, const KernelKey& key) {
  for (int i = 0; i < count; ++i) {
    if (keys[i] == key) return true;
  }
  return false;
}

TEST(Fa3KernelSetTest, FullSetIsExactlyWhatFa3Declares) {
  int declared = 0;
  for (DType q : kQDTypes) {
    for (DType kv : kKVDTypes) {
      for (HeadDimPair hd : kHeadDims) {
        const KernelKey key{q, kv, hd.qk, hd.vo};
        const bool ok = fa3_backend().can_implement(prefill_for(key), Device::cuda_sm(90)).ok();
        declared += ok;
        EXPECT_EQ(ok, contains(kFullKernelKeys, int(std::size(kFullKernelKeys)), key))
            << kernel_key_string(key);
      }
    }
  }
  EXPECT_EQ(declared, int(std::size(kFullKernelKeys)));
  // The founding rule: bf16 q over an e4m3 cache is not fa3's.
  EXPECT_FALSE(contains(kFullKernelKeys, int(std::size(kFullKernelKeys)),
                        KernelKey{DType::kBF16, DType::kE4M3, 128, 128}));
}

TEST(Fa3KernelSetTest, BuiltIsImplementedIsFull) {
  for (int i = 0; i < kBuiltKernelCount; ++i) {
    const KernelKey& k = kBuiltKernelKeysStorage[i];
    EXPECT_TRUE(contains(kImplementedKernelKeys, int(std::size(kImplementedKernelKeys)), k))
        << kernel_key_string(k);
  }
  for (const KernelKey& k : kImplementedKernelKeys) {
    EXPECT_TRUE(contains(kFullKernelKeys, int(std::size(kFullKernelKeys)), k))
        << kernel_key_string(k);
  }
}

TEST(Fa3KernelSetTest, KernelBuiltSaysWhatIsMissing) {
  const Device sm90 = Device::cuda_sm(90);
  for (const KernelKey& k : kFullKernelKeys) {
    const Status s = fa3_backend().kernel_built(prefill_for(k), sm90);
    if (contains(kBuiltKernelKeysStorage, kBuiltKernelCount, k)) {
      EXPECT_TRUE(s.ok()) << s.message();
    } else {
      EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
      EXPECT_NE(s.message().find(kernel_key_string(k)), std::string::npos) << s.message();
    }
  }
  if (kBuiltKernelCount == 0) GTEST_SKIP() << "fa3's kernels are not built here";
  // Runtime variants the kernel has: masks, window, soft cap, LSE, and decode (single and batch,
  // GQA rows packed).
  Problem p = prefill_for(kBuiltKernelKeysStorage[0]);
  p.window_left = 8;
  p.logits_soft_cap = 30.0f;
  p.mask_mode = MaskMode::kCausal;
  EXPECT_TRUE(fa3_backend().kernel_built(p, sm90).ok());
  for (Op op : {Op::kBatchDecode, Op::kSingleDecode}) {
    p = prefill_for(kBuiltKernelKeysStorage[0]);
    p.op = op;
    EXPECT_TRUE(fa3_backend().kernel_built(p, sm90).ok()) << op_name(op);
  }
  // Every declared key has a kernel; one outside this build is refused with the key and the
  // option that builds it.
  EXPECT_EQ(std::size(kImplementedKernelKeys), std::size(kFullKernelKeys));
  p = prefill_for(KernelKey{DType::kE4M3, DType::kE4M3, 64, 64});
  p.op = Op::kBatchDecode;
  const Status fp8_d64 = fa3_backend().kernel_built(p, sm90);
  if (!contains(kBuiltKernelKeysStorage, kBuiltKernelCount, kernel_key(p))) {
    EXPECT_EQ(fp8_d64.code(), ErrorCode::kUnavailable);
    EXPECT_NE(fp8_d64.message().find("KVATTN_CUDA_FULL_KERNELS"), std::string::npos)
        << fp8_d64.message();
  } else {
    EXPECT_TRUE(fp8_d64.ok()) << fp8_d64.message();
  }
}

TEST(Fa3KernelSetTest, CudaBuildsWith90aCompileBf16At128) {
  if (!detail::cuda_support_built()) GTEST_SKIP() << "CUDA support is not built";
  if (kBuiltKernelCount == 0) GTEST_SKIP() << "90a is not among KVATTN_CUDA_ARCHS";
  EXPECT_TRUE(contains(kBuiltKernelKeysStorage, kBuiltKernelCount,
                       KernelKey{DType::kBF16, DType::kBF16, 128, 128}));
  // Built, and unavailable only for want of a device on a machine without an SM90 GPU.
  const Status avail = fa3_backend().available(Device::cuda_sm(90));
  if (!avail.ok()) {
    EXPECT_NE(avail.message().find("built, but no such device here"), std::string::npos)
        << avail.message();
  }
}

}  // namespace
}  // namespace kvattn::fa3
