"""README.md's install and Quickstart commands, run as written (train.py with fewer steps), and
the console lines, the refusal and the download sizes it quotes checked against what the code
does, so the front page cannot drift from the code. Also: the GPT-2 vocabulary loads offline."""
import csv
import hashlib
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import data
import prepare
import train

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
NUMBER = r"\d[\d.,]*(?:e[+-]\d+)?"


def section(title: str) -> str:
    """The text of README's `## title` section."""
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[list[str]]:
    """The block's command lines, split as a shell would, comments dropped."""
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def flat(text: str) -> str:
    """Text with its line breaks and runs of spaces made single spaces (README wraps lines)."""
    return " ".join(text.split())


def shape(line: str) -> re.Pattern:
    """A console line with every number free and every run of spaces any run of spaces."""
    parts = [re.escape(part) for part in re.split(NUMBER, line)]
    return re.compile(re.sub(r"(\\ )+", r"\\s+", NUMBER.join(parts)))


def run(argv, cwd, check=True):
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 or not check, f"{shlex.join(map(str, argv))}: {done.stderr}"
    return done


QUICKSTART = code_blocks(section("Quickstart"))
CPU_TORCH = ("pip", "install", "torch", "--index-url", "https://download.pytorch.org/whl/cpu")


def test_the_install_commands_work_as_written(tmp_path):
    venv, = (line for line in QUICKSTART[0].splitlines() if line.startswith("python3 -m venv"))
    run(["bash", "-c", f"set -e; {venv}; test \"$VIRTUAL_ENV\" = {tmp_path}/.venv"], tmp_path)
    tests_block = code_blocks(section("Tests"))[0]
    pips = list(dict.fromkeys(tuple(c) for c in commands(QUICKSTART[0]) + commands(tests_block)
                              if c[0] == "pip"))
    assert pips == [CPU_TORCH, ("pip", "install", "-r", "requirements.txt")]
    for pip in pips:  # offline: it must find everything installed, or fail instead of fetching
        run([sys.executable, "-m", "pip", *pip[1:], "--no-index", "--quiet"], ROOT)


def test_the_quickstart_runs_as_written_and_says_what_the_readme_shows(tmp_path):
    (tmp_path / "tests").symlink_to(ROOT / "tests")  # the README's paths, run from a clean folder
    train_line, = (c for c in commands(QUICKSTART[0]) if c[:2] == ["python", "train.py"])
    argv = train_line[2:] + ["--stat_tokens", "256"]  # cut down: the float64 statistics are slow
    argv[argv.index("--steps") + 1] = "3"
    first = run([sys.executable, ROOT / "train.py", *argv], tmp_path)
    lines = first.stdout.splitlines()
    for shown in QUICKSTART[1].splitlines():
        assert any(shape(shown).fullmatch(line) for line in lines), (shown, first.stdout)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == \
        ["ckpt.pt", "config.json", "log.jsonl", "summary.json"]

    sample_line, analyze_line = commands(QUICKSTART[2])
    samples = run([sys.executable, ROOT / sample_line[1], *sample_line[2:]], tmp_path).stdout
    assert samples.count("--- sample") == 3 and samples.count("\nSatan") == 3
    logits = run([sys.executable, ROOT / analyze_line[1], *analyze_line[2:]], tmp_path).stdout
    assert "logit_mean" in logits and "prec_err_round" in logits

    again = run([sys.executable, ROOT / "train.py", *argv], tmp_path, check=False)
    refusal = re.search(r"stops at once: `(.*?)`\.", flat(section("Quickstart"))).group(1)
    assert again.returncode == 1 and refusal in flat(again.stderr)


def test_the_download_sizes_beside_the_4_gpu_command_are_the_codes():
    text = flat(section("Quickstart"))
    paper = train.parse_args([])  # the defaults: the paper's recipe
    shards = prepare.shards_needed(paper.steps * paper.batch_size * paper.seq_len)
    gigabytes = (shards + 1) * (data.SHARD_TOKENS * 2 + 1024) / 1e9  # with the val shard
    assert f"downloads the {shards} FineWeb100B shards of 100M tokens that its 100,000 steps" \
        in text and data.SHARD_TOKENS == 100_000_000 and f"({gigabytes:.1f} GB," in text
    small = prepare.shards_needed(6000 * paper.batch_size * paper.seq_len)
    assert f"`--steps 6000` (0.79B tokens) downloads the {small} shards those steps read, " \
        f"{(small + 1) * 0.2:.1f} GB with the val shard" in text


OFFLINE = """
import os, sys
import tiktoken.load
def download(url):
    if sys.argv[2] == "offline":
        raise ConnectionError("no network")
    return open(os.path.join("tests/assets/gpt2", url.rsplit("/", 1)[1]), "rb").read()
tiktoken.load.read_file = download
import prepare
prepare.GPT2_CACHE = prepare.Path(sys.argv[1])
print(prepare.gpt2_encoding().encode_ordinary("Hello world"))
print(os.environ["TIKTOKEN_CACHE_DIR"])
"""


