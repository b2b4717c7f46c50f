"""Training FLOP counts: checked against a count of the multiply-adds torch actually performs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from encoderlab import EncoderConfig
from encoderlab.nn.encoder import Encoder
from encoderlab.train.flops import encoder_flops_per_token, mlm_flops_per_token, rtd_flops_per_token


def counted_training_flops(config: EncoderConfig, T: int) -> float:
    """FLOPs torch's counter records for a forward and backward of the encoder on one (1, T) sequence."""
    torch.manual_seed(0)
    encoder = Encoder(config)
    ids = torch.randint(1, config.vocab_size, (1, T))
    with FlopCounterMode(display=False) as counter:
        # output_attentions takes the written-out attention path, whose matmuls the counter sees (it does not
        # count the fused CPU attention kernel)
        encoder(ids, output_attentions=True).last_hidden_state.sum().backward()
    return counter.get_total_flops() / T


@pytest.mark.parametrize("preset", ["bert-tiny", "albert-mini", "electra-mini", "modernbert-mini"])
def test_encoder_count_agrees_with_torchs_flop_counter(preset: str) -> None:
    config = EncoderConfig.from_preset(preset, vocab_size=100, pad_token_id=0, max_position_embeddings=64,
                                       hidden_dropout=0.0, attention_dropout=0.0)
    assert encoder_flops_per_token(config, 64) == pytest.approx(counted_training_flops(config, 64), rel=1e-6)


def test_heads_add_what_they_compute() -> None:
    config = EncoderConfig.from_preset("electra-mini")
    base = encoder_flops_per_token(config, 128)
    assert mlm_flops_per_token(config, 128, 0.0) == base
    assert mlm_flops_per_token(config, 128, 0.15) > base
    generator = config.replace(hidden_size=64, num_heads=1, intermediate_size=256)
    assert rtd_flops_per_token(config, generator, 128, 0.15) > mlm_flops_per_token(generator, 128, 0.15) + base
