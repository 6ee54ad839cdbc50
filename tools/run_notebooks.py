"""Execute the tutorial notebooks in place, so their stored outputs are current.

The test suite checks the notebooks with nbval, which compares each cell's
output with the output stored in the notebook; after changing a notebook or
the code it shows, run this to store fresh outputs:

    python tools/run_notebooks.py [notebooks/01-quick-start.ipynb ...]

Cells run in a kernel started in notebooks/, exactly as nbval runs them.

The model's exact words differ between machines, llama.cpp builds and thread
counts, so nbval must never compare them: a cell whose output shows the
model's text (or counts that depend on it) carries the cell tag
``nbval-ignore-output`` and is followed by a compared cell that shows what
holds anywhere (statuses, counts within their bounds, token counts of the
prompts). tests/test_notebooks.py checks that pairing and runs nbval again
under another thread count (``TENSORJOB_THREADS``).
Output that nbval cannot see (native writes to the process's stderr, which
ipykernel does not capture under pytest) would make the comparison fail, so
every stderr stream is listed: check that each one is meant (a compile
error shown on purpose) and comes from Python, not from native code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def run(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    stderr = [(i, o.get("text", "")) for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
              for o in cell.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    for index, text in stderr:
        print(f"{path.name} cell {index} wrote to stderr (check it is meant):\n{text}", file=sys.stderr)
    nbformat.write(notebook, path)
    print(f"{path.relative_to(ROOT)}: executed and saved")


def main(argv: list[str]) -> None:
    paths = [Path(p).resolve() for p in argv] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        run(path)


if __name__ == "__main__":
    main(sys.argv[1:])
