"""Play the whole search + confirmation policy against the simulator's truth, with noise.

The driver calls exactly what the trial loop calls: a :class:`PhysicsSampler` (or
another sampler) through an in-memory Optuna study with ask/tell —
``suggest`` → the engine's resolution → a measurement → ``tell`` with the
``sweep_feasible`` constraint and the accept length as user attributes — then
:func:`sweep.search.confirm.decide` repeatedly, relaunching what it asks for
(enqueued with the configuration's parameters, as the loop would) until it
decides. Only the measurement is simulated: the noise-free truth
(:func:`sweep.sim.model.predict`) times a per-launch factor (σ = 2 %) and a
within-launch factor (σ = 0.5 %, reported as the launch's standard error).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import optuna

from sweep.core.records import FEASIBLE
from sweep.core.space import suggest
from sweep.engines import rules_for
from sweep.search import (
    Candidate,
    ConfirmOptions,
    Decision,
    Launch,
    PhysicsSampler,
    Relaunch,
    ValidRandomSampler,
    decide,
    history_of,
    launch_variance,
)
from sweep.search.candidates import by_key
from sweep.search.config_sampler import PREDICTED_ATTR, REPLICATE_ATTR
from sweep.search.history import ACCEPT_LENGTH_ATTR, KIND_ATTR, STDERR_ATTR, Matcher
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import FailureRule, NcclRule, Profile, load_profile
from sweep.study import parse_study
from sweep.study.model import Study
from tests.support.search_helpers import valid_candidates

LAUNCH_SD = 0.02
WITHIN_SD = 0.005
ACCEPT_SD = 0.01
BASELINE = "baseline[]"
BASELINE_EVERY = 10  # the loop's default [baseline] every_trials
MAX_IDLE_PROPOSALS = 20  # sweep.loop.runner's: proposals that launch nothing before it picks one
DEFAULT_OPTIONS = ConfirmOptions()

HEAD = """
[study]
name = "play"
[engine]
model_path = "m"
tp_size = 8
draft_tp_flag = "--speculative-draft-tp-size"
"""
SMALL = (
    HEAD
    + """
[space]
num_steps = { low = 1, high = 10 }
draft_tp = [1, 8]
"""
)
LARGE = (
    HEAD
    + """
[space]
num_steps = { low = 1, high = 10 }
eagle_topk = [1, 2, 4]
num_draft_tokens = { low = 2, high = 16 }
draft_tp = [1, 8]
[space.env]
NCCL_PROTO = ["Simple", "LL"]
"""
)


@dataclass(frozen=True)
class Space:
    name: str
    study: Study
    budget: int  # launches: search + confirmation

    @classmethod
    def of(cls, name: str, text: str, budget: int) -> Space:
        return cls(name, parse_study(text, f"/tmp/{name}.toml"), budget)


def spaces() -> tuple[Space, ...]:
    return (Space.of("small", SMALL, 20), Space.of("large", LARGE, 60))


TOPK8 = (
    HEAD
    + """
