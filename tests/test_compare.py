"""`encoderlab compare`: sizes counted on the built models, positive timings, ratios to the reference, clean errors."""

from __future__ import annotations

import json

import pytest

from encoderlab import compare as cmp
from encoderlab.cli import main
from encoderlab.config import EncoderConfig
from encoderlab.errors import ConfigError, InputError
from encoderlab.models import PRESETS
from encoderlab.nn.model import EncoderModel

TINY = ("bert-tiny", "bert-mini")
FAST = cmp.Settings(threads=1, sequences=8, batch_size=4, latency_sequences=2, repeats=1)


def built_parameters(preset: str) -> int:
    model = EncoderModel(EncoderConfig.from_preset(preset))
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def rows() -> list[cmp.Row]:
    return cmp.compare(["bert-mini"], FAST, reference="bert-tiny", sst2_results=[])


def test_rows_start_with_the_reference_and_count_what_the_model_holds(rows):
    assert [row.preset for row in rows] == list(TINY)
    for row in rows:
        config = EncoderConfig.from_preset(row.preset)
        assert (row.num_layers, row.hidden_size, row.num_heads) == (config.num_layers, config.hidden_size,
                                                                    config.num_heads)
        assert row.parameters == built_parameters(row.preset)
        assert 0 < row.embedding_parameters < row.parameters


def test_ratios_are_to_the_reference_and_timings_positive(rows):
    reference, other = rows
    assert reference.size_vs_reference == reference.speed_vs_reference == reference.throughput_vs_reference == 1
    assert other.size_vs_reference == pytest.approx(other.parameters / reference.parameters)
    assert other.speed_vs_reference == pytest.approx(reference.latency_ms / other.latency_ms)
    assert other.throughput_vs_reference == pytest.approx(other.throughput / reference.throughput)
    assert all(row.latency_ms > 0 and row.throughput > 0 for row in rows)
    assert all(row.sst2_accuracy is None for row in rows)


