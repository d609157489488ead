"""sample.py: continuations drawn from the head's own logits (soft-capped for soft_cap), only
from GPT-2's real tokens, reproducible by seed; bad input ends in one sentence."""
import pytest
import torch

import model
import sample


def write_run(folder, **config):
    """A run folder holding a fresh tiny model's ckpt.pt, as train.py would leave it."""
    config = {"size": "tiny", "head": "baseline", "vocab_size": 50304, "seq_len": 32,
              "steps": 10, **config}
    torch.manual_seed(0)
    gpt = model.from_config(config)
    folder.mkdir()
    torch.save({"model": gpt.state_dict(), "step": 10, "config": config}, folder / "ckpt.pt")
    return folder


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "soft_cap", head="soft_cap", cap=2.0)


def test_probabilities_are_the_softmax_over_t_of_the_k_largest_logits():
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.5, 0.0], [3.0, -2.0, 1.0, 0.5, 2.5]])
    probs = sample.next_token_probs(logits, temperature=0.5, top_k=3)
    top = logits.topk(3, dim=-1).indices
    expected = torch.zeros_like(logits).scatter(1, top, torch.softmax(
        logits.gather(1, top) / 0.5, dim=-1))
    assert torch.allclose(probs, expected)
    assert (probs > 0).sum(dim=-1).tolist() == [3, 3]
    greedy = sample.next_token_probs(logits, temperature=0, top_k=0)
    assert greedy.tolist() == [[0, 1, 0, 0, 0], [1, 0, 0, 0, 0]]


def test_draws_come_from_the_heads_soft_capped_logits_over_gpt2s_tokens(capped_run,
                                                                         monkeypatch):
    seen = []

    def spy(logits, temperature, top_k):
        seen.append(logits)
        return original(logits, temperature, top_k)
    original = sample.next_token_probs
    monkeypatch.setattr(sample, "next_token_probs", spy)
    samples = sample.main(["--run", str(capped_run), "--prompt", "Satan", "--num_samples", "2",
                           "--max_new_tokens", "3"])
    gpt, _, _ = model.load_model(capped_run / "ckpt.pt", "cpu")
    prompt = sample.text_codec(50304)[0]("Satan")
    assert prompt[0] == 50256 and len(prompt) > 1             # <|endoftext|> Satan
    with torch.no_grad():
        first = gpt(torch.tensor([prompt] * 2))[:, -1]
    assert len(seen) == 3 and seen[0].shape == (2, 50257)      # padded ids never drawn
    assert torch.allclose(seen[0], first[:, :50257])
    assert seen[0].abs().max() <= 2.0                          # the cap, as trained
    assert all(text.startswith("Satan") for text in samples) and len(samples) == 2


def test_a_seed_gives_the_same_text_and_another_seed_other_text(capped_run):
    def draw(seed):
        return sample.main(["--run", str(capped_run), "--seed", str(seed), "--num_samples", "2",
                            "--max_new_tokens", "4", "--temperature", "1", "--top_k", "0"])
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_a_synthetic_vocabulary_takes_and_prints_token_ids(tmp_path, capsys):
    run = write_run(tmp_path / "markov", vocab_size=64)
    texts = sample.main(["--run", str(run), "--prompt", "3 1 4", "--num_samples", "1",
                         "--max_new_tokens", "5"])
    assert capsys.readouterr().out.startswith(f"loading {run / 'ckpt.pt'} …\n")  # before the wait
    ids = [int(word) for word in texts[0].split()]
    assert ids[:3] == [3, 1, 4] and len(ids) == 8 and all(0 <= i < 64 for i in ids)


def test_a_folder_without_a_checkpoint_is_one_sentence(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path / 'ckpt.pt'} is not a checkpoint; pass "
                                         f"--run the folder of a train.py run"):
        sample.main(["--run", str(tmp_path)])
