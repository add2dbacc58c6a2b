"""Runs the Python snippet of docs/case-files.md, then replays the case it writes with
`kvattn run --case ... --check`, so that the documented format and the reader cannot drift."""
import os
import re
import subprocess
import sys
import tempfile

doc_path, kvattn = sys.argv[1], sys.argv[2]
snippets = re.findall(r"```python\n(.*?)```", open(doc_path).read(), re.S)
assert len(snippets) == 1, f"expected one python snippet in {doc_path}, found {len(snippets)}"
with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    exec(compile(snippets[0], doc_path, "exec"), {})
    cases = [f for f in os.listdir(tmp) if f.endswith(".safetensors")]
    assert cases, "the snippet wrote no .safetensors file"
    for case in cases:
        result = subprocess.run([kvattn, "run", "--backend", "reference", "--repeat", "1",
                                 "--check", "--case", case], capture_output=True, text=True)
        print(result.stdout + result.stderr)
        if result.returncode != 0 or "check: PASS" not in result.stdout:
            sys.exit(f"kvattn run --case {case} failed with exit code {result.returncode}")
