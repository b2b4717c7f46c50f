"""Attention maps: the probabilities equal transformers' eager `output_attentions=True`, on the real MiniLM
and on tiny random models behind every wrapper (bare, masked LM, fine-tuned); the CLI draws real PNGs.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib.image
import pytest
import torch
from torch import nn
from torch.testing import assert_close
from transformers import BertForMaskedLM, BertForSequenceClassification, BertModel, BertTokenizerFast

from hf_oracle import TOL, VOCAB, randomize, tiny_hf_config

from encoderlab import EncoderModel, InputError, MaskedLMModel, load_model
from encoderlab.cli import main
from encoderlab.nn.model import SequenceClassifier
from encoderlab.tokenizer import Tokenizer
from encoderlab.viz.attention import attention_maps, attention_probs, find_encoder, head_entropy, plot_attention

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TEXT, PAIR = "The cat sat on the mat because it was tired.", "Where did the cat sit?"


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def minilm(minilm_path: Path) -> tuple[EncoderModel, Tokenizer]:
    """Our MiniLM and its tokenizer, loaded once for the module."""
    return load_model(minilm_path), Tokenizer.from_pretrained(minilm_path)


def padded_batch() -> dict[str, torch.Tensor]:
    """Two rows of random ids, the second padded, with segment 1 on the second half of each real row."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([[9], [5]])
    attention_mask = (torch.arange(9) < lengths).long()  # (2, 9)
    input_ids = torch.randint(1, VOCAB, (2, 9), generator=gen) * attention_mask  # pad id 0
    token_type_ids = ((torch.arange(9) >= lengths // 2) & attention_mask.bool()).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def tiny_pair(kind: str, folder: Path) -> tuple[nn.Module, nn.Module]:
    """(our model, transformers' eager model) of the same random tiny weights, one of our three wrappers."""
    hf_cls, load = {"base": (BertModel, load_model), "mlm": (BertForMaskedLM, load_model),
                    "task": (BertForSequenceClassification, load_model)}[kind]
    torch.manual_seed(0)
    hf = hf_cls(tiny_hf_config(num_labels=3))
    randomize(hf)
    hf.save_pretrained(folder)
    return load(folder), hf_cls.from_pretrained(folder, attn_implementation="eager").eval()


# ---- parity with transformers ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, ours_cls", [("base", EncoderModel), ("mlm", MaskedLMModel),
                                            ("task", SequenceClassifier)])
def test_probabilities_of_every_wrapper_match_eager_transformers_on_a_padded_batch(
        tmp_path: Path, kind: str, ours_cls: type) -> None:
    ours, hf = tiny_pair(kind, tmp_path)
    assert isinstance(ours, ours_cls)
    batch = padded_batch()
    probs = attention_probs(ours, **batch)  # (L, B, heads, T, T)
    with torch.no_grad():
        ref = torch.stack(hf(**batch, output_attentions=True).attentions)
    assert probs.shape == (2, 2, 4, 9, 9) and probs.dtype == torch.float32
    assert_close(probs, ref, **TOL)
    assert_close(probs.sum(-1), torch.ones(2, 2, 4, 9), **TOL)
    assert torch.all(probs[:, 1, :, :, 5:] == 0)  # the padding of row 2 is never attended to


def test_minilm_maps_of_a_pair_match_eager_transformers(minilm, minilm_path: Path) -> None:
    model, tokenizer = minilm
    maps = attention_maps(model, tokenizer, TEXT, pair=PAIR)
    hf_tokenizer = BertTokenizerFast.from_pretrained(minilm_path)
    inputs = hf_tokenizer(TEXT, PAIR, return_tensors="pt")
    hf = BertModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = torch.stack(hf(**inputs, output_attentions=True).attentions)[:, 0]  # (L, heads, T, T)
    assert maps.tokens == hf_tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    assert maps.tokens[0] == "[CLS]" and maps.tokens.count("[SEP]") == 2
    T = len(maps.tokens)
    assert maps.probs.shape == (6, 12, T, T) and maps.layers == list(range(6)) and not maps.truncated
    assert_close(maps.probs, ref, **TOL)
    assert_close(maps.probs.sum(-1), torch.ones(6, 12, T), **TOL)


