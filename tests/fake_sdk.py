"""A fake Poplar SDK folder for tests: ``make_sdk(root)`` writes
``root/poplar_sdk-ubuntu_20_04-<version>+1507-fake/enable``, a bash script that does what a real
enable script does to an environment (it refuses a second enable, prints a line, prepends the SDK's
``bin`` and ``lib`` to ``PATH`` and ``LD_LIBRARY_PATH``, sets ``POPLAR_SDK_ENABLED``), and puts the
fake poprt (``tests/fake_poprt``) on ``PYTHONPATH`` where a real SDK's Python packages would be.
``extra`` adds lines (more exports, an ``unset``, a failing command).
"""

from __future__ import annotations

import shlex
from pathlib import Path

FAKE_POPRT = Path(__file__).resolve().parent / "fake_poprt"

_ENABLE = """\
# Fake Poplar SDK enable script (sharderd tests). Source it: `source {script}`.
if [ -n "${{POPLAR_SDK_ENABLED:-}}" ]; then
    echo "ERROR: A Poplar SDK has already been enabled." >&2
    return 1
fi
sdk="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
echo "Enabled the fake Poplar SDK in $sdk"
export POPLAR_SDK_ENABLED="$sdk/poplar"
export PATH="$sdk/poplar/bin:$PATH"
export LD_LIBRARY_PATH="$sdk/poplar/lib:${{LD_LIBRARY_PATH}}"
export PYTHONPATH={poprt}${{PYTHONPATH:+:$PYTHONPATH}}
{extra}
"""


def make_sdk(root: Path, version: str = "3.4.0", extra: str = "") -> Path:
    """The enable script of a fake SDK ``version`` under ``root``."""
    folder = root / f"poplar_sdk-ubuntu_20_04-{version}+1507-fake"
    (folder / "poplar" / "lib").mkdir(parents=True)
    (folder / "poplar" / "bin").mkdir()
    script = folder / "enable"
    script.write_text(
        _ENABLE.format(script=script, poprt=shlex.quote(str(FAKE_POPRT)), extra=extra),
        encoding="utf-8",
    )
    return script
