// fa3's 16-bit keys (bf16 and f16 at every declared head dims) on the emulator.
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/fa3_replay_ctas.h"

namespace kvattn::fa3 {

template <class Tag>
bool replay_dims(const KernelKey& key, const PrefillParams& k, int ctas, bool early) {
  if (key.head_dim_qk == 64 && key.head_dim_vo == 64) {
    replay_ctas<Tag, 64, 64>(k, ctas, early);
  } else if (key.head_dim_qk == 128 && key.head_dim_vo == 128) {
    replay_ctas<Tag, 128, 128>(k, ctas, early);
  } else if (key.head_dim_qk == 192 && key.head_dim_vo == 128) {
    replay_ctas<Tag, 192, 128>(k, ctas, early);
  } else if (key.head_dim_qk == 256 && key.head_dim_vo == 256) {
    replay_ctas<Tag, 256, 256>(k, ctas, early);
  } else {
    return false;
  }
  return true;
}

bool replay_kernel16(const KernelKey& key, const PrefillParams& k, int ctas, bool early) {
  if (key.q != key.kv) return false;
  if (key.q == DType::kBF16) return replay_dims<cuda::Bf16Tag>(key, k, ctas, early);
  if (key.q == DType::kF16) return replay_dims<cuda::F16Tag>(key, k, ctas, early);
  return false;
}

}  // namespace kvattn::fa3