def test_chosen_layers_negative_indexes_and_select(minilm) -> None:
    model, tokenizer = minilm
    full = attention_maps(model, tokenizer, TEXT)
    some = attention_maps(model, tokenizer, TEXT, layers=[-1, 2])
    assert some.layers == [5, 2]
    assert torch.equal(some.probs, full.probs[[5, 2]])
    assert torch.equal(some.select(-1, head=-2), full.probs[5, 10])
    assert torch.equal(some.select(2), full.probs[2])
    with pytest.raises(InputError, match="not among the layers computed"):
        some.select(0)
    with pytest.raises(InputError, match=r"head 12 out of range.*valid: 0\.\.11"):
        full.select(0, head=12)
    with pytest.raises(InputError, match=r"layer 6 out of range.*valid: 0\.\.5"):
        attention_maps(model, tokenizer, TEXT, layers=[6])


def test_eval_mode_and_fp32_are_used_whatever_the_caller_set(tmp_path: Path) -> None:
    ours, hf = tiny_pair("base", tmp_path)  # attention dropout 0.1: in train mode the maps would be random
    batch = padded_batch()
    with torch.no_grad():
        ref = torch.stack(hf(**batch, output_attentions=True).attentions)  # fp32, eval mode
    ours.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # would round the scores to bf16 (errors ~1e-2)
        got = attention_probs(ours, **batch)
    assert all(module.training for module in ours.modules())  # the caller's mode is given back
    assert_close(got, ref, **TOL)


def test_bad_input_is_refused(minilm) -> None:
    model, tokenizer = minilm
    with pytest.raises(InputError, match="empty"):
        attention_maps(model, tokenizer, "  \n ")
    with pytest.raises(InputError, match="pair is empty"):
        attention_maps(model, tokenizer, TEXT, pair="\t")
    with pytest.raises(InputError, match="no encoderlab Encoder"):
        find_encoder(nn.Linear(2, 2))


def test_entropy_is_zero_for_one_hot_rows_and_log_t_for_uniform() -> None:
    one_hot, uniform = torch.eye(5)[None], torch.full((1, 5, 5), 0.2)  # (1, T, T)
    assert_close(head_entropy(torch.cat([one_hot, uniform])), torch.tensor([0.0, math.log(5)]))


# ---- pictures and the command line -------------------------------------------------------------------------
def read_png(path: Path) -> tuple[int, int]:
    """(height, width) in pixels of a real PNG file, read back with matplotlib."""
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert not list(path.parent.glob(f".{path.name}.*.tmp"))  # the atomic write left no temp file
    return matplotlib.image.imread(path).shape[:2]


