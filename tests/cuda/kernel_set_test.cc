// fa2's kernel set against its capability: the full set is the capability's (q, kv, head dims)
// product (also a static_assert in backend.cc), the built set is a subset of it, and a problem
// whose kernel this build lacks is reported as unavailable naming the key.
#include <gtest/gtest.h>

#include "core/backend.h"
#include "core/cuda_query.h"
#include "cuda/fa2/capability.h"
#include "cuda/fa2/kernel_keys.h"

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