[space]
num_steps = { low = 1, high = 5 }
eagle_topk = [1, 2, 4, 8]
num_draft_tokens = { low = 2, high = 32 }
draft_tp = [8]
"""
)


def topk8_spaces() -> tuple[Space, ...]:
    """SGLang's tree range (the topk8 landscapes' space)."""
    return (Space.of("topk8", TOPK8, 40),)


def midtp_spaces() -> tuple[Space, ...]:
    """The small and large spaces with draft TP 1, 2, 4 and 8 (the midtp landscapes')."""
    every = "draft_tp = [1, 2, 4, 8]"
    return (
        Space.of("tp4", SMALL.replace("draft_tp = [1, 8]", every), 40),
        Space.of("tp4-large", LARGE.replace("draft_tp = [1, 8]", every), 60),
    )


def landscapes() -> dict[str, Profile]:
    """The shipped profiles and three synthetic ones of the same physics."""
    out = {name: load_profile(name) for name in ("default", "high-acceptance", "tree")}
    default, high = out["default"], out["high-acceptance"]
    out["synthetic-slow-draft"] = _perturb(
        default,
        acceptance={"first": 0.75, "decay": 0.9, "sibling_gain": 0.2},
        draft={"compute_ms": 1.4, "allreduce_ms": {"1": 0.0, "2": 1.2, "4": 2.0, "8": 3.0}},
        timing={"spec_overhead_ms": 2.0, "draft_tp_mismatch_ms": 0.8},
    )
    out["synthetic-costly-verify"] = _perturb(
        high,
        acceptance={"first": 0.8, "decay": 0.93, "sibling_gain": 0.25},
        timing={"token_ms": 0.55, "spec_overhead_ms": 2.5},
        draft={"topk_ms": 0.3},
    )
    out["synthetic-tp8-wins"] = _perturb(
        default,
        acceptance={"first": 0.7, "decay": 0.88, "sibling_gain": 0.15},
        draft={"compute_ms": 0.9, "allreduce_ms": {"1": 0.0, "2": 0.1, "4": 0.15, "8": 0.2}},
        timing={"draft_tp_mismatch_ms": 2.5, "spec_overhead_ms": 2.8},
    )
    return out


def misfit_landscapes() -> dict[str, Profile]:
    """Five landscapes of shapes the cost model cannot represent (the simulator's misfit
    knobs, docs/simulator.md): draft-TP communication growing with steps, a verify cliff,
    acceptance falling past 4 steps, a flat top, and a memory cliff (CUDA graphs 20 MB per
    captured token and batch slot, 4× the default: past a graph width of 12 — draft tokens +
    steps × topk, so 6 steps of a chain — a launch runs out of memory, below the chains'
    optimum at 7 steps)."""
    default, high = load_profile("default"), load_profile("high-acceptance")
    return {
        "misfit-tp-comm": _perturb(
            default,
            acceptance={"first": 0.7, "decay": 0.88, "sibling_gain": 0.15},
            draft={
                "compute_ms": 0.9,
                "allreduce_ms": {"1": 0.0, "2": 0.1, "4": 0.15, "8": 0.2},
                "allreduce_growth": 1.0,
            },
            timing={"draft_tp_mismatch_ms": 2.5, "spec_overhead_ms": 2.8},
        ),
        "misfit-verify-cliff": _perturb(
            high, timing={"verify_cliff_tokens": 7, "verify_cliff_factor": 0.25}
        ),
        "misfit-falling-acceptance": _perturb(
            high, acceptance={"fall_after": 4, "fall_per_step": 0.05}
        ),
        "misfit-flat-top": _perturb(high, timing={"min_token_ms": 4.6}),
        "misfit-memory-cliff": _perturb(high, memory={"graph_gb_per_token": 0.0174}),
    }


def memory_landscapes() -> dict[str, Profile]:
    """A memory cliff that graph width does not describe (not in the default run;
    ``--landscapes misfit-memory-tree``): the tree profile whose verify graphs hold 39 MB per
    draft token and batch slot and whose draft graphs hold next to nothing (the draft is a
    small model), so only draft tokens <= 6 fit, whatever the steps and topk — s2-k2-d7 (width
    11) runs out, s2-k4-d6 (width 14) fits."""
    memory = {"graph_gb_per_token": 0.039, "draft_graph_weight": 0.0}
    return {"misfit-memory-tree": _perturb(load_profile("tree"), memory=memory)}


def heldout_landscapes() -> dict[str, Profile]:
    """Five landscapes of shapes the search was not tuned against (issue 21's held-out set;
    ``python -m tests.perf.search_play --truth heldout`` prints their optima):

    - ``heldout-tp1-cliff``: draft TP 1 cheaper per step, but its draft steps run 50 %
      slower from 5 steps on (``draft.cliff_steps``), so draft TP 1 peaks at 4 steps and
      draft TP 8 wins at 6-7 (3.4 % better);
    - ``heldout-two-optima``: a mild verify cliff (× 1.10 from 6 draft tokens) under high
      acceptance: a local optimum at 4 steps, the global one at 7-8 (3.4 % better);
    - ``heldout-flag-tp8``: ``NCCL_PROTO=LL`` cuts only the draft's all-reduce (scope
      ``draft``), so it does nothing at draft TP 1 (the small space's winner) and makes
      draft TP 8 the large space's winner (6.8 % better);
    - ``heldout-plateau-drop``: acceptance flat over depth (decay 1) that falls 6 % per
      step past 6 steps: the throughput rises to 5-6 steps and drops 12 % at 7;
    - ``heldout-peaked-tree``: the ``tree`` profile with siblings that catch 55 % of the
      misses: a peaked optimum at topk 4, 4 steps, 16 draft tokens (15: −2 %, 5 or 3 steps:
      −5 %); the small space (chains only) keeps ``tree``'s 2-step chain;
    - ``heldout-no-gain``: a weak draft (acceptance 0.3, decaying 0.6 per position) and a
      dear speculative step (6 ms): no speculation beats every configuration by 17 % or more
      (these three with no NCCL rule: a flag would speed the target, not speculation);
    - ``heldout-marginal-loss``: the best chain (2 steps) is 1.6 % below no speculation —
      within one launch's noise;
    - ``heldout-marginal-gain``: the best chain (2 steps) is 3.7 % above no speculation;
    - ``heldout-flag-no-gain``: ``default`` with a weak draft (acceptance 0.45, decaying
      0.75; a 4 ms speculative step): its NCCL_PROTO=LL rule speeds the target's all-reduce
      (+37 % with no speculation), so on the large space (which searches it) no speculation
      with the flag beats every configuration by 8.9 % (and the plain baseline by 37 %);
    - ``heldout-flag-marginal``: the same with acceptance 0.5: no speculation with the flag
      is 3.4 % above the best configuration.
    """
    high, tree = load_profile("high-acceptance"), load_profile("tree")
    default = load_profile("default")
    plain = default.replace(nccl=())  # the NCCL flag would speed the target, not speculation
    flag = _perturb(
        default,
        draft={"allreduce_ms": {"1": 0.0, "2": 0.6, "4": 0.9, "8": 1.2}},
        timing={"draft_tp_mismatch_ms": 2.0},
    )
    return {
        "heldout-tp1-cliff": _perturb(
            high,
            draft={
                "allreduce_ms": {"1": 0.0, "2": 0.1, "4": 0.15, "8": 0.2},
                "cliff_steps": {"1": 5},
                "cliff_factor": 0.5,
            },
        ),
        "heldout-two-optima": _perturb(
            high,
            acceptance={"first": 0.88, "decay": 0.98},
            timing={"verify_cliff_tokens": 6, "verify_cliff_factor": 0.10},
        ),
        "heldout-flag-tp8": flag.replace(nccl=(NcclRule("NCCL_PROTO", "LL", 0.25, scope="draft"),)),
        "heldout-plateau-drop": _perturb(
            default,
            acceptance={"first": 0.75, "decay": 1.0, "fall_after": 6, "fall_per_step": 0.06},
        ),
        "heldout-peaked-tree": _perturb(
            tree, acceptance={"sibling_gain": 0.55}, timing={"token_ms": 0.3}
        ),
        "heldout-no-gain": _perturb(
            plain, acceptance={"first": 0.3, "decay": 0.6}, timing={"spec_overhead_ms": 6.0}
        ),
        "heldout-marginal-loss": _perturb(
            plain, acceptance={"first": 0.4, "decay": 0.75}, timing={"spec_overhead_ms": 4.0}
        ),
        "heldout-marginal-gain": _perturb(
            plain, acceptance={"first": 0.45, "decay": 0.75}, timing={"spec_overhead_ms": 4.0}
        ),
        "heldout-flag-no-gain": _perturb(
            default, acceptance={"first": 0.45, "decay": 0.75}, timing={"spec_overhead_ms": 4.0}
        ),
        "heldout-flag-marginal": _perturb(
            default, acceptance={"first": 0.5, "decay": 0.75}, timing={"spec_overhead_ms": 4.0}
        ),
    }


def unseen_landscapes() -> dict[str, Profile]:
    """Five landscapes of shapes none of the sets above has (``--landscapes unseen`` in
    bench_answer; ``python -m tests.perf.search_play --truth unseen`` prints their optima):

    - ``unseen-horizon``: ``high-acceptance`` with a draft trained 3 positions deep
      (``acceptance.horizon``): depths past 3 accept half as often, so the accept length
      saturates instead of decaying smoothly; chains peak sharply at 4 steps (5: −1.9 %,
      3: −2.7 %);
    - ``unseen-chain-or-tree``: dear verify tokens (0.6 ms) and branches (0.3 ms) with
      siblings that catch 42 % of the misses: a ridge across topk — topk 2 at 2-3 steps,
      chains at 2 and topk 4 at 3-4 within a few % of each other; chains only on the
      small space (2 steps);
    - ``unseen-tp1-late``: a cross-over: draft TP 8's all-reduce is cheap (0.25 ms a step)
      and draft TP 1 pays 1.5 ms a cycle to broadcast, so draft TP 8 wins below 6 steps and
      draft TP 1 above (the small space's optimum, 7 steps; draft TP 8's best is 1 % behind);
    - ``unseen-tree-cliff``: ``tree`` whose tree verify runs eager once topk × draft tokens
      reaches 32 (``timing.tree_cliff_width``, × 1.25): topk 4 falls off at 8 draft tokens,
      topk 2 at 16, chains never; the optimum (2 steps, topk 4, 7 tokens) sits just below;
    - ``unseen-noisy-tp8``: heteroscedastic launch noise (``noise.launch_cv_by_draft_tp``):
      draft TP 8 launches vary 4 %, draft TP 1 launches 1 % (bench_answer uses them in place
      of its 2 %); draft TP 1 wins the small space by 2.5 %, draft TP 8 the large by 4 %.
    """
    high, tree = load_profile("high-acceptance"), load_profile("tree")
    return {
        "unseen-horizon": _perturb(high, acceptance={"horizon": 3, "horizon_factor": 0.5}),
        "unseen-chain-or-tree": _perturb(
            tree,
            acceptance={"first": 0.7, "decay": 0.7, "sibling_gain": 0.42},
            timing={"token_ms": 0.6},
            draft={"topk_ms": 0.3, "compute_ms": 0.5},
        ),
        "unseen-tp1-late": _perturb(
            high,
            draft={"allreduce_ms": {"1": 0.0, "2": 0.15, "4": 0.2, "8": 0.25}},
            timing={"draft_tp_mismatch_ms": 1.5},
        ),
        "unseen-tree-cliff": _perturb(
            tree, timing={"tree_cliff_width": 32, "tree_cliff_factor": 0.25}
        ),
        "unseen-noisy-tp8": _perturb(
            high,
            draft={"allreduce_ms": {"1": 0.0, "2": 0.1, "4": 0.15, "8": 0.2}},
            timing={"draft_tp_mismatch_ms": 0.9},
            noise={"launch_cv_by_draft_tp": {"1": 0.01, "8": 0.04}},
        ),
    }


def blind_landscapes() -> dict[str, Profile]:
    """Five landscapes of shapes none of the sets above has, each a plausible 8-GPU SGLang
    EAGLE deployment (``--landscapes blind`` in bench_answer; ``python -m
    tests.perf.search_play --truth blind`` prints their optima). The spaces search draft TP
    1 and 8 only, so a draft TP 2 or 4 optimum cannot be posed:

    - ``blind-edge-steps``: a draft that agrees very often and keeps agreeing (acceptance
      0.93, × 0.99 per position: accept length 6.8 at 10 steps, as EAGLE-3 reports on code)
      and a cheap one-layer draft step (0.3 ms): the optimum sits on the space's edge, 10
      steps (9 steps −1.8 % on the small space, −1.2 % on the large);
    - ``blind-edge-tokens``: acceptance flat over depth (decay 1) with siblings that catch
      half the misses and dear branches (0.3 ms): on the large space the optimum is the edge
      of draft tokens (8 steps, topk 2, 16 tokens; 15 tokens −0.6 %); on the small space the
      chains are a wide plateau (6-10 steps within 1.7 %);
    - ``blind-mtp-one``: a draft trained for one position (a DeepSeek-style multi-token
      prediction module, second-token acceptance ~0.88) reused for later ones, where it
      accepts 0.15 times as often (``acceptance.horizon`` = 1; accept length 1.88 at 1
      step, 1.97 at 2): the optimum is the space's lower edge, 1 step (2 steps −0.7 % on
      the small space; on the large, 1 step at draft TP 8 −1.7 %, 2 steps −2.0 %);
    - ``blind-tree-crash``: ``tree`` whose topk-4 trees crash at the first request
      (``crash_after_requests``: an illegal memory access in the tree kernel, as in
      sgl-project/sglang#6309), at every draft TP: the server starts and is ready, then dies
      serving — a failure the tool cannot tell from a transient one (half the large
      space). The unconstrained optimum (3 steps, topk 4, 13 tokens) is out; the answer is
      2 steps, topk 2, 5 tokens at draft TP 8 (draft TP 1 −0.4 %, 3 steps −1 %); the small
      space (chains) keeps ``tree``'s 2-step chain;
    - ``blind-tp8-nccl``: ``synthetic-tp8-wins`` (draft TP 8 best by 10 %) on a host where
      the draft's own 8-GPU communicator fails NCCL initialisation (``nccl_init`` on every
      draft-TP-8 launch): only draft TP 1 (and no speculation) can answer, 3 steps (4
      steps −0.8 % on the small space, −1.7 % on the large).
    """
    high, tree, default = (
        load_profile("high-acceptance"),
        load_profile("tree"),
        load_profile("default"),
    )
    crash = FailureRule(
        "crash_after_requests", match={"speculative_eagle_topk": 4}, after_requests=1
    )
    no_tp8 = FailureRule("nccl_init", match={"speculative_draft_tp_size": 8})
    return {
        "blind-edge-steps": _perturb(
            high,
            acceptance={"first": 0.93, "decay": 0.99},
            draft={
                "compute_ms": 0.3,
                "allreduce_ms": {"1": 0.0, "2": 0.15, "4": 0.2, "8": 0.25},
                "topk_ms": 0.3,
            },
            timing={"spec_overhead_ms": 1.2, "token_ms": 0.12},
        ),
        "blind-edge-tokens": _perturb(
            default,
            acceptance={"first": 0.8, "decay": 1.0, "sibling_gain": 0.5},
            draft={"topk_ms": 0.3, "compute_ms": 0.5},
            timing={"spec_overhead_ms": 2.0},
        ),
        "blind-mtp-one": _perturb(
            default, acceptance={"first": 0.88, "horizon": 1, "horizon_factor": 0.15}
        ),
        "blind-tree-crash": tree.replace(failures=(crash,)),
        "blind-tp8-nccl": landscapes()["synthetic-tp8-wins"].replace(failures=(no_tp8,)),
    }


def midtp_landscapes() -> dict[str, Profile]:
    """Three landscapes whose fastest draft TP is a middle one (``--landscapes midtp`` in
    bench_answer, on its own spaces that search draft TP 1, 2, 4 and 8; ``python -m
    tests.perf.search_play --truth midtp`` prints their optima): a draft large enough for
    its compute to shard over its TP ranks (``draft.compute_split``), so each step gets
    cheaper at a larger draft TP while its all-reduce gets dearer:

    - ``midtp-tp2``: ``default`` with a 3 ms draft step, 90 % of it sharded, and a cheap
      2-GPU all-reduce (0.5 ms; 1.3 at 4, 2.1 at 8): draft TP 2 at 2 steps, draft TP 4
      −1.3 %, draft TP 8 −4.3 %;
    - ``midtp-tp4``: ``high-acceptance`` with a 4 ms draft step, 95 % sharded (all-reduce
      0.9 / 1.1 / 2.0 ms at 2 / 4 / 8): draft TP 4 at 5 steps (4 steps −0.25 %), draft TP 8
      −6 %;
    - ``midtp-growth``: the same kind (3 ms, 90 %; 0.4 / 0.6 / 1.0 ms) whose all-reduce grows
      20 % per step: draft TP 4 at 5 steps, draft TP 8 at 4 steps −2.2 %.

    On the large spaces the profiles' ``NCCL_PROTO=LL`` rule (every all-reduce several
    times cheaper) moves each optimum to draft TP 8 with it: the search must find that the
    flag changes the best draft TP.
    """
    high, default = load_profile("high-acceptance"), load_profile("default")

    def sharded(
        profile: Profile, ms: float, split: float, ar: tuple[float, ...], **more: float
    ) -> Profile:
        allreduce = dict(zip(("1", "2", "4", "8"), (0.0, *ar), strict=True))
        draft = {"compute_ms": ms, "compute_split": split, "allreduce_ms": allreduce, **more}
        return _perturb(profile, draft=draft)

    return {
        "midtp-tp2": sharded(default, 3.0, 0.9, (0.5, 1.3, 2.1)),
        "midtp-tp4": sharded(high, 4.0, 0.95, (0.9, 1.1, 2.0)),
        "midtp-growth": sharded(high, 3.0, 0.9, (0.4, 0.6, 1.0), allreduce_growth=0.2),
    }


def topk8_landscapes() -> dict[str, Profile]:
    """The shipped profiles on SGLang's own tree range (``--landscapes topk8`` in
    bench_answer, on its own space: 1-5 steps, topk 1, 2, 4 and 8, 2-32 draft tokens, draft
    TP 8; ``python -m tests.perf.search_play --truth topk8`` prints their optima without
    the memory cliff, bench_answer's truth counts what runs out as 0). The
    simulator's memory plan runs wide topk-8 trees out of memory (on ``tree`` from about 28
    draft tokens), below the model's favourites, so the search meets a memory cliff between
    them and the optimum (``topk8-tree``: topk 8, 3 steps, 24 draft tokens; topk 4 −4.2 %):
    ``topk8-default``, ``topk8-high-acceptance`` and ``topk8-tree``."""
    return {f"topk8-{name}": load_profile(name) for name in ("default", "high-acceptance", "tree")}


@dataclass(frozen=True)
class LaunchFault:
    """A launch failure of a fault landscape (:func:`fault_landscapes`) that a profile's
    ``[[failure]]`` rules cannot express: a region by an ordinal bound, a share of launches
    only (seeded by the run), or a stretch of server starts whatever the configuration.

    ``args`` (:func:`fault_args`) are the resolved arguments of a launch and its
    environment; a launch is in the region when every ``match`` key equals its value and
    every ``at_least`` value is reached (a key the launch lacks — no speculation has no
    ``speculative_*`` argument — is not in the region, so only an environment ``match`` fails
    no speculation too)."""

    kind: str  # a failure kind of sweep.failures, as the loop receives it
    message: str  # the server log's line the loop would read
    match: Mapping[str, object] = field(default_factory=dict)
    at_least: Mapping[str, int] = field(default_factory=dict)
    share: float = 1.0  # the share of the region's launches that fail (1: every one)
    starts: tuple[int, int] | None = None  # server starts first..last (1-based): all fail

    def region(self, args: Mapping[str, object]) -> bool:
        """Whether a launch with ``args`` is in the failing region (a stretch has none)."""
        if self.starts is not None:
            return False
        if any(args.get(key) != value for key, value in self.match.items()):
            return False
        return all(
            isinstance(got := args.get(key), int) and got >= low
            for key, low in self.at_least.items()
        )

    def fails(self, args: Mapping[str, object], start: int, draw: Callable[[], float]) -> bool:
        """Whether server start number ``start`` (1-based) of a launch with ``args`` fails;
        ``draw`` gives the run's next uniform number (drawn only for a flaky region)."""
        if self.starts is not None:
            return self.starts[0] <= start <= self.starts[1]
        return self.region(args) and (self.share >= 1.0 or draw() < self.share)


def fault_args(config: SimConfig, env: Mapping[str, str]) -> dict[str, object]:
    """The resolved arguments of a launch (none of speculation's for no speculation) and its
    environment, as :class:`LaunchFault` matches them."""
    args: dict[str, object] = {"tp_size": config.tp_size, **env}
    if config.speculative:
        args |= {
            "speculative_num_steps": config.num_steps,
            "speculative_eagle_topk": config.eagle_topk,
            "speculative_num_draft_tokens": config.num_draft_tokens,
            "speculative_draft_tp_size": config.draft_tp_size,
        }
    return args


FAULTS: dict[str, LaunchFault] = {
    "fault-flaky-tp8": LaunchFault(
        "crashed_while_serving",
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE)",
        match={"speculative_draft_tp_size": 8},
        share=0.4,
    ),
    "fault-hang-steps": LaunchFault(
        "startup_timeout",
        "not ready after 900 s (last log line: Capture cuda graph begin)",
        at_least={"speculative_num_steps": 7},
    ),
    "fault-crash-tokens": LaunchFault(
        "crashed_while_serving",
        "CUDA error: an illegal memory access was encountered",
        at_least={"speculative_num_draft_tokens": 8},
    ),
    "fault-rejected-env": LaunchFault(
        "rejected_flags",
        "ValueError: NCCL_PROTO=LL is not supported with this NCCL build (exit 1 before loading)",
        match={"NCCL_PROTO": "LL"},
    ),
    "fault-bad-stretch": LaunchFault(
        "nccl_init",
        "NCCL WARN NET/IB : Got async event : port error",
        starts=(8, 15),
    ),
    "fault-flaky-steps": LaunchFault(
        "crashed_while_serving",
        "CUDA error: an illegal memory access was encountered",
        at_least={"speculative_num_steps": 6},
        share=0.35,
    ),
    "fault-host-flaky": LaunchFault(
        "nccl_init",
        "NCCL WARN NET/IB : Got async event : port error",
        share=0.15,
    ),
    "fault-host-crashes": LaunchFault(
        "crashed_while_serving",
        "NVRM: Xid 79, GPU has fallen off the bus",
        share=0.12,
    ),
    "fault-host-unnamed": LaunchFault(
        "crashed_while_serving",
        "RuntimeError: CUDA error: unspecified launch failure",
        share=0.12,
    ),
    "fault-flaky-extra": LaunchFault(
        "crashed_while_serving",
        "[Rank 5] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE)",
        match={"NCCL_PROTO": "LL"},
        share=0.3,
    ),
    "fault-flaky-capture": LaunchFault(
        "startup_timeout",
        "not ready after 900 s (last log line: Capture cuda graph begin)",
        at_least={"speculative_num_steps": 6},
        share=0.35,
    ),
}
"""Each fault landscape's failure (:func:`fault_landscapes`)."""


