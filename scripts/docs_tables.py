"""Regenerate the generated tables of docs/trainer.md (config fields and metrics).

    python scripts/docs_tables.py          # rewrite them in place
    python scripts/docs_tables.py --check  # exit 1 if the page is out of date

The tables come from the one place each fact is declared: the config dataclasses' field
descriptions and `grpo_trainer.base.metrics.METRICS`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpo_trainer.base import metrics
from grpo_trainer.base.config import GRPOConfig, RunConfig, markdown_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "trainer.md"
TABLES = {
    "GRPOConfig": lambda: markdown_table(GRPOConfig),
    "RunConfig": lambda: markdown_table(RunConfig),
    "metrics": metrics.markdown_table,
}


def render(text: str) -> str:
    """`text` with every `<!-- generated: NAME -->` ... `<!-- end -->` block regenerated."""
    for name, table in TABLES.items():
        pattern = rf"(<!-- generated: {name} -->\n).*?(<!-- end -->)"
        text = re.sub(
            pattern, lambda m, t=table: m.group(1) + t() + "\n" + m.group(2), text, flags=re.DOTALL
        )
    return text


def main() -> int:
    text = PAGE.read_text()
    new = render(text)
    if "--check" in sys.argv:
        return int(new != text)
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