def load_gpt2(cache, tiktoken_cache, network):
    """prepare.gpt2_encoding() in a fresh process whose tiktoken downloads fail or succeed."""
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tiktoken_cache)}
    done = subprocess.run([sys.executable, "-c", OFFLINE, cache, network], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_offline_the_shipped_gpt2_vocabulary_is_used_and_said_once(tmp_path):
    cache = tmp_path / "cache"
    assert load_gpt2(cache, tmp_path / "empty", "offline") == [
        f"using the GPT-2 vocabulary shipped in tests/assets/gpt2 (cached in {cache})",
        "[15496, 995]", str(cache)]
    for name in prepare.GPT2_FILES:
        cached = hashlib.sha1((prepare.GPT2_VOCAB_URL + name).encode()).hexdigest()
        assert (cache / cached).read_bytes() == \
            (ROOT / "tests" / "assets" / "gpt2" / name).read_bytes()


def test_online_nothing_changes(tmp_path):
    cache, downloads = tmp_path / "cache", tmp_path / "downloads"
    assert load_gpt2(cache, downloads, "online") == ["[15496, 995]", str(downloads)]
    assert not cache.exists() and len(list(downloads.iterdir())) == 2


def rows(path: str) -> list[dict]:
    with open(ROOT / path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_numbers_the_front_page_quotes_are_the_committed_results():
    text = flat(section("What the experiments found"))
    gap, other = (next(r for r in rows(f"experiments/mechanism/results/{folder}gaps.csv")
                       if (r["condition"], r["shift"]) == ("bf16", "along1000"))
                  for folder in ("", "other_cpu/"))  # this CPU's bf16 gaps at L = 1000, another's
    assert (f"has lost +{float(gap['gap_min']):.2f} to +{float(gap['gap_max']):.2f} nats"
            in text and "over three base runs × three data orders" in text and gap["runs"] == "9")
    assert f"lost +{float(other['gap_min']):.2f} to +{float(other['gap_max']):.2f} nats" in text
    at_3000 = [r for r in rows("experiments/mechanism/results/runs.csv")
               if (r["condition"], r["shift"]) == ("bf16", "along3000")]
    blown = [r for r in at_3000 if float(r["val_loss_end"]) > float(r["val_loss_start"]) * 10]
    assert len(blown) == 7 and len(at_3000) == 9 and "seven of nine runs blow up" in text
    assert f"(validation loss ≥ {min(float(r['val_loss_end']) for r in blown):.0f})" in text
    proj = [float(r["h_mu_proj"]) for path in (ROOT / "experiments/alignment/results").glob(
        "results_*.csv") for r in rows(path) if r["head"] == "baseline"]
    assert len(proj) == 7
    low, high = math.floor(min(proj) * 1e4) / 1e4, math.ceil(max(proj) * 1e4) / 1e4  # outward
    assert f"h̄·μ̂ (train.py's final statistics) ends between {low:.4f} and {high:.4f}".replace(
        "-", "−") in text
    frozen = [r for r in rows("experiments/alignment/results/frozen_gain.csv")
              if r["gain"] == "frozen"]
    assert "h̄·μ̂ reached {} and {} (two seeds), yet l̄ ended at only {} and {}, as ‖μ‖ stayed " \
        "at {} and {}".format(*(f"{float(r['h_mu_proj']):.2f}" for r in frozen),
                              *(f"{float(r['logit_mean']):.1f}" for r in frozen),
                              *(f"{float(r['mu_norm']):.1f}" for r in frozen)).replace("-", "−") \
        in text
    paper = [(float(r["lr"]), float(r["logit_mean"]) / float(r["mu_norm"]))
             for r in rows("tests/data/oec_untied_runs.csv") if r["head"] == "baseline"]
    at_03 = sorted(proj for lr, proj in paper if lr == 0.3)
    assert f"at least 0.5 in {sum(abs(proj) >= 0.5 for _, proj in paper)} of the {len(paper)} " \
        f"untied baselines, and {math.floor(at_03[0] * 100) / 100:.2f} to " \
        f"{math.ceil(at_03[-1] * 100) / 100:.2f} at η = 0.3" in text


def test_the_mechanism_statistics_the_front_page_quotes_are_the_pages():
    """README's cure tests and rank correlations, as pages.py computes them for the page from the
    committed CSVs (test_experiments checks those statistics against brute force)."""
    from experiments import pages
    text = flat(section("What the experiments found")).replace("−", "-")
    here = pages.mechanism(ROOT / "experiments/mechanism/results")
    both = (here, here["other"])
    rho = [here["rho"][shift][0] for shift in here["rho"]]
    assert f"Spearman's ρ {min(rho):.2f} to {max(rho):.2f} over the nine runs" in text
    tests = [page["test"][cure] for page in both for cure in ("bf16_f32_head", "bf16_mu_center")]
    floor = lambda key: math.floor(min(t[key] for t in tests) * 10) / 10
    assert f"no cost (p ≥ {floor('p_cost'):.1f}) and no larger size than float32's " \
        f"(p ≥ {floor('p_size'):.1f})" in text
    spans = {key: (min(page[key][0] for page in both), max(page[key][1] for page in both))
             for key in ("cures", "noise")}
    assert "their range is wider ({:+.2f} to {:+.2f} nats, against float32's {:+.2f} to {:+.2f})"\
        .format(*spans["cures"], *spans["noise"]) in text