def fault_landscapes() -> dict[str, Profile]:
    """Eleven landscapes whose launches fail in ways a night meets and the profiles' failure
    rules cannot express (:data:`FAULTS`; ``--landscapes faults`` in bench_answer, which
    injects them; ``python -m tests.perf.search_play --truth faults`` prints the optima
    among the configurations that launch):

    - ``fault-flaky-tp8``: ``synthetic-tp8-wins`` (draft TP 8 best by 10 %) whose draft-TP-8
      launches crash while serving 40 % of the time (an NCCL watchdog timeout in the draft's
      all-reduce): a configuration that crashes on 4 launches in 10 is no answer, so the
      optimum is draft TP 1's (3 steps) and a draft-TP-8 winner counts as a flaky one;
    - ``fault-hang-steps``: ``blind-edge-steps`` (the optimum on the edge, 10 steps) whose
      start-up hangs capturing the CUDA graphs from 7 steps on (``startup_timeout``: each
      such launch costs the ready timeout, 900 s): the optimum is 6 steps — an ordinal
      bound the settings rule (topk, draft TP, extras) cannot name;
    - ``fault-crash-tokens``: ``blind-edge-tokens`` (the large optimum at 16 draft tokens)
      whose verify kernel crashes at the first request from 8 draft tokens on (chains of 7
      steps or more): an ordinal bound again, across every topk and draft TP;
    - ``fault-rejected-env``: ``default`` where ``NCCL_PROTO=LL`` (which speeds every
      all-reduce by 4×, the large space's best configurations all use it) is refused at
      start (``rejected_flags``, deterministic), no speculation with it included; the small
      space has no environment and fails nothing;
    - ``fault-bad-stretch``: ``high-acceptance`` on a host whose InfiniBand port flaps for a
      while: server starts 8 to 15 fail NCCL initialisation whatever they launch (no
      speculation included), then the host recovers; the optimum is unchanged;
    - ``fault-flaky-steps``: ``high-acceptance`` (the optimum at 6-7 steps) whose
      configurations of 6 steps or more crash while serving on 35 % of their launches (CUDA
      graphs that race): a range no topk, draft TP or extra names; the optimum is 5 steps;
    - ``fault-host-flaky``: ``default`` on a host where 15 % of all server starts fail NCCL
      initialisation, whatever they launch: the host's, no configuration's; the optimum is
      unchanged;
    - ``fault-host-crashes``: ``high-acceptance`` on a host where 12 % of all launches crash
      while serving (a GPU that falls off the bus now and then, the driver's Xid 79 in the
      log: sweep stores ``gpu_fault``, the host's): crashes that fall on a setting by chance
      must not make it look unreliable; the optimum is unchanged;
    - ``fault-host-unnamed``: the same host, but its crashes name no hardware fault (``CUDA
      error: unspecified launch failure``, what a kernel of a setting could log too): only the
      crash counts can tell the host from a setting;
    - ``fault-flaky-extra``: ``default`` where ``NCCL_PROTO=LL`` crashes while serving on 30 %
      of its launches, no speculation with it too (an all-reduce protocol that races): the
      optimum is the best configuration without it (the small space has no environment);
    - ``fault-flaky-capture``: ``high-acceptance`` whose CUDA-graph capture hangs at
      start-up on 35 % of the launches of 6 steps or more (``startup_timeout``, 900 s each):
      a server that fails to start one time in three is no answer; the optimum is 5 steps.
    """
    every = blind_landscapes() | landscapes()
    return {
        "fault-flaky-tp8": every["synthetic-tp8-wins"],
        "fault-hang-steps": every["blind-edge-steps"],
        "fault-crash-tokens": every["blind-edge-tokens"],
        "fault-rejected-env": load_profile("default"),
        "fault-bad-stretch": load_profile("high-acceptance"),
        "fault-flaky-steps": load_profile("high-acceptance"),
        "fault-host-flaky": load_profile("default"),
        "fault-host-crashes": load_profile("high-acceptance"),
        "fault-host-unnamed": load_profile("high-acceptance"),
        "fault-flaky-extra": load_profile("default"),
        "fault-flaky-capture": load_profile("high-acceptance"),
    }


