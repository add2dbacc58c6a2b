#!/usr/bin/env bash
# ptxas figures of fa2's attention kernels (registers, spills, static/dynamic shared memory per
# tile, SASS instruction counts), without a GPU: compiles the CI kernel set for one arch with
# -Xptxas -v and counts the SASS of each kernel. Usage: scripts/fa2-ptxas.sh [arch] [source-root]
# (arch: 80 or 90a, default 80; source-root: a checkout, default this one). Prints one line per
# kernel. Used for issue 13's old-vs-new tile figures (docs/cuda.md).
set -euo pipefail
arch=${1:-80}
root=$(cd "${2:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gen="$work/generated"
mkdir -p "$gen"
for combo in "bf16 bf16" "bf16 e4m3"; do
  set -- $combo
  src="$work/attention_$1_$2_128_128.cu"
  # The instance template's placeholders, filled as kernel_set.cmake fills them.
  sed -e "s/@KVATTN_FA2_Q@/$1/g; s/@KVATTN_FA2_KV@/$2/g; s/@KVATTN_FA2_QK@/128/g" \
      -e "s/@KVATTN_FA2_VO@/128/g" "$root/src/cuda/fa2/kernels/attention_instance.cu.in" > "$src"
  /usr/local/cuda/bin/nvcc -I"$root/include" -I"$root/src" -I"$gen" -O3 -DNDEBUG -std=c++20 \
    --expt-relaxed-constexpr -gencode "arch=compute_${arch},code=sm_${arch}" -Xptxas -v \
    -cubin -o "$work/k.cubin" "$src" 2> "$work/ptxas.txt" || { cat "$work/ptxas.txt"; exit 1; }
  /usr/local/cuda/bin/cuobjdump -sass "$work/k.cubin" > "$work/sass.txt"
  python3 - "$work/ptxas.txt" "$work/sass.txt" "$1/$2 d128" <<'PY'
import re, sys
ptx, sass, label = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
counts, cur = {}, None
for line in sass.splitlines():
    m = re.match(r"\s*Function : (\S+)", line)
    if m: cur = m.group(1); counts[cur] = 0; continue
    if cur and re.match(r"\s*/\*[0-9a-f]{4}\*/\s+\S", line): counts[cur] += 1
for m in re.finditer(r"Compiling entry function '(\S+)'.*?\n(.*?)Used (\d+) registers(.*?)\n", ptx, re.S):
    name, between, regs, rest = m.groups()
    if 'attention' not in name: continue
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", between)
    smem = re.search(r"(\d+) bytes smem", rest)
    print(f"{label:16s} regs {regs:>3s}  spill st/ld {spill.group(1) if spill else '?'}/{spill.group(2) if spill else '?'}"
          f"  static smem {smem.group(1) if smem else 0:>5}  sass {counts.get(name, '?'):>6}  {name[:90]}")
PY
done
