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

function(_kvattn_fa2_dtype_enum out name)
  set(_map_f16 kF16)
  set(_map_bf16 kBF16)
  set(_map_e4m3 kE4M3)
  set(_map_e5m2 kE5M2)
  set(${out} "DType::${_map_${name}}" PARENT_SCOPE)
endfunction()

# kvattn_fa2_kernel_set(<sources var> <keys var>): writes kernel_keys.h (full and built key
# lists) and, when CUDA is built, one .cu per built key; returns the .cu files.
function(kvattn_fa2_kernel_set sources_var keys_var)
  set(_gen_dir ${PROJECT_BINARY_DIR}/generated/cuda/fa2)
  set(_full_rows "")
  set(_built_rows "")
  set(_sources "")
  set(_keys "")
  set(_table_decls "")
  set(_table_rows "")
  foreach(q IN LISTS KVATTN_FA2_Q_DTYPES)
    foreach(kv IN LISTS KVATTN_FA2_KV_DTYPES)
      foreach(hd IN LISTS KVATTN_FA2_HEAD_DIMS)
        string(REPLACE "_" ";" _hd_pair ${hd})
        list(GET _hd_pair 0 qk)
        list(GET _hd_pair 1 vo)
        set(_name ${q}_${kv}_${hd})
        _kvattn_fa2_dtype_enum(_q_enum ${q})
        _kvattn_fa2_dtype_enum(_kv_enum ${kv})
        set(_row "    KernelKey{${_q_enum}, ${_kv_enum}, ${qk}, ${vo}},\n")
        string(APPEND _full_rows "${_row}")
        if(KVATTN_CUDA_FULL_KERNELS OR _name IN_LIST KVATTN_FA2_CI_KERNELS)
          string(APPEND _built_rows "${_row}")
          list(APPEND _keys ${_name})
          string(APPEND _table_decls
                 "KernelLaunchInfo attention_${_name}(bool, bool);\n")
          string(APPEND _table_rows
                 "    {KernelKey{${_q_enum}, ${_kv_enum}, ${qk}, ${vo}}, &attention_${_name}},\n")
          if(KVATTN_WITH_CUDA)
            set(KVATTN_FA2_Q ${q})
            set(KVATTN_FA2_KV ${kv})
            set(KVATTN_FA2_QK ${qk})
            set(KVATTN_FA2_VO ${vo})
            configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kernels/attention_instance.cu.in
                           ${_gen_dir}/attention_${_name}.cu @ONLY)
            list(APPEND _sources ${_gen_dir}/attention_${_name}.cu)
          endif()
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(NOT KVATTN_WITH_CUDA)
    set(_built_rows "")
  endif()
  set(KVATTN_FA2_FULL_KEY_ROWS "${_full_rows}")
  set(KVATTN_FA2_BUILT_KEY_ROWS "${_built_rows}")
  configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kernel_keys.h.in ${_gen_dir}/kernel_keys.h
                 @ONLY)
  if(KVATTN_WITH_CUDA)
    set(KVATTN_FA2_TABLE_DECLS "${_table_decls}")
    set(KVATTN_FA2_TABLE_ROWS "${_table_rows}")
    configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kernel_table.h.in
                   ${_gen_dir}/kernel_table.h @ONLY)
  endif()
  set(${sources_var} ${_sources} PARENT_SCOPE)
  set(${keys_var} ${_keys} PARENT_SCOPE)
endfunction()
