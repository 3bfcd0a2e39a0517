"""Rewrite the generated reference at the end of docs/configuration.md.

Usage: python scripts/gen_config_docs.py
Everything after the MARKER line is replaced by the agent's and the control plane's
reference_tables().
"""

from pathlib import Path

from edgeplex.agent.config import reference_tables
from edgeplex.control_plane.config import reference_tables as control_plane_tables

MARKER = "<!-- generated reference below: scripts/gen_config_docs.py -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

text = DOC.read_text()
head = text.split(MARKER)[0] if MARKER in text else text.split("### AgentSettings")[0]
DOC.write_text(
    head.rstrip() + "\n\n" + MARKER + "\n\n" + reference_tables() + "\n" + control_plane_tables()
)
