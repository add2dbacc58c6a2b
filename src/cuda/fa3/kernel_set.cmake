# fa3's kernel translation units, one per (q dtype, kv dtype, head dims), generated from
# kernels/prefill_instance.cu.in. The full set is what fa3/capability.h declares: its q dtypes x
# kv dtypes x head dims, less the pairs its rules refuse (16-bit Q needs the same 16-bit KV; FP8 Q
# needs an FP8 cache and the reverse); tests/cuda/kernel_set_test.cc checks the two against each
# other through the generated kernel_keys.h. The implemented set is the keys a kernel exists for;
# the CI set is the subset CI compiles. Kernels are compiled for 90a only (wgmma).
set(KVATTN_FA3_DTYPE_PAIRS f16_f16 bf16_bf16 e4m3_e4m3 e4m3_e5m2 e5m2_e4m3 e5m2_e5m2)
set(KVATTN_FA3_HEAD_DIMS 64_64 128_128 256_256 192_128)
set(KVATTN_FA3_IMPLEMENTED_KERNELS bf16_bf16_128_128 f16_f16_128_128 e4m3_e4m3_128_128
    e5m2_e5m2_128_128 bf16_bf16_64_64 f16_f16_64_64 bf16_bf16_192_128 f16_f16_192_128
    bf16_bf16_256_256 f16_f16_256_256 e4m3_e5m2_128_128 e5m2_e4m3_128_128
    e4m3_e4m3_64_64 e5m2_e5m2_64_64 e4m3_e5m2_64_64 e5m2_e4m3_64_64
    e4m3_e4m3_192_128 e5m2_e5m2_192_128 e4m3_e5m2_192_128 e5m2_e4m3_192_128
    e4m3_e4m3_256_256 e5m2_e5m2_256_256 e4m3_e5m2_256_256 e5m2_e4m3_256_256)
set(KVATTN_FA3_CI_KERNELS bf16_bf16_128_128 e4m3_e4m3_128_128)

include(${CMAKE_CURRENT_LIST_DIR}/../common/kernel_set.cmake)

# The kernel's type tag (prefill.cuh) for a (q, kv) pair.
function(_kvattn_fa3_tag out q kv)
  set(_tag_bf16 cuda::Bf16Tag)
  set(_tag_f16 cuda::F16Tag)
  set(_tag_e4m3 E4m3Tag)
  set(_tag_e5m2 E5m2Tag)
  set(_tag_e4m3_e5m2 E4m3E5m2Tag)
  set(_tag_e5m2_e4m3 E5m2E4m3Tag)
  if(q STREQUAL kv)
    set(${out} ${_tag_${q}} PARENT_SCOPE)
  else()
    set(${out} ${_tag_${q}_${kv}} PARENT_SCOPE)
  endif()
endfunction()

# kvattn_fa3_kernel_set(<sources var> <keys var>): writes kernel_keys.h (full, implemented and
# built key lists) and, when fa3 kernels are built, kernel_table.h and one .cu per built key;
# returns the .cu files and the built keys (common/kernel_set.cmake).
function(kvattn_fa3_kernel_set sources_var keys_var)
  set(_with_kernels OFF)
  if(KVATTN_WITH_CUDA AND "90a" IN_LIST KVATTN_CUDA_ARCHS)
    set(_with_kernels ON)
  endif()
  kvattn_cuda_kernel_set(BACKEND fa3 PAIRS ${KVATTN_FA3_DTYPE_PAIRS}
                         HEAD_DIMS ${KVATTN_FA3_HEAD_DIMS}
                         IMPLEMENTED ${KVATTN_FA3_IMPLEMENTED_KERNELS}
                         CI ${KVATTN_FA3_CI_KERNELS} WITH_KERNELS ${_with_kernels}
                         INSTANCE kernels/prefill_instance.cu.in PREFIX prefill
                         DECL "int @ENTRY@(const PrefillParams&, int, void*);"
                         TAG_FUNCTION _kvattn_fa3_tag SOURCES_VAR _sources KEYS_VAR _keys)
  set(${sources_var} ${_sources} PARENT_SCOPE)
  set(${keys_var} ${_keys} PARENT_SCOPE)
endfunction()
