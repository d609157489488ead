"""experiments/: every page is what pages.py writes from the committed results, byte for byte,
and every command a page shows names a script that is there."""
import itertools
import json
import re
from pathlib import Path

import pytest

from experiments import pages

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.mark.parametrize("name", pages.WRITTEN)
def test_each_page_is_written_from_the_committed_results(name):
    assert pages.render(name) == (EXPERIMENTS / name / "README.md").read_text()


@pytest.mark.parametrize("name", pages.WRITTEN)
def test_every_command_on_a_page_names_a_script_that_exists(name):
    text = (EXPERIMENTS / name / "README.md").read_text()
    scripts = re.findall(r"(?:python|bash) ((?:experiments|scripts)/\S+\.(?:py|sh))", text)
    assert scripts and all((EXPERIMENTS.parent / s).is_file() for s in scripts), scripts
    for figure in re.findall(r"\]\((results/\S+\.png)\)", text):
        assert (EXPERIMENTS / name / figure).is_file(), figure


def test_pages_read_numbers_as_floats_and_words_as_text(tmp_path):
    (tmp_path / "t.csv").write_text("name,value,flag\nbf16,1e-3,false\n")
    assert pages.read_csv(tmp_path / "t.csv") == [dict(name="bf16", value=1e-3, flag="false")]


def test_an_alignment_pair_stands_alone_and_names_the_cpu_that_trained_it(tmp_path):
    """run.sh PAIR rewrites only that pair's files: the page takes the pairs it finds, each with
    the bf16 kernels of its own cpu_<pair>.json."""
    for path in (EXPERIMENTS / "alignment" / "results").iterdir():
        if path.suffix in (".csv", ".json") and not path.name.startswith("cpu_"):
            (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "results_lr1.csv").unlink()
    pairs = ["base", "small", "batch16", "seq512", "long", "dense"]
    for pair in pairs:
        capability, flags = ("AVX2", ["avx2"]) if pair == "base" else (
            "AVX512", ["avx2", "avx512f", "avx512_bf16"])
        (tmp_path / f"cpu_{pair}.json").write_text(json.dumps(dict(
            model="a CPU", torch="2.13.0+cpu", capability=capability, flags=flags)))
    page = pages.alignment(tmp_path)
    assert list(page["r"]) == pairs
    assert page["table"].splitlines()[-1] == (
        "| the CPU that trained them (torch's kernels, bf16 flags) | AVX2 |"
        + " AVX512, avx512_bf16 |" * 5)


def test_mechanism_redraws_its_table_and_figures_from_the_committed_csvs(tmp_path):
    from experiments.mechanism import mechanism
    results = EXPERIMENTS / "mechanism" / "results"
    for name in ("runs.csv", "curves.csv", "bases.csv"):
        (tmp_path / name).write_bytes((results / name).read_bytes())
    mechanism.main(["--from_results", "--out", str(tmp_path)])
    assert (tmp_path / "table.md").read_text() == (results / "table.md").read_text()
    for figure in ("gap_vs_L.png", "logit_mean_steps.png"):
        assert (tmp_path / figure).stat().st_size > 10_000
    (tmp_path / "bases.csv").unlink()
    with pytest.raises(SystemExit, match="lacks bases.csv; run mechanism.py without --from_resu"):
        mechanism.main(["--from_results", "--out", str(tmp_path)])


def test_pages_refuses_a_page_it_does_not_write():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(EXPERIMENTS / "pages.py"), "frequency"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == ("pages.py: error: there is no page "
                                                    "'frequency'; name one of mechanism, "
                                                    "alignment, proxy.\n")


def test_the_proxy_page_reads_min_l_l0_minus_best_from_results_csv():
    """pages.proxy's min(L, L₀) − best per η against results.csv, read here with csv alone."""
    import csv
    results = EXPERIMENTS / "proxy" / "results"
    above = pages.proxy(results)["above"]
    rows = list(csv.DictReader(open(results / "results.csv", newline="")))
    for head, seed in itertools.product(("baseline", "mu_center"), ("0", "1")):
        runs = [r for r in rows if (r["head"], r["tie"], r["dtype"], r["seed"])
                == (head, "false", "bfloat16", seed)]
        losses = {r["lr"]: min(float(r["test_loss"]), float(r["init_loss"])) for r in runs}
        assert len(runs) == 5 and set(losses) == {"0.01", "0.03", "0.1", "0.3", "1.0"}
        assert {f"{float(lr):g}": loss - min(losses.values()) for lr, loss in losses.items()} \
            == pytest.approx(above[f"{head}|{seed}"], abs=1e-12)


def test_write_json_replaces_the_file_whole_and_cpu_record_names_the_kernels(tmp_path):
    path = tmp_path / "new" / "cpu.json"
    pages.write_json(path, pages.cpu_record())
    pages.write_json(path, dict(pages.cpu_record(), model="a CPU"))
    assert [p.name for p in path.parent.iterdir()] == ["cpu.json"]  # no .tmp left
    cpu = json.loads(path.read_text())
    assert cpu["model"] == "a CPU" and set(cpu) == {"model", "torch", "capability", "flags"}
    assert cpu["capability"] in pages.cpu_text(cpu)


def test_the_pages_exact_tests_count_every_sign_pattern_and_every_order():
    """signed_rank_p and rank_correlation's p against enumerating what each one counts."""
    import itertools
    import numpy as np
    d = np.array([0.3, -1.2, 0.05, 2.0, -0.7, 0.9, 1.4])
    ranks = np.abs(d).argsort().argsort() + 1
    centre = len(d) * (len(d) + 1) / 4
    sums = [ranks[np.array(signs) > 0].sum() for signs in itertools.product((-1, 1), repeat=len(d))]
    far = np.mean([abs(w - centre) >= abs(ranks[d > 0].sum() - centre) for w in sums])
    assert pages.signed_rank_p(d) == pytest.approx(far) and 0 < far < 1
    x, y = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0], [2.0, 7.0, 1.0, 8.0, 2.5, 8.5]
    rho, p = pages.rank_correlation(x, y)
    spearman = lambda order: np.corrcoef(np.argsort(np.argsort(x)), order)[0, 1]
    assert rho == pytest.approx(spearman(np.argsort(np.argsort(y))))
    orders = list(itertools.permutations(range(6)))
    assert p == pytest.approx(np.mean([abs(spearman(o)) >= abs(rho) - 1e-9 for o in orders]))


def test_a_printed_bound_still_bounds_its_value():
    """Upper rounds up and Lower down at the precision asked, so that "at most 0.0019" holds;
    a value that the format prints exactly is printed as it is."""
    assert f"{pages.Upper(0.001836):.4f}" == "0.0019" and f"{pages.Upper(213.27):.1f}" == "213.3"
    assert f"{pages.Lower(0.93478):.1%}" == "93.4%" and f"{pages.Upper(0.93478):.1%}" == "93.5%"
    assert f"{pages.Upper(0.25):.2f}" == "0.25" and f"{pages.Lower(-1.2221):.2f}" == "-1.23"