LAUNCH_FAILURES = {  # a profile's failure rules that fail a launch, and the loop's kind for it
    "crash_after_requests": "crashed_while_serving",
    "nccl_init": "nccl_init",
    "oom_capture": "oom",
}


def injected_failure(profile: Profile, config: SimConfig) -> str | None:
    """The failure kind (:mod:`sweep.failures`) of the first ``[[failure]]`` rule of the
    profile that fails a launch of ``config`` as the simulated server would (matched on its
    resolved arguments), or None."""
    if not config.speculative:
        return None
    resolved = {
        "tp_size": config.tp_size,
        "speculative_num_steps": config.num_steps,
        "speculative_eagle_topk": config.eagle_topk,
        "speculative_num_draft_tokens": config.num_draft_tokens,
        "speculative_draft_tp_size": config.draft_tp_size,
    }
    kinds = (LAUNCH_FAILURES.get(r.kind) for r in model.matching_failures(profile, resolved))
    return next((kind for kind in kinds if kind), None)


def truth_lines(name: str, profile: Profile, space: Space, top: int = 2) -> list[str]:
    """The ``top`` best configurations of ``space`` on a landscape, noise-free, each with
    its ratio to the optimum, and how many are within 1 % of it (configurations whose
    launch the profile fails, :func:`injected_failure`, or whose region a fault landscape
    fails, :data:`FAULTS`, left out)."""
    fault = FAULTS.get(name)
    launching = [
        c
        for c in valid_candidates(space.study)
        if not injected_failure(profile, _sim(c))
        and not (fault and fault.region(fault_args(_sim(c), _env(c))))
    ]
    values = sorted(((truth(profile, c)[0], c.key) for c in launching), reverse=True)
    best = values[0][0]
    lines = [
        f"{space.name:5s} {name:24s} #{i + 1} {key:28s} {value:7.2f} tok/s ({value / best:.4f})"
        for i, (value, key) in enumerate(values[:top])
    ]
    within = sum(v >= 0.99 * best for v, _ in values)
    return [*lines, f"{space.name:5s} {name:24s} {within} of {len(values)} within 1 %"]


