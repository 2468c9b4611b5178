"""The loop wing: ask Optuna, apply the rules, claim, measure, decide, tell — overnight.

``runner`` drives one host; ``fleet`` and ``worker`` share a study between hosts;
``baselines``, ``resume`` and ``claims`` read and guard the study; ``status`` and
``progress`` show it.
"""
