"""`sweep plan`'s confirmation and limits lines: what the confirmation may add, in launches and
hours, and what ends the run."""

from __future__ import annotations

from pathlib import Path

from sweep.commands.plan import PlanReport
from sweep.commands.plan_time import confirmation_plan, limits_plan
from sweep.core.space import TrialConfig
from sweep.study import load_study
from sweep.study.model import Study
from tests.support.studies import write_study

ENV = (("NCCL_PROTO", "LL"),)


def report(
    configs: list[TrialConfig], per_trial_s: float = 600.0, *, guessed: bool = True
) -> PlanReport:
    return PlanReport(tuple(configs), (), (), per_trial_s, "a guess", guessed=guessed)


def test_the_plan_counts_the_share_the_extension_and_the_winner_s_control(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, confirm=True))
    plain = [TrialConfig(s, 1, s + 1, 8) for s in (1, 2, 3)]
    # 4 planned launches: the floor (5) relaunches, up to 4 more; 9 launches of 600 s
    text = confirmation_plan(study, report(plain))
    assert text.startswith("then confirmation: up to 9 launches (1.5 h) — 5 relaunching")
    assert "control" not in text and "ties go to the simplest" in text
    flagged = [*plain, TrialConfig(2, 1, 3, 8, env=ENV)]
    text = confirmation_plan(study, report(flagged))
    assert text.startswith("then confirmation: up to 10 launches (1.7 h)")
    assert "then one of no speculation with the winner's searched flags (its control)" in text
    # under an hour in minutes, not "0.0 h" (the demo's 12-s trials)
    quick = confirmation_plan(study, report(plain, per_trial_s=12.0))
    assert quick.startswith("then confirmation: up to 9 launches (2 min) —")


def test_the_plan_says_when_the_confirmation_is_off(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path))  # the test studies turn it off
    text = confirmation_plan(study, report([TrialConfig(1, 1, 2, 8)]))
    assert text == "confirmation: off (the winner is the best single measurement)"


def test_the_plan_says_what_ends_the_run_and_when_the_budget_cannot_launch_every_configuration(
    tmp_path: Path,
) -> None:
    plain = [TrialConfig(s, 1, s + 1, 8) for s in (1, 2, 3)]
    # 15 min at a guessed 600 s: 1 launch, the baseline alone
    short = load_study(write_study(tmp_path, study='budget = "15m"', confirm=True))
    text = limits_plan(short, report(plain))
    assert text == (
        "limits: a budget of 15 min (about 1 launch at a guessed 600 s each); 20% of the time "
        "is kept for the confirmation; the budget fits only the baseline: the run would measure "
        "no configuration (raise the budget)"
    )
    tiny = load_study(write_study(tmp_path, name="s", study='budget = "30s"'))
    assert "the budget fits no launch: the run would measure no configuration" in limits_plan(
        tiny, report(plain)
    )
    # 25 min: 2 launches, fewer than 3 configurations and a baseline
    some = load_study(write_study(tmp_path, name="m", study='budget = "25m"', confirm=True))
    assert limits_plan(some, report(plain)).endswith(
        "; fewer launches than the 3 configurations and a baseline: the search chooses which "
        "to launch"
    )
    # measured launches of 12 s: 75 fit, nothing to warn about
    assert limits_plan(short, report(plain, 12.0, guessed=False)) == (
        "limits: a budget of 15 min (about 75 launches at 12 s each); 20% of the time is kept "
        "for the confirmation"
    )
    both = load_study(write_study(tmp_path, name="b", study='n_trials = 5\ndeadline = "07:00"'))
    assert limits_plan(both, report(plain)) == (
        "limits: 5 trials, or the deadline 07:00, whichever comes first"
    )
    none = load_study(write_study(tmp_path, name="n"))
    assert limits_plan(none, report(plain)).startswith("limits: none set; the run ends when")


def test_the_plan_warns_of_what_would_fail_every_launch_that_nothing_here_could_check(
    tmp_path: Path,
) -> None:
    """SGLang's parser has no choices for the algorithm (an unknown one fails each launch at
    argument resolution), and where its parser cannot be run a flag outside sweep's list
    goes unchecked: `sweep plan` says both, and nothing for a known flag or algorithm."""
    from sweep.commands.plan import plan_report

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = load_study(
        write_study(tmp_path / "a", engine='[engine.flags]\n"--mem-fraction-static" = 0.8')
    )
    assert plan_report(plain, gate=True).warnings == ()
    odd = load_study(
        write_study(
            tmp_path / "b",
            engine='algorithm = "EAGLE9"',
            space='num_steps = [1, 2]\n[space.flags]\n"--no-such-flag" = [1, 2]',
        )
    )
    warnings = plan_report(odd, gate=True).warnings
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("[engine] algorithm 'EAGLE9' is not one of SGLang's built-in")
    assert "every launch will fail" in warnings[0]
    assert warnings[1].startswith("--no-such-flag: not in sweep's list for SGLang")
    assert "parser could not be run here" in warnings[1]