RANDOM_MISFIT = 30  # --landscapes random: this many random landscapes with random misfit shapes


def random_misfit_landscapes(n: int = RANDOM_MISFIT) -> dict[str, Profile]:
    """``n`` landscapes of random constants (:func:`random_landscape`), each with misfit
    shapes switched on at random: draft-TP communication growing with steps (half of them),
    a verify cliff at 4-9 draft tokens (40 %), acceptance falling past 2-6 steps (40 %), a
    memory cliff past a CUDA-graph width of 7-30 (30 %; drawn last, so the other draws are
    those of the landscapes without it)."""
    out = {}
    for i in range(n):
        rng = np.random.default_rng(9000 + i)
        sections: dict[str, dict[str, object]] = {}
        if rng.random() < 0.5:
            sections["draft"] = {"allreduce_growth": float(rng.uniform(0.3, 1.5))}
        if rng.random() < 0.4:
            sections["timing"] = {
                "verify_cliff_tokens": int(rng.integers(4, 10)),
                "verify_cliff_factor": float(rng.uniform(0.08, 0.3)),
            }
        if rng.random() < 0.4:
            sections["acceptance"] = {
                "fall_after": int(rng.integers(2, 7)),
                "fall_per_step": float(rng.uniform(0.02, 0.08)),
            }
        if rng.random() < 0.3:  # graphs of 48 batch slots × width in a 12.1 GB budget
            sections["memory"] = {"graph_gb_per_token": 12.1 / 48 / float(rng.uniform(7, 30))}
        out[f"heldout-random-{i:02d}"] = _perturb(random_landscape(i), **sections)
    return out