@pytest.mark.slow
def test_cli_draws_one_head_and_the_grid_of_all_heads(tmp_path: Path, capsys) -> None:
    one, grid = tmp_path / "one.png", tmp_path / "grid.png"
    assert main(["attention", "--model", "minilm", TEXT, "--layer", "2", "--head", "-1", "--out", str(one)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {one}: layer 2, head 11, 13 tokens"
    assert main(["attention", "--model", "minilm", TEXT, "--pair", PAIR, "--out", str(grid)]) == 0
    assert "layer 5, all 12 heads, 20 tokens" in capsys.readouterr().out
    (h1, w1), (h12, w12) = read_png(one), read_png(grid)
    assert 300 < h1 < 2000 and 300 < w1 < 2000  # one square map of 13 tokens at 110 dpi
    assert w12 > 2 * w1 and h12 > h1  # a 4 x 3 grid


def test_cli_json_holds_the_drawn_map_and_entropies(tmp_path: Path, capsys, minilm) -> None:
    out = tmp_path / "head.png"
    assert main(["attention", "--model", "minilm", TEXT, "--head", "3", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    model, tokenizer = minilm
    expected = attention_maps(model, tokenizer, TEXT).select(-1, 3)  # (T, T)
    assert report["png"] == str(out) and read_png(out)
    assert (report["layer"], report["head"], report["num_heads"]) == (5, 3, 12)
    assert report["tokens"][0] == "[CLS]" and report["tokens"][-1] == "[SEP]"
    assert_close(torch.tensor(report["attention"]), expected, **TOL)
    assert 0.0 < report["entropy_nats"] < report["max_entropy_nats"] == pytest.approx(math.log(13))


def test_cli_long_input_and_plot_attention_cap_the_tokens_shown(tmp_path: Path, minilm) -> None:
    model, tokenizer = minilm
    maps = attention_maps(model, tokenizer, " ".join([TEXT] * 10), layers=[0])  # 121 tokens
    small, capped = tmp_path / "small.png", tmp_path / "capped.png"
    plot_attention(maps, small, layer=0, head=0, max_tokens=10)
    plot_attention(maps, capped, layer=0, head=0)
    assert read_png(small)[1] < read_png(capped)[1]  # fewer labels, a smaller figure


@pytest.mark.slow
def test_drawing_leaves_pyplot_alone(tmp_path: Path, minilm) -> None:
    # A notebook's inline backend must survive a plot (matplotlib.use("Agg") used to switch it off), and no
    # figure may pile up in pyplot's list (a server draws many).
    import matplotlib
    import matplotlib.pyplot as plt

    from encoderlab.viz.curves import plot_metrics

    previous = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        model, tokenizer = minilm
        plot_attention(attention_maps(model, tokenizer, TEXT, layers=[0]), tmp_path / "a.png", layer=0)
        (tmp_path / "metrics.csv").write_text("step,loss,eval_mlm_accuracy\n1,2.0,0.1\n2,1.5,0.2\n", encoding="utf-8")
        plot_metrics(tmp_path / "metrics.csv", tmp_path / "c.png")
        assert matplotlib.get_backend() == "svg" and plt.get_fignums() == []
        assert read_png(tmp_path / "a.png") and read_png(tmp_path / "c.png")
    finally:
        matplotlib.use(previous)


@pytest.mark.parametrize("options, message", [
    (["--layer", "6"], r"layer 6 out of range: the model has 6 layers \(valid: 0\.\.5"),
    (["--layer", "-7"], r"layer -7 out of range"),
    (["--head", "12"], r"head 12 out of range: the model has 12 heads \(valid: 0\.\.11"),
])
def test_cli_out_of_range_layer_or_head_exits_2_with_one_line(tmp_path: Path, capsys, options, message) -> None:
    out = tmp_path / "x.png"
    assert main(["attention", "--model", "minilm", TEXT, "--out", str(out), *options]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err)
    assert not out.exists()


def test_cli_empty_text_exits_2(tmp_path: Path, capsys) -> None:
    assert main(["attention", "--model", "minilm", "   ", "--out", str(tmp_path / "x.png")]) == 2
    assert "empty" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_truncates_a_long_text_to_a_roberta_window_and_says_so(tmp_path: Path, capsys, roberta_window_path,
                                                                    long_text) -> None:
    # Issue 36: RoBERTa's 514 positions hold 512 tokens (they start at pad_token_id + 1); a 2,000-word text used to
    # raise "sequence of 514 tokens is longer than the model's 512 positions".
    out = tmp_path / "long.png"
    args = ["attention", "--model", str(roberta_window_path), long_text, "--head", "0", "--out", str(out)]
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: layer 1, head 0, 512 tokens (truncated to the model's window)"
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["truncated"] is True and len(report["tokens"]) == 512 and report["tokens"][-1] == "</s>"
    assert torch.tensor(report["attention"]).shape == (512, 512)
    assert main([*args[:3], "anna lives in paris", *args[4:], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["truncated"] is False
