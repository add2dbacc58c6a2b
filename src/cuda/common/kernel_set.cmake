# The CUDA backends' kernel sets (fa2/kernel_set.cmake, fa3/kernel_set.cmake): one translation
# unit per key (q dtype, kv dtype, head dims) generated from the backend's instance template,
# the generated kernel_keys.h (the declared, implemented and built key lists) and, when kernels
# are built, kernel_table.h (the built keys' entry points).
#
# kvattn_cuda_kernel_set(
#   BACKEND fa2                     src/cuda/<backend>/*.in -> generated/cuda/<backend>/; the
#                                   templates' variables are KVATTN_<BACKEND>_*
#   PAIRS q_kv...                   the declared (q, kv) dtype pairs, e.g. bf16_e4m3
#   HEAD_DIMS qk_vo...              the declared head dims, e.g. 128_128
#   IMPLEMENTED name...             keys a kernel exists for (q_kv_qk_vo; default: all declared)
#   CI name...                      keys built without KVATTN_CUDA_FULL_KERNELS
#   WITH_KERNELS bool               whether this build compiles the backend's kernels
#   INSTANCE file.cu.in PREFIX name the instance template and its output (<name>_<key>.cu)
#   DECL "..."                      the entry point's declaration, @ENTRY@ for its name
#   TAG_FUNCTION fn                 optional: fn(out q kv) sets KVATTN_<BACKEND>_TAG per key
#   SOURCES_VAR var KEYS_VAR var)   out: the generated .cu files and the built keys' names
#
# The templates see KVATTN_<BACKEND>_Q, _KV, _QK, _VO (and _TAG) per key, and
# KVATTN_<BACKEND>_FULL_KEY_ROWS, _IMPL_KEY_ROWS, _BUILT_KEY_ROWS, _TABLE_DECLS, _TABLE_ROWS.

set(_KVATTN_CUDA_SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR}/..)

function(_kvattn_cuda_dtype_enum out name)
  set(_map_f16 kF16)
  set(_map_bf16 kBF16)
  set(_map_e4m3 kE4M3)
  set(_map_e5m2 kE5M2)
  if(NOT DEFINED _map_${name})
    message(FATAL_ERROR "kvattn_cuda_kernel_set: unknown dtype '${name}'")
  endif()
  set(${out} "DType::${_map_${name}}" PARENT_SCOPE)
endfunction()

function(kvattn_cuda_kernel_set)
  cmake_parse_arguments(PARSE_ARGV 0 A ""
                        "BACKEND;WITH_KERNELS;INSTANCE;PREFIX;DECL;TAG_FUNCTION;SOURCES_VAR;KEYS_VAR"
                        "PAIRS;HEAD_DIMS;IMPLEMENTED;CI")
  string(TOUPPER ${A_BACKEND} _B)
  set(_dir ${_KVATTN_CUDA_SOURCE_DIR}/${A_BACKEND})
  set(_gen_dir ${PROJECT_BINARY_DIR}/generated/cuda/${A_BACKEND})
  set(_full_rows "")
  set(_impl_rows "")
  set(_built_rows "")
  set(_sources "")
  set(_keys "")
  set(_table_decls "")
  set(_table_rows "")
  foreach(pair IN LISTS A_PAIRS)
    string(REPLACE "_" ";" _pair ${pair})
    list(GET _pair 0 q)
    list(GET _pair 1 kv)
    foreach(hd IN LISTS A_HEAD_DIMS)
      string(REPLACE "_" ";" _hd_pair ${hd})
      list(GET _hd_pair 0 qk)
      list(GET _hd_pair 1 vo)
      set(_name ${q}_${kv}_${hd})
      _kvattn_cuda_dtype_enum(_q_enum ${q})
      _kvattn_cuda_dtype_enum(_kv_enum ${kv})
      set(_key "KernelKey{${_q_enum}, ${_kv_enum}, ${qk}, ${vo}}")
      string(APPEND _full_rows "    ${_key},\n")
      if(A_IMPLEMENTED AND NOT _name IN_LIST A_IMPLEMENTED)
        continue()
      endif()
      string(APPEND _impl_rows "    ${_key},\n")
      if(A_WITH_KERNELS AND (KVATTN_CUDA_FULL_KERNELS OR _name IN_LIST A_CI))
        set(_entry ${A_PREFIX}_${_name})
        string(APPEND _built_rows "    ${_key},\n")
        list(APPEND _keys ${_name})
        string(REPLACE "@ENTRY@" "${_entry}" _decl "${A_DECL}")
        string(APPEND _table_decls "${_decl}\n")
        string(APPEND _table_rows "    {${_key}, &${_entry}},\n")
        set(KVATTN_${_B}_Q ${q})
        set(KVATTN_${_B}_KV ${kv})
        set(KVATTN_${_B}_QK ${qk})
        set(KVATTN_${_B}_VO ${vo})
        if(A_TAG_FUNCTION)
          cmake_language(CALL ${A_TAG_FUNCTION} KVATTN_${_B}_TAG ${q} ${kv})
        endif()
        configure_file(${_dir}/${A_INSTANCE} ${_gen_dir}/${_entry}.cu @ONLY)
        list(APPEND _sources ${_gen_dir}/${_entry}.cu)
      endif()
    endforeach()
  endforeach()
  set(KVATTN_${_B}_FULL_KEY_ROWS "${_full_rows}")
  set(KVATTN_${_B}_IMPL_KEY_ROWS "${_impl_rows}")
  set(KVATTN_${_B}_BUILT_KEY_ROWS "${_built_rows}")
  configure_file(${_dir}/kernel_keys.h.in ${_gen_dir}/kernel_keys.h @ONLY)
  if(A_WITH_KERNELS)
    set(KVATTN_${_B}_TABLE_DECLS "${_table_decls}")
    set(KVATTN_${_B}_TABLE_ROWS "${_table_rows}")
    configure_file(${_dir}/kernel_table.h.in ${_gen_dir}/kernel_table.h @ONLY)
  endif()
  set(${A_SOURCES_VAR} ${_sources} PARENT_SCOPE)
  set(${A_KEYS_VAR} ${_keys} PARENT_SCOPE)
endfunction()