COMBO = 40  # --landscapes combo: this many random landscapes combining every shape knob


def combo_landscapes(n: int = COMBO, offset: int = 0) -> dict[str, Profile]:
    """``n`` landscapes of random constants (:func:`random_landscape`) with, each drawn
    independently, every shape the simulator has: draft-TP communication growing with steps
    (35 %), a verify cliff at 4-12 draft tokens (30 %), acceptance falling past 2-6 steps
    (30 %), a tree cliff at a width of 8-40 (25 %), an acceptance horizon (25 %), a sharded
    draft 2-4 times as costly (30 %), a draft cliff from 3-7 steps at draft TP 1 or 8 (20 %),
    launch noise of 3-4.5 % at draft TP 1 or 8 (30 %), a memory cliff (20 %), a host ceiling
    10-40 % above no speculation (20 %). ``offset`` draws another set (named from it)."""
    return {f"combo-{offset + i:03d}": _combo(offset + i) for i in range(n)}


def _combo(i: int) -> Profile:
    rng = np.random.default_rng(12000 + i)
    base = random_landscape(700 + i)

    def u(low: float, high: float) -> float:
        return float(rng.uniform(low, high))

    s: dict[str, dict[str, object]] = {
        k: {} for k in ("draft", "timing", "acceptance", "noise", "memory")
    }
    if rng.random() < 0.35:
        s["draft"]["allreduce_growth"] = u(0.2, 1.5)
    if rng.random() < 0.3:
        s["timing"]["verify_cliff_tokens"] = int(rng.integers(4, 13))
        s["timing"]["verify_cliff_factor"] = u(0.08, 0.3)
    if rng.random() < 0.3:
        s["acceptance"]["fall_after"] = int(rng.integers(2, 7))
        s["acceptance"]["fall_per_step"] = u(0.02, 0.08)
    if rng.random() < 0.25:
        s["timing"]["tree_cliff_width"] = int(rng.integers(8, 41))
        s["timing"]["tree_cliff_factor"] = u(0.1, 0.3)
    if rng.random() < 0.25:
        s["acceptance"]["horizon"] = int(rng.integers(2, 6))
        s["acceptance"]["horizon_factor"] = u(0.3, 0.7)
    if rng.random() < 0.3:
        s["draft"]["compute_ms"] = base.draft.compute_ms * u(2, 4)
        s["draft"]["compute_split"] = u(0.8, 0.95)
    if rng.random() < 0.2:
        s["draft"]["cliff_steps"] = {str(int(rng.choice([1, 8]))): int(rng.integers(3, 8))}
        s["draft"]["cliff_factor"] = u(0.2, 0.5)
    if rng.random() < 0.3:
        s["noise"]["launch_cv_by_draft_tp"] = {str(int(rng.choice([1, 8]))): u(0.03, 0.045)}
    if rng.random() < 0.2:  # graphs of 48 batch slots × width in a 12.1 GB budget
        s["memory"]["graph_gb_per_token"] = 12.1 / 48 / u(7, 30)
    if rng.random() < 0.2:
        baseline = model.predict(base, SimConfig(), 1).decode_tok_s
        s["timing"]["min_token_ms"] = 1000.0 / (baseline * u(1.1, 1.4))
    return _perturb(base, **{k: v for k, v in s.items() if v})


def random_landscape(seed: int) -> Profile:
    """A landscape of the same physics with every constant drawn at random (for seed)."""
    rng = np.random.default_rng(5000 + seed)

    def u(low: float, high: float) -> float:
        return float(rng.uniform(low, high))

    tp8 = u(0.2, 3.0)
    return _perturb(
        load_profile("default"),
        acceptance={"first": u(0.4, 0.92), "decay": u(0.7, 0.98), "sibling_gain": u(0.05, 0.4)},
        draft={
            "compute_ms": u(0.3, 1.5),
            "allreduce_ms": {"1": 0.0, "2": tp8 * 0.45, "4": tp8 * 0.7, "8": tp8},
            "topk_ms": u(0.1, 0.5),
        },
        timing={
            "base_ms": u(5.0, 10.0),
            "spec_overhead_ms": u(1.0, 4.0),
            "draft_tp_mismatch_ms": u(0.1, 2.0),
            "token_ms": u(0.1, 0.6),
        },
    )


def _perturb(profile: Profile, **sections: dict[str, object]) -> Profile:
    changes = {
        name: dataclasses.replace(getattr(profile, name), **values)
        for name, values in sections.items()
    }
    return dataclasses.replace(profile, **changes)


