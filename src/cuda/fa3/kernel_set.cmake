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

function(_kvattn_fa3_dtype_enum out name)
  set(_map_f16 kF16)
  set(_map_bf16 kBF16)
  set(_map_e4m3 kE4M3)
  set(_map_e5m2 kE5M2)
  set(${out} "DType::${_map_${name}}" PARENT_SCOPE)
endfunction()

# kvattn_fa3_kernel_set(<sources var> <keys var>): writes kernel_keys.h (full, implemented and
# built key lists) and, when fa3 kernels are built, kernel_table.h and one .cu per built key;
# returns the .cu files and the built keys.
function(kvattn_fa3_kernel_set sources_var keys_var)
  set(_gen_dir ${PROJECT_BINARY_DIR}/generated/cuda/fa3)
  set(_with_kernels OFF)
  if(KVATTN_WITH_CUDA AND "90a" IN_LIST KVATTN_CUDA_ARCHS)
    set(_with_kernels ON)
  endif()
  set(_full_rows "")
  set(_impl_rows "")
  set(_built_rows "")
  set(_sources "")
  set(_keys "")
  set(_table_decls "")
  set(_table_rows "")
  foreach(pair IN LISTS KVATTN_FA3_DTYPE_PAIRS)
    string(REPLACE "_" ";" _pair ${pair})
    list(GET _pair 0 q)
    list(GET _pair 1 kv)
    foreach(hd IN LISTS KVATTN_FA3_HEAD_DIMS)
      string(REPLACE "_" ";" _hd_pair ${hd})
      list(GET _hd_pair 0 qk)
      list(GET _hd_pair 1 vo)
      set(_name ${q}_${kv}_${hd})
      _kvattn_fa3_dtype_enum(_q_enum ${q})
      _kvattn_fa3_dtype_enum(_kv_enum ${kv})
      set(_row "    KernelKey{${_q_enum}, ${_kv_enum}, ${qk}, ${vo}},\n")
      string(APPEND _full_rows "${_row}")
      if(NOT _name IN_LIST KVATTN_FA3_IMPLEMENTED_KERNELS)
        continue()
      endif()
      string(APPEND _impl_rows "${_row}")
      if(_with_kernels AND (KVATTN_CUDA_FULL_KERNELS OR _name IN_LIST KVATTN_FA3_CI_KERNELS))
        string(APPEND _built_rows "${_row}")
        list(APPEND _keys ${_name})
        string(APPEND _table_decls "int prefill_${_name}(const PrefillParams&, int, void*);\n")
        string(APPEND _table_rows
               "    {KernelKey{${_q_enum}, ${_kv_enum}, ${qk}, ${vo}}, &prefill_${_name}},\n")
        set(KVATTN_FA3_Q ${q})
        set(KVATTN_FA3_KV ${kv})
        set(KVATTN_FA3_QK ${qk})
        set(KVATTN_FA3_VO ${vo})
        set(_tag_bf16 cuda::Bf16Tag)
        set(_tag_f16 cuda::F16Tag)
        set(_tag_e4m3 E4m3Tag)
        set(_tag_e5m2 E5m2Tag)
        set(_tag_e4m3_e5m2 E4m3E5m2Tag)
        set(_tag_e5m2_e4m3 E5m2E4m3Tag)
        if(q STREQUAL kv)
          set(KVATTN_FA3_TAG ${_tag_${q}})
        else()
          set(KVATTN_FA3_TAG ${_tag_${q}_${kv}})
        endif()
        configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kernels/prefill_instance.cu.in
                       ${_gen_dir}/prefill_${_name}.cu @ONLY)
        list(APPEND _sources ${_gen_dir}/prefill_${_name}.cu)
      endif()
    endforeach()
  endforeach()
  set(KVATTN_FA3_FULL_KEY_ROWS "${_full_rows}")
  set(KVATTN_FA3_IMPL_KEY_ROWS "${_impl_rows}")
  set(KVATTN_FA3_BUILT_KEY_ROWS "${_built_rows}")
  configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kernel_keys.h.in ${_gen_dir}/kernel_keys.h
                 @ONLY)
  if(_with_kernels)
    set(KVATTN_FA3_TABLE_DECLS "${_table_decls}")
    set(KVATTN_FA3_TABLE_ROWS "${_table_rows}")
    configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kernel_table.h.in
                   ${_gen_dir}/kernel_table.h @ONLY)
  endif()
  set(${sources_var} ${_sources} PARENT_SCOPE)
  set(${keys_var} ${_keys} PARENT_SCOPE)
endfunction()
