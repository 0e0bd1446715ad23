"""Pure tensor functions: divergences, settling depth and DTR, baselines."""
