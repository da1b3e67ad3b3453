"""Which parameters get weight decay: MindFormers' rules, on names and dimensions only.

MindFormers (`pynative/trainer/utils.py::get_param_groups`) sorts parameters into a
"weight_decay" group and a "no_weight_decay" group (decay 0.0). For each parameter, the first
of these that applies decides:

1. it matches a rule of `optimizer.weight_decay_include`: decay;
2. it matches a rule of `optimizer.weight_decay_exclude`: no decay;
3. it is 1-D (norm gains, biases) or its name ends with ".bias": no decay;
4. otherwise: decay.

A rule matches a name when it equals the name, is a substring of it, or is an `fnmatch`
pattern that matches it (so "norm", "layers.0.mlp.*.weight" and "lm_head.weight" all work).
Patterns are matched case-sensitively on every platform (`fnmatchcase`), so a configuration
groups the same way on Windows as on Linux.

MindFormers also asks the model for `no_weight_decay()` names and keywords; mf's models declare
their no-decay parameters through these defaults (1-D norms and biases) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from mf_config.component_settings import settings_error
from mf_config.errors import Path
from mf_config.yaml_source import Source


def rule_matches(name: str, rule: str) -> bool:
    """Whether `rule` selects the parameter `name`: equal, substring, or fnmatch pattern."""
    return rule == name or rule in name or fnmatchcase(name, rule)


def matching_rule(name: str, rules: Sequence[str]) -> str | None:
    """The first of `rules` that selects `name`, or None."""
    for rule in rules:
        if rule_matches(name, rule):
            return rule
    return None


def gets_weight_decay(name: str, ndim: int, include: Sequence[str] = (),
                      exclude: Sequence[str] = ()) -> bool:
    """Whether the parameter `name` of `ndim` dimensions is decayed (priority: include >
    exclude > the defaults, which spare 1-D parameters and names ending with ".bias")."""
    if matching_rule(name, include) is not None:
        return True
    if matching_rule(name, exclude) is not None:
        return False
    return not (ndim == 1 or name.endswith(".bias"))


def weight_decay_flags(named_ndims: Sequence[tuple[str, int]], include: Sequence[str] = (),
                       exclude: Sequence[str] = ()) -> list[bool]:
    """`gets_weight_decay` for each (name, ndim), in order."""
    return [gets_weight_decay(name, ndim, include, exclude) for name, ndim in named_ndims]


def unmatched_rules(names: Sequence[str], rules: Sequence[str]) -> list[str]:
    """The rules that select none of `names` (usually a typo in the configuration)."""
    return [rule for rule in rules if not any(rule_matches(name, rule) for name in names)]


def check_rules(rules: Sequence[str] | None, path: Path, source: Source | None = None) -> list[str]:
    """`rules` as a list, or `ConfigError` at `path` for an empty rule: "" is a substring of
    every name, so it would select every parameter."""
    rules = list(rules or [])
    found = [((*path, index), "an empty rule matches every parameter name; give a name, a "
                              "part of one, or a pattern such as '*.norm.weight'")
             for index, rule in enumerate(rules) if rule == ""]
    if found:
        raise settings_error(found, source)
    return rules
