"""What nested ``If`` costs: onnxruntime's symbolic shape inference by depth, and sharderd's answer.

``tests/pathological.py``'s ``nested_if(depth)`` (``If`` nested ``depth`` deep under one constant
condition, one-node branches) is timed in ``SymbolicShapeInference.infer_shapes`` alone (in this
process, imports excluded, best of ``--repeat``), up to ``--max-depth`` (each level doubles it);
then ``sharderd plan --devices 1`` runs in a fresh process on the deepest model accepted
(``MAX_SUBGRAPH_DEPTH``), one level deeper and 20 deep (the issue's model): exit code, wall, CPU,
peak RSS.

    python bench/nesting.py                 # depths 2..12
    python bench/nesting.py --max-depth 14
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from _common import machine, machine_markdown, markdown_table, run_measured, sharderd_exe  # noqa: E402
from pathological import nested_if  # noqa: E402

from sharderd.graph.nesting import MAX_SUBGRAPH_DEPTH  # noqa: E402


def inference_s(model: onnx.ModelProto, repeat: int) -> tuple[float, float]:
    """Best wall and best CPU seconds of ``repeat`` runs (CPU is the steadier on a shared VM)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    wall = cpu = float("inf")
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        SymbolicShapeInference.infer_shapes(model)
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - started_cpu)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-depth", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(machine_markdown(machine()))
    inference_s(nested_if(1), 1)  # imports and first-call set-up out of the figures
    rows = []
    for depth in range(2, args.max_depth + 1, 2):
        model = nested_if(depth)
        wall, cpu = inference_s(model, args.repeat)
        rows.append((depth, len(model.SerializeToString()), f"{wall:.3f}", f"{cpu:.3f}"))
    header = ("depth", "file bytes", "inference wall s (best)", "inference CPU s (best)")
    print(markdown_table(header, rows))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for depth in (MAX_SUBGRAPH_DEPTH, MAX_SUBGRAPH_DEPTH + 1, 20):
            path = Path(tmp) / f"nested{depth}.onnx"
            onnx.save(nested_if(depth), path)
            run = run_measured([sharderd_exe(), "plan", str(path), "--devices", "1"])
            runs.append(
                (
                    depth,
                    run.exit_code,
                    f"{run.wall_s:.2f}",
                    f"{run.user_s + run.sys_s:.2f}",
                    f"{run.peak_rss_bytes / 2**20:.0f}",
                )
            )
    print()
    print(
        markdown_table(("depth", "`sharderd plan` exit", "wall s", "CPU s", "peak RSS MiB"), runs)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
