"""Hidden states → per-layer distributions, streamed in bounded memory."""
