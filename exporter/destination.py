"""The export's destination: what an interrupted export left beside it is recovered first.

`overwrite` moves the old artifact to `.NAME.old-PID`, moves the new one from `.NAME.partial-PID`
to NAME, then deletes the old one. A process killed between the two renames leaves the old
artifact at `.NAME.old-PID` and nothing at NAME; killed later, a half-deleted `.old` folder beside
a complete NAME; killed during the export, a `.partial` folder. Before the next export looks at
NAME, a stranded old artifact is put back at NAME and the leftovers of processes that no longer
run are deleted; each action is reported as a warning.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

from jacobi_rt.runtime.spec import MANIFEST_NAME


def recover_interrupted(out: Path) -> list[str]:
    """Restore a stranded `.NAME.old-PID` to NAME (when NAME is missing), delete other leftovers of
    dead processes; returns what was done, one line each."""
    notes = []
    for leftover in sorted(out.parent.glob(f".{glob.escape(out.name)}.*-*")):
        kind, _, pid = leftover.name[len(out.name) + 2 :].rpartition("-")
        if kind not in ("old", "partial") or not pid.isdigit() or not leftover.is_dir() or _running(int(pid)):
            continue
        if kind == "old" and not out.exists() and (leftover / MANIFEST_NAME).is_file():
            leftover.rename(out)
            notes.append(
                f"restored the artifact {out} from {leftover.name}, "
                f"where an overwrite interrupted in process {pid} left it"
            )
        else:
            shutil.rmtree(leftover, ignore_errors=True)
            notes.append(f"removed {leftover.parent / leftover.name}, left by an export interrupted in process {pid}")
    return notes


def _running(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # on Windows os.kill(pid, 0) would signal it: assume it runs
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True