def truth(profile: Profile, c: Candidate | None) -> tuple[float, float]:
    """Noise-free (decode tok/s, accept length) of a candidate (None: the baseline)."""
    if c is None:
        return model.predict(profile, SimConfig(), 1).decode_tok_s, 1.0
    p = model.predict(profile, _sim(c), 1, env=_env(c))
    return p.decode_tok_s, p.accept_length


def _env(c: Candidate) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in c.extras.split(",")) if c.extras else {}


def _sim(c: Candidate) -> SimConfig:
    return SimConfig("EAGLE3", c.steps, c.topk, c.draft_tokens, c.target_tp, c.draft_tp)


@dataclass
class Run:
    """What one play measured."""

    winner: str = ""
    winner_ratio: float = 0.0  # truth(winner) / truth(optimum)
    search_launches: int = 0
    search_replicates: int = 0  # search launches that relaunched a measured configuration
    confirm_launches: int = 0
    first_within: int | None = None  # search launches until one within 1 % was measured
    prediction_errors: list[float] = field(default_factory=list)
    confident: bool = False
    decision: Decision | None = None


SamplerFactory = Callable[[Sequence[Candidate], int], optuna.samplers.BaseSampler]


def physics_sampler(candidates: Sequence[Candidate], seed: int) -> optuna.samplers.BaseSampler:
    return PhysicsSampler(candidates, seed=seed)


def random_sampler(candidates: Sequence[Candidate], seed: int) -> optuna.samplers.BaseSampler:
    return ValidRandomSampler(candidates, seed=seed)


