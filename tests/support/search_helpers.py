"""The search's candidates with the engine adapter's rules, as the loop builds them."""

from __future__ import annotations

from sweep.engines import rules_for
from sweep.search import Candidate, candidates_for
from sweep.study.model import Study

CHAINS = """
[study]
name = "chains"
[engine]
model_path = "m"
tp_size = 8
draft_tp_flag = "--speculative-draft-tp-size"
[space]
num_steps = { low = 1, high = 10 }
draft_tp = [1, 8]
"""  # the 20 chain configurations: steps 1-10 x draft TP {1, 8}


def valid_candidates(study: Study) -> tuple[Candidate, ...]:
    return candidates_for(study, rules_for(study))
