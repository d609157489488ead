"""An experiment's page: README.md beside its results, its template README.in.md filled with
str.format from the numbers experiments/<name>/page.py reads out of the committed results, so
that the page cannot drift from them (tests/test_experiments.py writes every page and compares).

    python experiments/pages.py [NAME ...]     # default: every page; the last step of run.sh
"""
import csv
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WRITTEN = ("mechanism", "alignment", "proxy")  # geometry commits no results: its page is prose


def read_csv(path) -> list[dict]:
    """The rows of a CSV file, every cell that reads as a number a float."""
    def cell(text: str):
        try:
            return float(text)
        except ValueError:
            return text
    with open(path, newline="") as f:
        return [{key: cell(value) for key, value in row.items()} for row in csv.DictReader(f)]


def render(name: str) -> str:
    values = importlib.import_module(f"experiments.{name}.page").values(HERE / name / "results")
    return (HERE / name / "README.in.md").read_text().format(**values)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))  # the repository root, where `experiments` lives
    for name in sys.argv[1:] or WRITTEN:
        if name not in WRITTEN:
            raise SystemExit(f"pages.py: error: there is no page {name!r}; name one of "
                             f"{', '.join(WRITTEN)}.")
        (HERE / name / "README.md").write_text(render(name))
        print(f"wrote {HERE / name / 'README.md'}")
