"""The README's first command: the demo runs end to end on its own control plane and shows at
least three placements that counting GPUs gets wrong and gpusched gets right."""

from __future__ import annotations

import re
import subprocess

from devcluster.controlplane import PYTHON, REPO, python_component_env


def test_demo_prints_the_side_by_side_table_and_exits_zero():
    proc = subprocess.run([PYTHON, "-m", "devcluster.demo"], cwd=REPO, capture_output=True, text=True,
                          env=python_component_env(), timeout=300)
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = proc.stdout
    assert "COUNT-ONLY" in out and "GPUSCHED" in out
    counts = re.search(r"would fail at load time: count-only (\d+), gpusched (\d+)", out)
    assert counts, out
    assert int(counts.group(1)) >= 3 and int(counts.group(2)) == 0, out
    for reason in ("NVLink island", "MIG instances cannot form", "must be divisible by tensor parallel size (3)"):
        assert reason in out, f"missing {reason!r}:\n{out}"
