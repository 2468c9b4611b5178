"""vLLM's validity and resolution rules, for the search space (pure).

vLLM 0.32 drafts a chain, not a tree (``reference/vllm-cpu.md`` §6): topk is 1,
draft tokens are ``num_speculative_tokens + 1``, and the draft's TP is 1 or the
target's. Methods without a draft model (``ngram``, ``mtp``) have no draft TP: it
resolves to the target's, so a space varying it plans each server once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sweep.core.space import Rules, Ruling, TrialConfig
from sweep.engines.vllm_spec import DRAFTLESS, METHODS, violation


@dataclass(frozen=True)
class VLLMRules(Rules):
    """vLLM's rules for one study.

    Attributes:
        tp_size: the target's tensor-parallel size.
        algorithm: ``[engine] algorithm`` (mapped to vLLM's ``method``).
        version: the vLLM version the rules describe (for messages).
    """

    tp_size: int
    algorithm: str = "DRAFT_MODEL"
    version: str = "0.32.0"

    @property
    def method(self) -> str | None:
        return METHODS.get(self.algorithm.upper())

    def check(self, config: TrialConfig) -> Ruling | None:
        if not config.speculative:
            return None
        if self.method is None:
            return self._ruling(
                "method", f"{self.algorithm!r} has no vLLM method; use one of {', '.join(METHODS)}"
            )
        c = self.resolve(config)
        reason = violation(c.num_steps, c.eagle_topk, c.num_draft_tokens, c.draft_tp, self.tp_size)
        return None if reason is None else self._ruling("speculative config", reason)

    def resolve(self, config: TrialConfig) -> TrialConfig:
        if config.speculative and self.method in DRAFTLESS:
            return replace(config, draft_tp=self.tp_size)
        return config

    def resolution(self, config: TrialConfig) -> Ruling:
        return self._ruling(
            "resolution", f"{self.method} has no draft model: the draft TP is the target's"
        )

    def _ruling(self, rule: str, reason: str) -> Ruling:
        return Ruling(f"vLLM {self.version} {rule}", reason)
