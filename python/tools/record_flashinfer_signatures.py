"""Records the signatures of FlashInfer's public attention API from its wheel's sources.

Usage: python record_flashinfer_signatures.py FLASHINFER_SRC_DIR > signatures.json

Reads the sources with `ast` (FlashInfer is not imported: it needs CUDA); for each function and
each public method of the wrapper classes it writes the parameters in order with their kind and
default (as source text). tests/python/test_signatures.py compares kvattn's against this list.
Where a function has typing overloads, the implementation (the last definition) is taken.
"""

import ast
import json
import sys
from pathlib import Path

FUNCTIONS = {
    "decode.py": ["single_decode_with_kv_cache", "fast_decode_plan"],
    "prefill.py": ["single_prefill_with_kv_cache"],
    "cascade.py": ["merge_state", "merge_state_in_place", "merge_states"],
    "page.py": ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens",
                "append_paged_mla_kv_cache"],
    "rope.py": ["apply_rope", "apply_rope_inplace", "apply_rope_pos_ids",
                "apply_rope_pos_ids_inplace", "apply_llama31_rope", "apply_llama31_rope_inplace",
                "apply_llama31_rope_pos_ids", "apply_llama31_rope_pos_ids_inplace",
                "apply_rope_with_cos_sin_cache", "apply_rope_with_cos_sin_cache_inplace",
                "rope_quantize_fp8", "rope_quantize_fp8_append_paged_kv_cache",
                "mla_rope_quantize_fp8"],
    "quantization/packbits.py": ["packbits", "segment_packbits"],
}
CLASSES = {
    "decode.py": ["BatchDecodeWithPagedKVCacheWrapper"],
    "prefill.py": ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"],
    "cascade.py": ["MultiLevelCascadeAttentionWrapper",
                   "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
                   "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"],
    "mla/_batch_mla/_wrapper.py": ["BatchMLAPagedAttentionWrapper"],
    "attention/_core.py": ["BatchAttention", "BatchAttentionWithAttentionSinkWrapper"],
    "pod.py": ["PODWithPagedKVCacheWrapper", "BatchPODWithPagedKVCacheWrapper"],
}
# The modules of FlashInfer's attention API: every public name flashinfer/__init__.py imports
# from them is listed under "attention_names" (kvattn provides each: working, or raising
# NotSupportedError on call).
ATTENTION_MODULES = {"attention", "cascade", "decode", "prefill", "page", "rope", "mla", "pod",
                     "sparse", "xqa"}
METHODS = ["__init__", "plan", "_plan_impl", "run", "forward", "run_return_lse", "begin_forward",
           "forward_return_lse", "end_forward", "reset_workspace_buffer"]


def params(fn: ast.FunctionDef):
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, d in zip(positional, defaults):
        out.append({"name": arg.arg, "kind": "POSITIONAL_OR_KEYWORD",
                    "default": None if d is None else ast.unparse(d)})
    if a.vararg:
        out.append({"name": a.vararg.arg, "kind": "VAR_POSITIONAL", "default": None})
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append({"name": arg.arg, "kind": "KEYWORD_ONLY",
                    "default": None if d is None else ast.unparse(d)})
    if a.kwarg:
        out.append({"name": a.kwarg.arg, "kind": "VAR_KEYWORD", "default": None})
    return out


def last_def(body, name):
    found = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            found = node
    return found


def main(root: Path):
    result = {"flashinfer_version": None, "functions": {}, "classes": {}}
    meta = root / "_build_meta.py"
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("__version__"):
                result["flashinfer_version"] = line.split("=")[1].strip().strip("\"'")
    for file, names in FUNCTIONS.items():
        tree = ast.parse((root / file).read_text())
        for name in names:
            node = last_def(tree.body, name)
            if node is None:
                raise SystemExit(f"{file}: no {name}")
            result["functions"][name] = params(node)
    for file, names in CLASSES.items():
        tree = ast.parse((root / file).read_text())
        for name in names:
            cls = last_def(tree.body, name)
            methods = {}
            for m in METHODS:
                node = last_def(cls.body, m)
                if node is not None:
                    methods[m] = params(node)
                else:
                    # aliases assigned in the class body: `forward = run`, or
                    # `run_return_lse = functools.partialmethod(run, return_lse=True)`
                    for stmt in cls.body:
                        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                                and isinstance(stmt.targets[0], ast.Name)
                                and stmt.targets[0].id == m):
                            continue
                        v = stmt.value
                        if isinstance(v, ast.Name):
                            methods[m] = {"alias_of": v.id}
                        elif isinstance(v, ast.Call) and ast.unparse(v.func).endswith(
                                "partialmethod"):
                            methods[m] = {"partialmethod_of": ast.unparse(v.args[0]),
                                          "keywords": {k.arg: ast.unparse(k.value)
                                                       for k in v.keywords}}
            result["classes"][name] = methods
    names = {}
    for node in ast.parse((root / "__init__.py").read_text()).body:
        if (isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
                and node.module.split(".")[0] in ATTENTION_MODULES):
            for alias in node.names:
                names[alias.asname or alias.name] = node.module
    result["attention_names"] = dict(sorted(names.items()))
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
