#!/usr/bin/env bash
# ptxas figures of fa2's attention kernels (registers, spills, static/dynamic shared memory per
# tile, PTX instruction counts), without a GPU: compiles the CI kernel set for one arch with
# -Xptxas -v and counts the SASS of each kernel. Usage: scripts/fa2-ptxas.sh [arch] [source-root]
# (arch: 80 or 90a, default 80; source-root: a checkout, default this one). Prints one line per
# kernel (the toolkit here has no cuobjdump, so instructions are counted in the PTX). Used for
# issue 13's old-vs-new tile figures (docs/cuda.md).
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
    --expt-relaxed-constexpr -arch="compute_${arch}" -ptx -o "$work/k.ptx" "$src"
  /usr/local/cuda/bin/ptxas -v -arch="sm_${arch}" -o "$work/k.cubin" "$work/k.ptx" \
    2> "$work/ptxas.txt" || { cat "$work/ptxas.txt"; exit 1; }
  python3 - "$work/ptxas.txt" "$work/k.ptx" "$1/$2 d128" <<'PY'
import re, subprocess, sys
ptx, text, label = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
counts, cur = {}, None
for line in text.splitlines():
    m = re.match(r"\.visible \.entry (\S+?)\(|\.entry (\S+?)\(", line)
    if m: cur = m.group(1) or m.group(2); counts[cur] = 0; continue
    s = line.strip()
    if cur and s and not s.startswith(('.', '//', '{', '}', '$', ')')) and s.endswith(';'):
        counts[cur] += 1
for m in re.finditer(r"Compiling entry function '(\S+)'.*?\n(.*?)Used (\d+) registers(.*?)\n", ptx, re.S):
    name, between, regs, rest = m.groups()
    if 'attention' not in name: continue
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", between)
    smem = re.search(r"(\d+) bytes smem", rest)
    full = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    targs = re.sub(r"kvattn::(fa2::|cuda::)?", "", full[full.find("<") + 1:full.rfind(">")])
    print(f"{label:16s} regs {regs:>3s}  spill st/ld {spill.group(1) if spill else '?'}/{spill.group(2) if spill else '?'}"
          f"  static smem {smem.group(1) if smem else 0:>5}  ptx {counts.get(name, '?'):>6}  {targs}")
PY
done