def test_the_plan_says_what_each_round_sends_and_warns_of_thin_categories(tmp_path: Path) -> None:
    """With workload axes `sweep plan` shows each category's share and prompts, the context
    and concurrency levels; a category with fewer distinct prompts than prompts_per_category
    (its intervals rest on them) or with weight 0 is warned of."""
    from sweep.commands.plan_workload import workload_plan

    (tmp_path / "one.jsonl").write_text('{"prompt": "Only this."}\n')
    (tmp_path / "dups.jsonl").write_text('{"prompt": "Again."}\n' * 6)
    workload = (
        "output_len = 48\nconcurrency = [1, 4]\ninput_len = [64, 256]\nprompts_per_category = 2\n"
        "[workload.categories]\n"
        'code = { prompts = "code", weight = 0.5 }\n'
        'one = { prompts = "one.jsonl", weight = 0.5 }\n'
        'dups = { prompts = "dups.jsonl", weight = 0 }\n'
    )
    line, warnings = workload_plan(load_study(write_study(tmp_path, workload=workload)))
    assert line.startswith("workload: code 50% (")
    assert "one 50% (1 prompts)" in line and "dups 0% (6 prompts, 1 distinct)" in line
    assert "contexts 64/256 words (50%/50%); concurrency 1, 4; 48 output tokens" in line
    assert warnings == (
        "[workload.categories] 'one' has 1 distinct prompt, fewer than prompts_per_category = 2: "
        "its accept-length and speed intervals rest on 1; give it at least 2",
        "[workload.categories] 'dups' has 1 distinct prompt, fewer than prompts_per_category = 2: "
        "its accept-length and speed intervals rest on 1; give it at least 2",
        "[workload.categories] 'dups' has weight 0: measured, but not in the objective",
    )
    (tmp_path / "plain").mkdir()
    line, warnings = workload_plan(load_study(write_study(tmp_path / "plain")))
    assert line.startswith("workload: 38 prompts (shipped), each round replays 1 at concurrency 1")
    assert "[workload] prompts_per_round = 8 measures more of them" in line and warnings == ()


def test_prompts_per_round_widens_what_a_low_concurrency_round_replays(tmp_path: Path) -> None:
    """At concurrency 1 slot 0 replays prompt 0: a round is one prompt, and the answer
    describes its content. `[workload] prompts_per_round` makes every round hold at least that
    many distinct prompts (the slots cycle through them), and is part of the fingerprint
    only when set (an older study's is unchanged)."""
    from sweep.commands.plan_workload import workload_plan
    from sweep.loop import wiring
    from sweep.study.fingerprint import fingerprint

    workload = "output_len = 48\nconcurrency = [1, 4, 16]\nprompts_per_round = 8"
    study = load_study(write_study(tmp_path, workload=workload))
    built = wiring.workload_for(study)
    assert [built.per_slot(c) for c in (1, 4, 16)] == [8, 2, 1]
    line, _ = workload_plan(study)
    assert "each round replays 8 at concurrency 1, 8 at concurrency 4, 16 at concurrency 16" in line
    assert "prompts_per_round = 8 measures" not in line
    (tmp_path / "old").mkdir()
    old = load_study(
        write_study(tmp_path / "old", workload="output_len = 48\nconcurrency = [1, 4, 16]")
    )
    assert "workload.prompts_per_round" in fingerprint(study, built.prompts)
    assert "workload.prompts_per_round" not in fingerprint(old, built.prompts)


def test_the_plan_warns_of_a_context_level_longer_than_the_server_takes(tmp_path: Path) -> None:
    from sweep.commands.plan_workload import workload_plan

    engine = '[engine.flags]\n"--context-length" = 2048'
    workload = "output_len = 48\ninput_len = [256, 1600, 8192]"
    study = load_study(write_study(tmp_path, engine=engine, workload=workload))
    _, warnings = workload_plan(study)
    assert warnings == (
        "[workload] input_len 1600, 8192 words (about 1.3 tokens a word) plus output_len 48 "
        "exceed --context-length 2048: the server would refuse those requests and the run "
        "would stop at the first",
    )


def test_the_plan_warns_when_one_category_s_file_holds_several(tmp_path: Path) -> None:
    """A Spec-Bench file named as one category's prompts takes all its categories as that
    one: `sweep plan` says so and how to split them."""
    from sweep.commands.plan_workload import workload_plan

    (tmp_path / "question.jsonl").write_text(
        '{"category": "writing", "turns": ["Write a haiku."]}\n'
        '{"category": "math_reasoning", "turns": ["What is 17 times 23?"]}\n'
    )
    workload = (
        "output_len = 48\nprompts_per_category = 1\n[workload.categories]\n"
        'code = { prompts = "question.jsonl" }\nchat = { prompts = "chat" }\n'
    )
    _, warnings = workload_plan(load_study(write_study(tmp_path, workload=workload)))
    assert warnings == (
        "[workload.categories.code.prompts] question.jsonl holds 2 categories (writing, "
        "math_reasoning), all taken as 'code'; to measure them apart, name the file in "
        "[workload] categories_file",
    )


