"""An experiment's page: README.md beside its results, its template README.in.md filled with
str.format from the numbers its page.py reads out of the committed results, so that the page
cannot drift from them (tests/test_experiments.py writes every page again and compares).

    python experiments/<name>/page.py       # the last step of experiments/<name>/run.sh
"""
import csv
from pathlib import Path


def read_csv(path) -> list[dict]:
    """The rows of a CSV file, every cell that reads as a number a float."""
    def cell(text: str):
        try:
            return float(text)
        except ValueError:
            return text
    with open(path, newline="") as f:
        return [{key: cell(value) for key, value in row.items()} for row in csv.DictReader(f)]


def render(folder: Path, values: dict) -> str:
    return (folder / "README.in.md").read_text().format(**values)


def write(folder: Path, values: dict) -> None:
    (folder / "README.md").write_text(render(folder, values))
    print(f"wrote {folder / 'README.md'}")
