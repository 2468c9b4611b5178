"""sweep: find the fastest speculative-decoding settings for an LLM inference server."""

from __future__ import annotations

__version__ = "0.1.0.dev0"
