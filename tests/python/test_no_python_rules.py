"""Python holds no support rule and no validation message of its own (DESIGN.md §5): the package
is grepped for refusals that belong to C++ — a problem parameter refused in Python, a C++ rule
repeated as Python text, a list of backend names — so that a second list drifting from the
declaration (the bug class kvattn exists to prevent) fails here first."""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Iterator, List, Tuple

import pytest

import kvattn
from kvattn import _kvattn

PACKAGE = pathlib.Path(kvattn.__file__).parent


def _sources() -> Iterator[Tuple[pathlib.Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _code_strings(tree: ast.Module) -> Iterator[ast.Constant]:
    """String constants that are code, not docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            yield node


def _refusals(tree: ast.Module) -> Iterator[Tuple[int, str, str]]:
    """(line, argument, text) of every `unsupported(argument, why)` call and every
    NotSupportedError(...) raised in Python."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", ""))
        if name == "unsupported" and node.args and isinstance(node.args[0], ast.Constant):
            yield node.lineno, str(node.args[0].value), ast.unparse(node)
        elif name == "NotSupportedError":
            yield node.lineno, "", ast.unparse(node)


def _problem_keys() -> List[str]:
    return [k for k in dir(_kvattn.Problem) if not k.startswith("_") and k != "fields"]


def _table_rules() -> List[str]:
    """What C++'s problem table says is accepted for each text parameter ("expected NHD or HND"):
    the part of its refusal after the value."""
    rules = []
    for key in _problem_keys():
        if not isinstance(getattr(_kvattn.Problem(), key), str):
            continue
        with pytest.raises(kvattn.InvalidArgumentError) as e:
            _kvattn.check_field(key, "no-such-value")
        rules.append(str(e.value).split("no-such-value: ", 1)[1])
    return rules


def test_python_refuses_no_problem_parameter():
    """A problem parameter's support is can_implement's: Python may refuse FlashInfer arguments
    that never reach C++ (profiler buffers, JIT arguments), never a parameter of the Problem."""
    keys = set(_problem_keys())
    assert {"pos_encoding_mode", "kv_layout", "q_data_type", "use_sinks"} <= keys
    found = [f"{path.name}:{line}: {text}" for path, tree in _sources()
             for line, argument, text in _refusals(tree) if argument in keys]
    assert not found, "Python refuses problem parameters (C++ decides):\n" + "\n".join(found)


def test_python_repeats_no_cpp_rule_text():
    """C++'s problem-table rules ("expected NHD or HND", ...) and its backend-name rule appear in
    no Python source: Python calls C++ (`_kvattn.check_field`, `_kvattn.check_backend`)."""
    rules = _table_rules()
    assert "expected NHD or HND" in rules
    with pytest.raises(kvattn.InvalidArgumentError) as e:
        _kvattn.check_backend("no-such-backend")
    rules.append(re.search(r"\(expected auto or one of:.*\)", str(e.value)).group(0))
    rules += ["not in this build", "per-head scales are not"]
    found = [f"{path.name}: {rule!r}" for path, _ in _sources() for rule in rules
             if rule in path.read_text()]
    assert not found, "C++ rules repeated in Python:\n" + "\n".join(found)


def test_python_lists_no_backend_names():
    """The backend names are C++'s (`backend_names()`): no Python code spells one as a string
    ("cpu" is also a device, which Python does name)."""
    names = set(_kvattn.backend_names()) - {"cpu"}
    assert "reference" in names
    found = [f"{path.name}:{node.lineno}: {node.value!r}" for path, tree in _sources()
             for node in _code_strings(tree) if node.value in names]
    assert not found, "backend names spelled in Python:\n" + "\n".join(found)
    assert kvattn.backend_names() == _kvattn.backend_names()


@pytest.mark.parametrize("call", [
    lambda: kvattn.BatchDecodeWithPagedKVCacheWrapper(None, "NDH"),
    lambda: kvattn.BatchDecodeWithPagedKVCacheWrapper(None, backend="fa4"),
])
def test_refusals_are_cpp_messages(call):
    """The early argument checks raise C++'s message (the problem table's, select_backend's)."""
    with pytest.raises(kvattn.InvalidArgumentError) as e:
        call()
    assert ("kv_layout = NDH: expected NHD or HND" in str(e.value)
            or "backend 'fa4' is unknown (expected auto or one of:" in str(e.value))
