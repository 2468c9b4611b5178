"""The simulated SGLang server (`sweep sim`)."""
