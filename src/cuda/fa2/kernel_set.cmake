# fa2's kernel translation units, one per (q dtype, kv dtype, head dims), generated from
# kernels/attention_instance.cu.in. The full set mirrors fa2/capability.h (kQDTypes x kKVDTypes x
# kHeadDims); tests/cuda/kernel_set_test.cc checks the two against each other both ways through
# the generated kernel_keys.h, so the lists cannot drift. The CI set is the subset the tests use.
set(KVATTN_FA2_Q_DTYPES f16 bf16)
set(KVATTN_FA2_KV_DTYPES f16 bf16 e4m3 e5m2)
set(KVATTN_FA2_HEAD_DIMS 64_64 128_128 256_256 192_128 96_96 512_512)
# The founding case (bf16 q over an e4m3 cache) and its 16-bit twin, at head dim 128. A cache
# variable, so that a local build can compile a chosen few (e.g. the new head dims) quickly.
set(KVATTN_FA2_CI_KERNELS bf16_bf16_128_128 bf16_e4m3_128_128
    CACHE STRING "fa2 kernels built without KVATTN_CUDA_FULL_KERNELS (q_kv_qk_vo names)")

include(${CMAKE_CURRENT_LIST_DIR}/../common/kernel_set.cmake)

# kvattn_fa2_kernel_set(<sources var> <keys var>): writes kernel_keys.h (full and built key
# lists) and, when CUDA is built, kernel_table.h and one .cu per built key; returns the .cu files
# and the built keys (common/kernel_set.cmake).
function(kvattn_fa2_kernel_set sources_var keys_var)
  set(_pairs "")
  foreach(q IN LISTS KVATTN_FA2_Q_DTYPES)
    foreach(kv IN LISTS KVATTN_FA2_KV_DTYPES)
      list(APPEND _pairs ${q}_${kv})
    endforeach()
  endforeach()
  kvattn_cuda_kernel_set(BACKEND fa2 PAIRS ${_pairs} HEAD_DIMS ${KVATTN_FA2_HEAD_DIMS}
                         CI ${KVATTN_FA2_CI_KERNELS} WITH_KERNELS ${KVATTN_WITH_CUDA}
                         INSTANCE kernels/attention_instance.cu.in PREFIX attention
                         DECL "KernelLaunchInfo @ENTRY@(bool, bool);"
                         SOURCES_VAR _sources KEYS_VAR _keys)
  set(${sources_var} ${_sources} PARENT_SCOPE)
  set(${keys_var} ${_keys} PARENT_SCOPE)
endfunction()
