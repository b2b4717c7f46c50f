"""Training FLOPs per token, behind MFU figures and equal-compute comparisons (Kaplan et al. 2020, "Scaling Laws",
section 2.1): a weight costs 2 FLOPs per token forward and 4 backward, 6 N for N weights; attention adds QK^T and AV,
12 L T H with the backward (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT's estimate_mfu). Embedding lookups,
LayerNorm, softmax and the optimizer are left out, as there.
"""

from __future__ import annotations

from encoderlab.config import EncoderConfig


def encoder_flops_per_token(config: EncoderConfig, seq_len: int) -> float:
    """Forward + backward FLOPs of the encoder for one token of a seq_len-long sequence. A shared-layer model (ALBERT)
    computes as many layers as an unshared one; a factorized model pays for the embedding projection (E x H)."""
    L, H, I, E = config.num_layers, config.hidden_size, config.intermediate_size, config.embedding_width
    up = 2 * I if config.gated_ffn else I  # GeGLU's up-projection gives a value and a gate (ModernBERT)
    block_weights = L * (4 * H * H + H * up + I * H)  # qkv + out, up + down
    projection = E * H if E != H else 0
    return 6 * (block_weights + projection) + 12 * L * seq_len * H


def mlm_flops_per_token(config: EncoderConfig, seq_len: int, masked_fraction: float) -> float:
    """Encoder plus the MLM head's transform (H x E) and tied decoder (E x V) on the masked fraction of tokens."""
    H, E, V = config.hidden_size, config.embedding_width, config.vocab_size
    return encoder_flops_per_token(config, seq_len) + masked_fraction * 6 * (H * E + E * V)


def rtd_flops_per_token(discriminator: EncoderConfig, generator: EncoderConfig, seq_len: int,
                        masked_fraction: float) -> float:
    """ELECTRA: the generator's MLM step plus the discriminator's encoder and its per-token head (H x H + H)."""
    H = discriminator.hidden_size
    return (mlm_flops_per_token(generator, seq_len, masked_fraction)
            + encoder_flops_per_token(discriminator, seq_len) + 6 * (H * H + H))


# Dense (not 2:4 sparse) bf16 tensor-core peaks from NVIDIA's datasheets: H100 SXM and H200 989.4 TFLOPS,
# H100 PCIe 756 TFLOPS, A100 312 TFLOPS. "H100 PCIe" comes before "H100": the first key found in a name wins.
GPU_BF16_PEAKS = {"H200": 989.4e12, "H100 PCIe": 756e12, "H100": 989.4e12, "A100": 312e12}


def gpu_peak(name: str) -> float | None:
    """The dense bf16 peak FLOP/s of a GPU by its name (torch.cuda.get_device_name()), or None for one not known."""
    return next((peak for key, peak in GPU_BF16_PEAKS.items() if key in name), None)