def test_inputs_are_seeded_valid_for_every_model_and_sst2_like():
    configs = [EncoderConfig.from_preset("bert-tiny", vocab_size=500, pad_token_id=3),
               EncoderConfig.from_preset("bert-mini", vocab_size=800, pad_token_id=0)]
    inputs = cmp.sample_inputs(configs, 400, seed=7)
    assert inputs == cmp.sample_inputs(configs, 400, seed=7) != cmp.sample_inputs(configs, 400, seed=8)
    assert all(3 < token < 500 for ids in inputs for token in ids)  # above every pad id, below every vocab
    lengths = sorted(map(len, inputs))
    assert 4 <= lengths[0] and lengths[-1] <= 55
    assert 20 <= lengths[len(lengths) // 2] <= 30  # SST-2 dev: median 24.5 tokens
    modern = [configs[0], EncoderConfig.from_preset("modernbert-mini", vocab_size=50368)]  # pad id 50283
    assert all(3 < token < 500 for ids in cmp.sample_inputs(modern, 100, seed=7) for token in ids)


def test_batches_are_length_sorted_and_padded_with_the_models_pad_id():
    inputs = [[5] * n for n in (9, 3, 7, 4, 8)]
    batches = cmp.sorted_batches(inputs, batch_size=2, pad_id=1)
    assert [b["attention_mask"].sum(1).tolist() for b in batches] == [[3, 4], [7, 8], [9]]
    assert batches[0]["input_ids"][0].tolist() == [5, 5, 5, 1]


def test_claims_are_computed_from_the_rows():
    def row(preset: str, parameters: int, latency: float, throughput: float) -> cmp.Row:
        return cmp.Row(preset, "bert", 12, 768, 12, parameters, parameters // 4, latency, throughput)

    reference = row("bert-base", 100_000_000, 40.0, 30.0)
    rows = [cmp._relative(r, reference) for r in (reference, row("distilbert-base", 60_000_000, 20.0, 60.0))]
    (sentence,) = cmp.claim_sentences(rows)
    assert "40% fewer than bert-base" in sentence and "2.00x its batch-1 speed" in sentence
    assert "Sanh et al. 2019" in sentence
    bigger = cmp._relative(row("roberta-base", 114_000_000, 40.0, 30.0), reference)
    assert "14% more than bert-base" in cmp.claim_sentences([reference, bigger])[0]


def test_a_claim_against_another_family_is_measured_against_its_row():
    def row(preset: str, latency: float, throughput: float) -> cmp.Row:
        return cmp.Row(preset, "x", 12, 768, 12, 100_000_000, 25_000_000, latency, throughput)

    reference, deberta, modern = row("bert-base", 40.0, 30.0), row("deberta-v3-base", 60.0, 12.0), row(
        "modernbert-base", 30.0, 36.0)
    rows = [cmp._relative(r, reference) for r in (reference, deberta, modern)]
    sentence = cmp.claim_sentences(rows)[-1]
    assert "Warner et al. 2024" in sentence and "GLUE 88.4" in sentence
    assert "Measured against deberta-v3-base: 3.00x its batch throughput and 2.00x its batch-1 speed" in sentence
    without = cmp.claim_sentences([rows[0], rows[2]])[0]
    assert "Warner et al. 2024" in without and "Measured against" not in without


def test_sst2_accuracy_is_read_from_bench_results(tmp_path):
    result = {"figures": {"sst2": {"accuracy": 0.91, "model": "runs/bert-mini"},
                          "sst2-other": {"accuracy": 0.5, "model": "bert-tiny"},
                          "conll": {"accuracy": 0.99, "model": "bert-tiny"}}}
    path = tmp_path / "finetune.json"
    path.write_text(json.dumps(result))
    found = cmp.sst2_accuracies([path])
    assert found["bert-mini"]["sst2_accuracy"] == 0.91 and found["bert-tiny"]["sst2_accuracy"] == 0.5
    assert found["bert-mini"]["sst2_source"] == f"{path}:sst2"
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="bad.json: expected a bench result"):
        cmp.sst2_accuracies([tmp_path / "bad.json"])


def test_unknown_preset_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(ConfigError, match="'bert-huge'") as err:
        cmp.compare(["bert-tiny", "bert-huge"], FAST, reference="bert-tiny")
    assert all(name in str(err.value) for name in PRESETS)


def test_default_presets_are_the_families_that_exist():
    assert cmp.default_presets() == [name for name in cmp.FAMILY_PRESETS if name in PRESETS]
    assert cmp.default_presets()[0] == "bert-base"


def test_cli_json_and_out(tmp_path, capsys):
    out = tmp_path / "table.json"
    argv = ["compare", "--presets", "bert-mini", "--reference", "bert-tiny", "--quick", "--sequences", "8",
            "--repeats", "1", "--threads", "1", "--json", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert [row["preset"] for row in printed["rows"]] == list(TINY)
    assert printed["rows"][1]["parameters"] == built_parameters("bert-mini")
    assert printed["settings"]["sequences"] == 8 and printed["reference"] == "bert-tiny"


def test_cli_markdown_table(tmp_path, capsys):
    out = tmp_path / "table.md"
    argv = ["compare", "--presets", "bert-mini", "--reference", "bert-tiny", "--sequences", "4", "--repeats", "1",
            "--threads", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text == out.read_text()
    table = [line for line in text.splitlines() if line.startswith("| bert-")]
    assert [line.split(" | ")[0] for line in table] == ["| bert-tiny", "| bert-mini"]
    assert f"{built_parameters('bert-mini'):,}" in table[1] and "1.00x" in table[0]
    assert "bert-mini:" in text  # the measured-claims list


def test_cli_unknown_preset_exits_2_naming_the_known_ones(capsys):
    assert main(["compare", "--presets", "bert-huge", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'bert-huge'" in err and "bert-base" in err and err.count("\n") == 1


def test_settings_out_of_range_are_refused_by_name():
    with pytest.raises(ConfigError, match="threads must be a positive integer, got 0"):
        cmp.compare(["bert-tiny"], cmp.Settings(threads=0), reference="bert-tiny")
    with pytest.raises(ConfigError, match=r"latency_sequences \(9\) must not exceed sequences \(8\)"):
        cmp.compare(["bert-tiny"], cmp.replace(FAST, latency_sequences=9), reference="bert-tiny")
