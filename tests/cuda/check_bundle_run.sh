#!/usr/bin/env bash
# The GPU bundle's run.sh on a machine without a CUDA device: it must exit non-zero, say
# "no CUDA device" (the summary and stdout) and not crash; and, behind a probe that claims a
# device, count the GPU tests' skips as failures. Exit 77 (ctest: skipped) where a
# device is present, since run.sh would then run the whole GPU check.
#
#   tests/cuda/check_bundle_run.sh RUN_SH BUNDLE_BINARY
set -uo pipefail
run_sh=$1 bin=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if "$bin" device >/dev/null 2>&1; then
  echo "a CUDA device is present: run.sh would run the GPU check; not run here"
  exit 77
fi
mkdir -p "$tmp/bundle/bin"
cp "$run_sh" "$tmp/bundle/run.sh"
ln -s "$bin" "$tmp/bundle/bin/kvattn_gpu_bundle"
"$tmp/bundle/run.sh" "$tmp/out" >"$tmp/stdout" 2>&1
rc=$?
cat "$tmp/stdout"
fail=0
if [[ $rc -eq 0 ]]; then echo "FAIL: run.sh exited 0 without a CUDA device"; fail=1; fi
if [[ $rc -ge 128 ]]; then echo "FAIL: run.sh died of a signal (exit $rc)"; fail=1; fi
grep -q "no CUDA device" "$tmp/stdout" || { echo "FAIL: stdout does not say 'no CUDA device'"; fail=1; }
grep -q "no CUDA device" "$tmp/out/summary.txt" 2>/dev/null ||
  { echo "FAIL: OUT/summary.txt does not say 'no CUDA device'"; fail=1; }
n=$(find "$tmp/out" -type f | wc -l)
if [[ $n -gt 8 ]]; then echo "FAIL: run.sh wrote $n files (at most 8)"; fail=1; fi
[[ $fail -eq 0 ]] && echo "ok: run.sh exit $rc, says no CUDA device, $n file(s) written"

# The same bundle behind a probe that claims an SM90 device: the GPU tests then run and skip
# (there is none), and run.sh must count every skip as a failure, the benchmarks' too (the host
# replays are cut off after 1 s: their verdict is not what is checked here).
mkdir -p "$tmp/fake/bin"
cp "$run_sh" "$tmp/fake/run.sh"
cat >"$tmp/fake/bin/kvattn_gpu_bundle" <<EOS
#!/usr/bin/env bash
if [[ "\$1" == device ]]; then
  "$bin" device | grep -v '^no CUDA device'
  echo "device cuda:0 (claimed by the test) sm90 0 GiB"
  echo "sm 90"
  exit 0
fi
exec "$bin" "\$@"
EOS
chmod +x "$tmp/fake/bin/kvattn_gpu_bundle"
LIMIT_HOST=1 "$tmp/fake/run.sh" "$tmp/fake-out" >"$tmp/fake-stdout" 2>&1
rc=$?
cat "$tmp/fake-stdout"
if [[ $rc -eq 0 ]]; then echo "FAIL: run.sh passed with every GPU test skipped"; fail=1; fi
for step in fa2-gpu-tests fa3-gpu-tests; do
  grep -q "$step: FAILED - .* SKIPPED" "$tmp/fake-out/summary.txt" ||
    { echo "FAIL: $step's skips were not reported as a failure"; fail=1; }
done
grep -q "fa2-bench: FAILED" "$tmp/fake-out/summary.txt" ||
  { echo "FAIL: a skipped benchmark was not a failure"; fail=1; }
n=$(find "$tmp/fake-out" -type f | wc -l)
if [[ $n -gt 8 ]]; then echo "FAIL: run.sh wrote $n files (at most 8)"; fail=1; fi
[[ $fail -eq 0 ]] && echo "ok: with a claimed device, skipped GPU tests and benchmarks fail the run ($n files)"
exit $fail
