"""The MLM step without a host sync: the collator caps an example's predictions (MaskBudget), so the MLM head runs on
a fixed number of rows known from the batch's shape; the loss is the exact-count path's, and compile sees one graph."""

from __future__ import annotations

import pytest
import torch

from encoderlab.config import EncoderConfig
from encoderlab.data.collate import MaskBudget
from encoderlab.nn.model import IGNORE_INDEX, MaskedLMModel, PreTrainingModel
from encoderlab.nn.output import batch_counts
from encoderlab.objectives.mlm import MaskedLanguageModeling
from test_data_collate import collator, make_examples

TINY = dict(model_type="bert", vocab_size=1000, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
            max_position_embeddings=320)


def _batch(count: int = 6, probability: float = 0.15, seed: int = 0) -> dict[str, torch.Tensor]:
    return collator(mlm_probability=probability, whole_word=True)(make_examples(count, seed),
                                                                   torch.Generator().manual_seed(seed))


def _objective(model_class: type = MaskedLMModel, probability: float | None = 0.15) -> MaskedLanguageModeling:
    torch.manual_seed(0)
    objective = MaskedLanguageModeling(model_class(EncoderConfig(**TINY)).eval())
    objective.mask_budget = None if probability is None else MaskBudget(probability)
    return objective


@pytest.mark.parametrize("probability", [0.15, 0.3])
def test_no_row_holds_more_predictions_than_its_budget(probability):
    batch = _batch(200, probability)
    chosen = (batch["labels"] != IGNORE_INDEX).sum(1)
    caps = MaskBudget(probability).per_row(batch["attention_mask"].sum(1))
    assert (chosen <= caps).all()
    assert chosen.sum() <= MaskBudget(probability).positions(*batch["labels"].shape)
    # the cap is a bound, not a quota: the rows' draws stay near p (it cuts only the rare excess)
    real = batch["attention_mask"].sum()
    assert abs(float(chosen.sum() / real) - probability) < 0.03


def test_a_draw_over_the_budget_keeps_its_first_predictions():
    masking = collator(mlm_probability=0.15)
    ids = torch.arange(10, 74).unsqueeze(0)  # (1, 64) ordinary tokens
    mask = torch.ones_like(ids)
    draws = torch.zeros(ids.shape)  # every token drawn: far over the budget
    _, labels = masking.apply(ids, mask, torch.ones(ids.shape, dtype=torch.bool), draws, torch.zeros(ids.shape),
                              torch.zeros(ids.shape, dtype=torch.long))
    cap = int(MaskBudget(0.15).per_row(torch.tensor([64]))[0])
    assert cap == 8 + 15  # ceil(1.5 x 0.15 x 64) + 8
    assert (labels[0, :cap] == ids[0, :cap]).all() and (labels[0, cap:] == IGNORE_INDEX).all()


@pytest.mark.parametrize("model_class", [MaskedLMModel, PreTrainingModel])
def test_the_budgeted_loss_equals_the_exact_counts(model_class):
    batch = _batch()
    if model_class is PreTrainingModel:
        batch["next_sentence_label"] = torch.tensor([0, 1, 1, 0, 1, 0])
    exact, budgeted = _objective(model_class, None), _objective(model_class, 0.15)
    counts = batch_counts(batch)
    loss, sums = exact(batch, counts)
    loss_b, sums_b = budgeted(batch, counts)
    torch.testing.assert_close(loss_b, loss, rtol=1e-6, atol=1e-6)
    assert int(sums_b["mlm_correct"]) == int(sums["mlm_correct"])
    out = budgeted.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"],
                         masked_budget=budgeted.mask_budget.positions(*batch["labels"].shape))
    assert out.logits.shape[0] == budgeted.mask_budget.positions(*batch["labels"].shape)  # a fixed row count
    assert int(out.sums["mlm"][1]) == int((batch["labels"] != IGNORE_INDEX).sum())


def test_the_budgeted_gradients_equal_the_exact_ones():
    batch = _batch()
    grads = []
    for probability in (None, 0.15):
        objective = _objective(probability=probability)
        loss, _ = objective(batch, batch_counts(batch))
        loss.backward()
        grads.append(objective.model.mlm.transform.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def _graph_breaks(objective: MaskedLanguageModeling, batch: dict[str, torch.Tensor]) -> int:
    import torch._dynamo as dynamo

    dynamo.reset()
    counts = batch_counts(batch)
    explained = dynamo.explain(lambda b: objective(b, counts)[0])(batch)
    return explained.graph_break_count


@pytest.mark.slow
def test_compile_sees_the_budgeted_step_as_one_graph():
    """The old path (boolean indexing, a data-dependent size) breaks the graph where the host must read the count;
    the budgeted one does not: one graph, nothing the host waits for inside the step."""
    batch = _batch()
    assert _graph_breaks(_objective(probability=None), batch) >= 1  # the check can fail: it sees the old break
    assert _graph_breaks(_objective(probability=0.15), batch) == 0


def test_whole_word_masking_keeps_or_drops_a_word_whole_at_the_budget():
    masking = collator(mlm_probability=0.15, whole_word=True)
    ids = torch.arange(10, 74).unsqueeze(0)  # (1, 64): 32 words of 2 tokens
    starts = (torch.arange(64) % 2 == 0).unsqueeze(0)
    _, labels = masking.apply(ids, torch.ones_like(ids), starts, torch.zeros(ids.shape), torch.zeros(ids.shape),
                              torch.zeros(ids.shape, dtype=torch.long))
    kept = labels[0] != IGNORE_INDEX  # the budget is 23 tokens: 11 whole words, the 12th would be cut in two
    assert int(kept.sum()) == 22 and kept[:22].all() and not kept[22:].any()