def _fleet(tmp_path: Path, name: str, hosts: int, study: str = "") -> Study:
    tables = "".join(
        f'\n[[hosts]]\nname = "h{i}"\nserver_port = {31000 + i}\n' for i in range(hosts)
    )
    path = write_study(tmp_path, name=name, study=study)
    text = path.read_text().replace(f'[host]\nworkdir = "{tmp_path / "servers"}"\n', "")
    path.write_text(text + tables)
    return load_study(path)


def test_a_fleet_s_estimate_counts_its_hosts_in_parallel_each_with_its_baseline(
    tmp_path: Path,
) -> None:
    """Three hosts share the configurations and each measures its own baseline first: 5
    configurations are 2 launches and a baseline on each (was: 5 launches and a baseline,
    and a budget of 3 launches called too short for more than 2 configurations)."""
    from sweep.commands.plan_time import estimate_text

    plain = [TrialConfig(s, 1, s + 1, 8) for s in (1, 2, 3, 4, 5)]
    study = _fleet(tmp_path, "f", 3, 'budget = "30m"')
    fleet = PlanReport(tuple(plain), (), (), 600.0, "a guess", workers=3)
    assert fleet.total_s == 3 * 600.0
    assert estimate_text(fleet) == (
        "estimated time: 30 min for 5 trials on 3 hosts in parallel, each measuring its own "
        "baseline first (about 3 launches each; a guess)"
    )
    # 30 min of 600 s: 3 launches on each host, 6 trials after the 3 baselines: enough
    assert limits_plan(study, fleet) == (
        "limits: a budget of 30 min (about 3 launches on each of 3 hosts at a guessed 600 s each)"
    )
    short = _fleet(tmp_path, "s", 3, 'budget = "10m"')
    assert limits_plan(short, fleet).endswith(
        "; the budget fits only each host's baseline: the run would measure no "
        "configuration (raise the budget)"
    )
    some = _fleet(tmp_path, "m", 3, 'budget = "20m"')  # 2 launches each: 3 trials of 5
    assert limits_plan(some, fleet).endswith(
        "; fewer launches than the 5 configurations and 3 baselines: the search chooses which "
        "to launch"
    )
    from sweep.commands.plan import plan_report

    assert plan_report(study).workers == 3
    one = PlanReport(tuple(plain), (), (), 600.0, "a guess")
    assert estimate_text(one) == "estimated time: 1.0 h for 5 trials and a baseline (a guess)"


def test_the_plan_shows_the_slurm_job_and_warns_when_its_time_limit_cuts_the_budget(
    tmp_path: Path,
) -> None:
    """A `[slurm]` study's plan shows its pilots, the job's time limit and the time each
    pilot measures (Slurm stops it 2 min before the limit); a time_limit that leaves less
    than the budget is warned of, with what to set (was: nothing about [slurm])."""
    from sweep.commands.plan import plan_report
    from sweep.commands.plan_time import slurm_plan

    def slurm_study(name: str, slurm: str) -> Study:
        path = write_study(tmp_path, name=name, study='budget = "10m"')
        text = path.read_text().replace("[host]\n", '[host]\nkind = "slurm"\n')
        path.write_text(text + f"\n[slurm]\nnodes = 2\n{slurm}\n")
        return load_study(path)

    cut = slurm_study("cut", 'time_limit = "3m"')
    line, warning = slurm_plan(cut, now=0.0)
    assert line == (
        "slurm: 2 pilots (one node each); time limit 3 min ([slurm] time_limit); Slurm asks each "
        "pilot to stop 2 min before it, so each measures for at most 1 min"
    )
    assert warning == (
        f"{cut.path}: [slurm] time_limit = 3 min leaves each pilot 1 min (Slurm stops it 2 min "
        "before the limit), less than the budget's 10 min and the pilots' start: the job is cut "
        "at the time limit; set time_limit to at least 20 min (or remove it: the budget + 10 min)"
    )
    default = slurm_study("default", 'partition = "gpu"')
    line, warning = slurm_plan(default, now=0.0)
    assert line == (
        "slurm: 2 pilots (one node each, partition gpu); time limit 20 min (the run's time + 10 "
        "min); Slurm asks each pilot to stop 2 min before it, so each measures for at most 18 min"
    )
    assert warning is None
    assert plan_report(cut).workers_are == "pilots"
    assert slurm_plan(load_study(write_study(tmp_path, name="plain")), now=0.0) == ("", None)
