"""List the ``vllm:*`` family names and label names that differ between two vLLM source trees.

vLLM 0.33 has no CPU build to import beside 0.32, but its wheel unpacks without a GPU: this reads
both trees' Python files (no import) and finds every metric a file defines:

- a call with ``name="vllm:..."`` (prometheus_client's classes, vLLM's ``_gauge_cls(...)`` and the
  connectors' ``self._counter_cls(...)``), with its ``labelnames=`` expression;
- a string constant ``"vllm:..."`` (the name tables of the offloading, tiering and simple-offload
  metrics, whose labels live in metadata objects next to them).

Names are compared as written (a counter may be written with or without ``_total``).
Label expressions are compared as source text, after the ``labelnames``/``labelnames + [...]``
spellings vLLM uses; an expression this cannot reduce is printed as is.

Usage: python tests/vllm/families_diff.py OLD_VLLM_DIR NEW_VLLM_DIR   (the ``vllm`` package dirs)
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from pathlib import Path


@functools.cache
def definitions(root: Path) -> dict[str, dict[str, set[str]]]:
    """{name: {file relative to root: {label expressions}}} (empty set: a name constant only)."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        try:
            text = path.read_text(encoding="utf-8")
            if '"vllm:' not in text and "'vllm:" not in text:
                continue  # most files: no metric name, no parse
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value
                # "vllm::op" is a torch custom op's name (torch.ops.vllm), not a metric
                if (
                    value.startswith("vllm:")
                    and not value.startswith("vllm::")
                    and " " not in value
                    and len(value) > 5
                ):
                    out[value].setdefault(rel, set())
            if isinstance(node, ast.Call):
                kw = {k.arg: k.value for k in node.keywords if k.arg}
                name = kw.get("name")
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    continue
                if name.value.startswith("vllm:") and not name.value.startswith("vllm::"):
                    labels = kw.get("labelnames")
                    out[name.value][rel].add(ast.unparse(labels) if labels is not None else "(none)")
    return out


def diff(old_root: Path, new_root: Path) -> list[str]:
    """Lines describing every family added, removed or defined with other labels."""
    old, new = definitions(old_root), definitions(new_root)
    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"- {name}  (only in old: {', '.join(sorted(old[name]))})")
        elif name not in old:
            lines.append(f"+ {name}  (only in new: {', '.join(sorted(new[name]))})")
        else:
            old_labels = {expr for exprs in old[name].values() for expr in exprs}
            new_labels = {expr for exprs in new[name].values() for expr in exprs}
            if old_labels != new_labels:
                lines.append(f"~ {name}  labels {sorted(old_labels)} -> {sorted(new_labels)}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    old_root, new_root = Path(argv[1]), Path(argv[2])
    lines = diff(old_root, new_root)
    n_old, n_new = len(definitions(old_root)), len(definitions(new_root))
    print(f"vllm:* families defined: {n_old} in {old_root}, {n_new} in {new_root}; {len(lines)} differ")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
