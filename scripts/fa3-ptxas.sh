#!/usr/bin/env bash
# ptxas figures of fa3's kernels without a GPU: compiles the given keys (default: the CI set,
# bf16_bf16_128_128 and e4m3_e4m3_128_128) for sm_90a with -Xptxas -v and prints registers,
# spills, stack and PTX instruction counts per kernel. Usage:
#   scripts/fa3-ptxas.sh [--keep DIR] [source-root] [key ...]
# --keep DIR leaves each key's PTX as DIR/<key>.ptx and its cubin as DIR/<key>.cubin, so two
# checkouts can be compared exactly (diff of the PTX: the host/device template must not change the
# device code; cuobjdump -sass of the cubins: SASS instruction counts).
set -euo pipefail
keep=
if [[ ${1:-} == --keep ]]; then keep=$2; shift 2; mkdir -p "$keep"; fi
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
shift || true
keys=("$@")
[[ ${#keys[@]} -gt 0 ]] || keys=(bf16_bf16_128_128 e4m3_e4m3_128_128)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A tag=([bf16]=cuda::Bf16Tag [f16]=cuda::F16Tag [e4m3]=E4m3Tag [e5m2]=E5m2Tag
                [e4m3_e5m2]=E4m3E5m2Tag [e5m2_e4m3]=E5m2E4m3Tag)
for key in "${keys[@]}"; do
  IFS=_ read -r q kv qk vo <<< "$key"
  t=${tag[$q]}; [[ $q == "$kv" ]] || t=${tag[${q}_$kv]}
  src="$work/$key.cu"
  sed -e "s/@KVATTN_FA3_Q@/$q/g; s/@KVATTN_FA3_KV@/$kv/g; s/@KVATTN_FA3_QK@/$qk/g" \
      -e "s/@KVATTN_FA3_VO@/$vo/g; s/@KVATTN_FA3_TAG@/$t/g" \
      "$root/src/cuda/fa3/kernels/prefill_instance.cu.in" > "$src"
  /usr/local/cuda/bin/nvcc -I"$root/include" -I"$root/src" -O3 -DNDEBUG -std=c++20 \
    --expt-relaxed-constexpr -arch=compute_90a -ptx -o "$work/k.ptx" "$src"
  /usr/local/cuda/bin/ptxas -v -arch=sm_90a -o "$work/k.cubin" "$work/k.ptx" \
    2> "$work/ptxas.txt" || { cat "$work/ptxas.txt"; exit 1; }
  [[ -z $keep ]] || { cp "$work/k.ptx" "$keep/$key.ptx"; cp "$work/k.cubin" "$keep/$key.cubin"; }
  python3 - "$work/ptxas.txt" "$work/k.ptx" "$key" <<'PY'
import re, sys
log, text, label = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
counts, cur = {}, None
for line in text.splitlines():
    m = re.match(r"\.visible \.entry (\S+?)\(|\.entry (\S+?)\(", line)
    if m: cur = m.group(1) or m.group(2); counts[cur] = 0; continue
    s = line.strip()
    if cur and s and not s.startswith(('.', '//', '{', '}', '$', ')')) and s.endswith(';'):
        counts[cur] += 1
for m in re.finditer(r"Compiling entry function '(\S+)'.*?\n(.*?)Used (\d+) registers(.*?)\n", log, re.S):
    name, between, regs, rest = m.groups()
    kind = 'merge' if 'merge' in name else 'prefill'
    stack = re.search(r"(\d+) bytes stack frame", between)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", between)
    print(f"{label:20s} {kind:8s} regs {regs:>3s}  stack {stack.group(1) if stack else '?'}"
          f"  spill st/ld {spill.group(1) if spill else '?'}/{spill.group(2) if spill else '?'}"
          f"  ptx {counts.get(name, '?'):>6}")
PY
done
