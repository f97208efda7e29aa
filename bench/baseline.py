"""Another commit's files beside this checkout, for benches that time the two
in turns (bench/kernels.py, bench/coldstart.py --baseline REF)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def baseline_tree(ref: str) -> Path:
    """REF's files (git archive), extracted once into the temp directory and
    kept, with its numba cache, for later runs. Exit 2 with one line if REF
    is no commit of this repository."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=REPO,
                         capture_output=True, text=True)
    if sha.returncode != 0:
        print(f"--baseline {ref}: not a commit of {REPO}; give a commit, a branch or a tag",
              file=sys.stderr)
        sys.exit(2)
    tree = Path(tempfile.gettempdir()) / f"iasgd-baseline-{sha.stdout.strip()[:12]}"
    if not tree.is_dir():  # extracted beside it, then renamed: never half a tree
        part = Path(tempfile.mkdtemp(prefix=tree.name + "-", dir=tree.parent))
        archive = subprocess.run(["git", "archive", sha.stdout.strip()], cwd=REPO,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(part)], input=archive, check=True)
        part.rename(tree)
    return tree