def tpe_sampler(candidates: Sequence[Candidate], seed: int) -> optuna.samplers.BaseSampler:
    """What ``sampler = "tpe"`` builds (sweep.search.samplers.sampler_for)."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


SAMPLERS: dict[str, SamplerFactory] = {
    "physics": physics_sampler,
    "tpe": tpe_sampler,
    "random-valid": random_sampler,
}


class Player:
    """One play of a space on a landscape with one seed."""

    def __init__(self, space: Space, profile: Profile, seed: int,
                 options: ConfirmOptions, sampler: SamplerFactory,
                 record_accept_length: bool = True, stop_early: bool = False) -> None:  # fmt: skip
        self.space, self.profile, self.options = space, profile, options
        self.candidates = valid_candidates(space.study)
        self.keyed = by_key(self.candidates)
        self.truths = {c.key: truth(profile, c) for c in self.candidates}
        self.best = max(v for v, _ in self.truths.values())
        self.truths[BASELINE] = truth(profile, None)  # no speculation competes for the answer
        self.rng = np.random.default_rng(1000 + seed)
        self.rules = rules_for(space.study)
        self.sampler = sampler(self.candidates, seed)
        self.study = optuna.create_study(direction="maximize", sampler=self.sampler)
        self.record_accept_length = record_accept_length
        self.baselines: list[Launch] = []
        self.measured: dict[str, float] = {}  # first value of each launched configuration
        self.replicated: set[str] = set()
        self.run = Run()
        self.matcher = Matcher(self.candidates)
        self.simplicity = {k: c.simplicity() for k, c in self.keyed.items()}
        self.stop_early = stop_early

    def measure(self, true_value: float, accept: float) -> tuple[float, float, float]:
        launch = 1 + self.rng.normal(0, LAUNCH_SD)
        within = 1 + self.rng.normal(0, WITHIN_SD)
        value = true_value * launch * within
        return value, WITHIN_SD * value, accept * (1 + self.rng.normal(0, ACCEPT_SD))

    def launch(self, trial: optuna.trial.Trial, key: str, kind: str) -> None:
        """Measure ``key`` on ``trial`` and tell Optuna, as the loop does."""
        true_value, accept = self.truths[key]
        value, stderr, measured_accept = self.measure(true_value, accept)
        trial.set_user_attr(KIND_ATTR, kind)
        trial.set_user_attr("sweep.key", key)
        trial.set_user_attr(STDERR_ATTR, stderr)
        if self.record_accept_length:
            trial.set_user_attr(ACCEPT_LENGTH_ATTR, measured_accept)
        trial.set_constraint(FEASIBLE, 0.0)
        self.study.tell(trial, value)
        predicted = self.system_attrs(trial).get(PREDICTED_ATTR)
        if isinstance(predicted, dict) and key not in self.measured:  # predicted before it
            self.run.prediction_errors.append(abs(float(predicted["mean"]) - value) / value)
        self.measured.setdefault(key, value)

    def system_attrs(self, trial: optuna.trial.Trial) -> dict[str, object]:
        return dict(self.study._storage.get_trial_system_attrs(trial._trial_id))

    def propose(self) -> str | None:
        """One search proposal, as the loop handles it: an invalid configuration is told
        excluded, an already measured one is answered from storage unless the sampler asks
        for a deliberate relaunch; anything else is launched. Returns the launched key."""
        trial = self.study.ask()
        config = suggest(trial, self.space.study)
        if self.rules.violation(config):
            trial.set_user_attr(KIND_ATTR, "excluded")
            trial.set_constraint(FEASIBLE, 1.0)
            self.study.tell(trial, 0.0)
            return None
        key = self.rules.resolve(config).key()
        if key in self.measured and not self.system_attrs(trial).get(REPLICATE_ATTR):
            trial.set_user_attr(KIND_ATTR, "duplicate")
            trial.set_constraint(FEASIBLE, 0.0)
            self.study.tell(trial, self.measured[key])
            return None
        if key in self.measured:
            self.replicated.add(key)
        self.launch(trial, key, "trial")
        return key

    def baseline(self) -> None:
        value, stderr, _ = self.measure(self.truths[BASELINE][0], 1.0)
        self.baselines.append(Launch(value, stderr))

    def play(self) -> Run:
        confirm_budget = self.options.confirmation_budget(self.space.budget)
        search = self.space.budget - confirm_budget
        self.baseline()
        idle = 0
        while self.run.search_launches < search:
            if idle >= MAX_IDLE_PROPOSALS:  # the loop queues an unmeasured one itself
                todo = [c for c in self.candidates if c.key not in self.measured]
                pick = todo[int(self.rng.integers(len(todo)))]
                self.study.enqueue_trial(dict(pick.params))
                idle = 0
            key = self.propose()
            if key is None:
                idle += 1
                continue
            idle = 0
            self.run.search_launches += 1
            self.run.search_replicates += key in self.replicated
            if self.run.search_launches % BASELINE_EVERY == 0:
                self.baseline()
            if self.run.first_within is None and self.truths[key][0] >= 0.99 * self.best:
                self.run.first_within = self.run.search_launches
            if self.stop_early and self.confirmed():
                break
        self.confirm(confirm_budget)
        return self.run

    def decision(self, remaining: int) -> Relaunch | Decision:
        """What the loop asks ``decide`` after each confirmation round."""
        history = history_of(self.study.get_trials(deepcopy=False), self.matcher)
        launches: dict[str, list[Launch]] = {
            k: [Launch(m.value, m.stderr) for m in v] for k, v in history.measured.items()
        }
        launches[BASELINE] = list(self.baselines)
        prior = None
        if isinstance(self.sampler, PhysicsSampler):
            prior = self.sampler.holdout_predictions(self.study)
        return decide(launches, launch_variance(launches.values()), self.options,
                      remaining=remaining, baseline=BASELINE, excluded=history.violating,
                      simplicity=self.simplicity.__getitem__, prior=prior)  # fmt: skip

    def confirmed(self) -> bool:
        """Stop searching early: nothing untried can win and the winner is already clear."""
        if not isinstance(self.sampler, PhysicsSampler) or not self.sampler.exhausted(self.study):
            return False
        result = self.decision(0)
        return isinstance(result, Decision) and result.confident

    def confirm(self, remaining: int) -> None:
        while True:
            result = self.decision(remaining)
            if isinstance(result, Decision):
                break
            for key in result.order:
                if key == BASELINE:
                    self.baseline()
                else:
                    self.study.enqueue_trial(dict(self.keyed[key].params))
                    trial = self.study.ask()
                    resolved = self.rules.resolve(suggest(trial, self.space.study)).key()
                    self.launch(trial, resolved, "replicate")
                remaining -= 1
                self.run.confirm_launches += 1
        self.run.decision = result
        self.run.winner = result.winner
        optimum = max(self.best, self.truths[BASELINE][0])  # no speculation may be best
        self.run.winner_ratio = self.truths[result.winner][0] / optimum
        self.run.confident = result.confident


def play(
    space: Space,
    profile: Profile,
    seed: int,
    options: ConfirmOptions = DEFAULT_OPTIONS,
    sampler: SamplerFactory = physics_sampler,
    record_accept_length: bool = True,
    stop_early: bool = False,
) -> Run:
    return Player(space, profile, seed, options, sampler, record_accept_length, stop_early).play()


@dataclass(frozen=True)
class Summary:
    within_rate: float
    confirm_pct: float
    fraction_median: float
    fraction_worst: float
    prediction_error_pct: float
    worst_ratio: float
    confident_rate: float
    launches_median: float  # search + confirmation launches (baselines of the schedule aside)


def summarise(runs: Sequence[Run], n_valid: int) -> Summary:
    fractions = [(r.first_within or n_valid + 1) / n_valid for r in runs]
    errors = [e for r in runs for e in r.prediction_errors]
    return Summary(
        sum(r.winner_ratio >= 0.99 for r in runs) / len(runs),
        100 * sum(r.confirm_launches for r in runs) / sum(r.search_launches for r in runs),
        statistics.median(fractions),
        max(fractions),
        100 * statistics.median(errors) if errors else math.nan,
        min(r.winner_ratio for r in runs),
        sum(r.confident for r in runs) / len(runs),
        statistics.median(r.search_launches + r.confirm_launches for r in runs),
    )


def main() -> None:
    """Quick iteration: python -m tests.perf.search_play --seeds 3 --sampler tpe ..."""
    import argparse
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--landscapes", default="")
    parser.add_argument("--spaces", default="")
    parser.add_argument("--sampler", default="physics", choices=sorted(SAMPLERS))
    parser.add_argument("--no-accept-length", action="store_true")
    parser.add_argument("--stop-early", action="store_true")
    parser.add_argument("--random", type=int, default=0, help="random landscapes instead")
    parser.add_argument(
        "--truth",
        default="",
        help="print optima: heldout, misfit, unseen, blind, faults, midtp, topk8 or names",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    chosen = landscapes() | misfit_landscapes()
    if args.truth:
        _print_truths(args.truth, args.spaces)
        return
    if args.random:
        chosen = {f"random-{i}": random_landscape(i) for i in range(args.random)}
    for space in spaces():
        if args.spaces and space.name not in args.spaces.split(","):
            continue
        runs_all = []
        for name, profile in chosen.items():
            if args.landscapes and name not in args.landscapes.split(","):
                continue
            started = time.monotonic()
            runs = [
                play(space, profile, seed, sampler=SAMPLERS[args.sampler],
                     record_accept_length=not args.no_accept_length,
                     stop_early=args.stop_early)
                for seed in range(1 if args.random else args.seeds)
            ]  # fmt: skip
            runs_all += runs
            if not args.random:
                _print(space, name, runs, time.monotonic() - started)
        if args.random:
            _print(space, f"{args.random} random landscapes", runs_all, 0.0)


def _print_truths(which: str, space_names: str) -> None:
    every = landscapes() | misfit_landscapes() | heldout_landscapes() | random_misfit_landscapes()
    every |= unseen_landscapes() | blind_landscapes() | fault_landscapes() | midtp_landscapes()
    every |= topk8_landscapes()
    sets = {
        "heldout": heldout_landscapes(),
        "misfit": misfit_landscapes(),
        "unseen": unseen_landscapes(),
        "blind": blind_landscapes(),
        "faults": fault_landscapes(),
        "midtp": midtp_landscapes(),
        "topk8": topk8_landscapes(),
    }
    chosen = sets.get(which) or {n: every[n] for n in which.split(",")}
    own = {"midtp": midtp_spaces(), "topk8": topk8_spaces()}
    for space in own.get(which, spaces()):
        if not space_names or space.name in space_names.split(","):
            for name, profile in chosen.items():
                print("\n".join(truth_lines(name, profile, space, top=4)), flush=True)


def _print(space: Space, name: str, runs: Sequence[Run], seconds: float) -> None:
    s = summarise(runs, len(valid_candidates(space.study)))
    print(
        f"{space.name:5s} {name:24s} within {s.within_rate:.2f} "
        f"confirm {s.confirm_pct:4.1f}% frac med {s.fraction_median:.3f} "
        f"worst {s.fraction_worst:.3f} pred {s.prediction_error_pct:.2f}% "
        f"worst ratio {s.worst_ratio:.4f} confident {s.confident_rate:.2f} "
        f"launches {s.launches_median:.0f} ({seconds:.1f}s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
