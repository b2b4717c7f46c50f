"""Building blocks of the encoder, one concept per file."""
