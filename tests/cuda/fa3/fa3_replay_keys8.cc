// fa3's FP8 keys (the four (q, kv) pairs of e4m3 / e5m2 at every declared head dims) on the
// emulator.
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/fa3_replay_ctas.h"

namespace kvattn::fa3 {

template <class Tag>
bool replay_dims8(const KernelKey& key, const PrefillParams& k, int ctas, bool early) {
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

bool replay_kernel8(const KernelKey& key, const PrefillParams& k, int ctas, bool early) {
  const bool q4 = key.q == DType::kE4M3, q5 = key.q == DType::kE5M2;
  const bool kv4 = key.kv == DType::kE4M3, kv5 = key.kv == DType::kE5M2;
  if (q4 && kv4) return replay_dims8<E4m3Tag>(key, k, ctas, early);
  if (q5 && kv5) return replay_dims8<E5m2Tag>(key, k, ctas, early);
  if (q4 && kv5) return replay_dims8<E4m3E5m2Tag>(key, k, ctas, early);
  if (q5 && kv4) return replay_dims8<E5m2E4m3Tag>(key, k, ctas, early);
  return false;
}

}  // namespace kvattn::fa3
