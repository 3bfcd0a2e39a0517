"""The documents say what the code does: the model's moves in docs/architecture.md
are the table the code enforces, and every source path the docs name exists."""

from __future__ import annotations

import re
from pathlib import Path

from edgeplex.agent.residency.state import TRANSITIONS, Phase

ROOT = Path(__file__).resolve().parent.parent


def test_the_architectures_table_of_moves_is_the_codes() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| from | to |") :].split("\n\n", 1)[0]
    documented = {}
    for line in table.splitlines()[2:]:
        source, targets = (cell.strip() for cell in line.strip("|").split("|"))
        documented[source] = set() if targets == "(none)" else set(targets.split(", "))
    assert documented == {a.name: {b.name for b in TRANSITIONS[a]} for a in Phase}


def test_every_source_path_the_docs_name_exists() -> None:
    named = set()
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for path in re.findall(
            r"`((?:agent|control_plane|edgeplex|deploy|bench|scripts)/[\w/.]+\.(?:py|pyx|sh|yml|yaml|service))`",
            doc.read_text(),
        ):
            named.add((doc.name, path))
    missing = sorted((doc, path) for doc, path in named if not (ROOT / path).exists())
    assert missing == []
