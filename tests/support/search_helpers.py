"""The search's candidates with the engine adapter's rules, as the loop builds them."""

from __future__ import annotations

from sweep.engines import rules_for
from sweep.search import Candidate, candidates_for
from sweep.study.model import Study


def valid_candidates(study: Study) -> tuple[Candidate, ...]:
    return candidates_for(study, rules_for(study))
