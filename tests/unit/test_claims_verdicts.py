"""The claims ledger's verdict rules (protoclip.claims.ledger): every rule gives each of its outcomes on synthetic
intervals, so none is a rule that cannot fail; the magnitude gate; Holm's adjustment against its definition."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from protoclip.claims import ledger
from protoclip.claims.intervals import holm
from protoclip.claims.ledger import (
    CONTRADICTED,
    NOT_RESOLVED,
    NOT_RUN,
    NOT_TESTED,
    REPRODUCED,
    direction_verdict,
    gate_magnitude,
    magnitude_verdict,
    verdict_text,
)


@pytest.mark.parametrize("sign, lo, hi, want", [
    (+1, 0.4, 3.9, REPRODUCED), (+1, -3.9, -0.4, CONTRADICTED), (+1, -0.4, 3.9, NOT_RESOLVED),
    (+1, 0.0, 0.0, NOT_RESOLVED),  # an identical pair
    (-1, -3.9, -0.4, REPRODUCED), (-1, 0.1, 2.0, CONTRADICTED), (-1, -1.0, 0.5, NOT_RESOLVED),
])
def test_direction_rule(sign, lo, hi, want):
    assert direction_verdict(sign, lo, hi) == want


@pytest.mark.parametrize("test, lo, hi, paper, m, want", [
    # equivalence: [paper - m, paper + m] = [2.905, 8.715] for the paper's +5.81
    ("equivalence", 3.5, 8.0, 5.81, 2.905, REPRODUCED),
    ("equivalence", 0.34, 2.04, 5.81, 2.905, CONTRADICTED),  # a positive difference, far below the paper's
    ("equivalence", 9.0, 12.0, 5.81, 2.905, CONTRADICTED),  # above
    ("equivalence", 2.0, 4.0, 5.81, 2.905, NOT_RESOLVED),  # straddles the lower edge
    ("equivalence", -1.0, 12.0, 5.81, 2.905, NOT_RESOLVED),  # wider than the whole margin
    # at most paper + m ("only 2.3 %", "less than 8 %"), at least paper - m
    ("at_most", 1.0, 2.5, 2.3, 0.575, REPRODUCED), ("at_most", 3.0, 4.0, 2.3, 0.575, CONTRADICTED),
    ("at_most", 2.0, 3.5, 2.3, 0.575, NOT_RESOLVED), ("at_most", 0.1, 0.9, None, 1.0, REPRODUCED),
    ("at_least", 1.0, 2.0, 1.5, 0.5, REPRODUCED), ("at_least", -2.0, 0.5, 1.5, 0.5, CONTRADICTED),
    ("at_least", 0.5, 2.0, 1.5, 0.5, NOT_RESOLVED),
])
def test_magnitude_rules(test, lo, hi, paper, m, want):
    assert magnitude_verdict(test, lo, hi, paper, m) == want


def test_every_rule_gives_every_outcome_on_a_grid_of_intervals():
    """Sweeping intervals over a grid, each rule reaches reproduced, contradicted and not resolved."""
    grid = np.linspace(-10, 10, 21)
    pairs = [(lo, hi) for lo, hi in itertools.product(grid, grid) if lo <= hi]
    rules = {
        "direction +": lambda lo, hi: direction_verdict(+1, lo, hi),
        "direction -": lambda lo, hi: direction_verdict(-1, lo, hi),
        "equivalence": lambda lo, hi: magnitude_verdict("equivalence", lo, hi, 3.0, 2.0),
        "at_most": lambda lo, hi: magnitude_verdict("at_most", lo, hi, 2.0, 0.5),
        "at_least": lambda lo, hi: magnitude_verdict("at_least", lo, hi, 2.0, 0.5),
    }
    for name, rule in rules.items():
        assert {rule(lo, hi) for lo, hi in pairs} == set(ledger.OUTCOMES), name


def test_a_magnitude_is_decided_only_at_the_papers_scale_with_seed_spread_measured():
    for raw in (REPRODUCED, CONTRADICTED):
        assert gate_magnitude(raw, paper_scale=True, seed_measured=True) == (raw, "")
        v, why = gate_magnitude(raw, paper_scale=False, seed_measured=True)
        assert v == NOT_RESOLVED and "not the paper's scale" in why and f"the test alone: {raw}" in why
        v, why = gate_magnitude(raw, paper_scale=True, seed_measured=False)
        assert v == NOT_RESOLVED and ledger.NO_SPREAD in why
    assert gate_magnitude(NOT_RESOLVED, True, True) == (NOT_RESOLVED, "")


def test_the_verdict_names_what_held():
    assert verdict_text(REPRODUCED, NOT_RESOLVED) == "direction reproduced, magnitude not resolved"
    assert verdict_text(NOT_TESTED, CONTRADICTED) == "magnitude contradicted"
    assert verdict_text(NOT_RESOLVED, NOT_TESTED) == "direction not resolved"
    assert verdict_text(NOT_RUN, NOT_RUN) == NOT_RUN


def test_bad_intervals_and_rules_are_refused():
    with pytest.raises(ValueError, match="reversed"):
        direction_verdict(+1, 2.0, 1.0)
    with pytest.raises(ValueError, match="sign"):
        direction_verdict(0, 1.0, 2.0)
    with pytest.raises(ValueError, match="paper's value"):
        magnitude_verdict("equivalence", 1.0, 2.0, None, 1.0)
    with pytest.raises(ValueError, match="unknown magnitude"):
        magnitude_verdict("within", 1.0, 2.0, 1.0, 1.0)


def test_holm_matches_its_step_down_definition():
    """Holm: sort p ascending, p_(i) * (m - i + 1), running maximum, capped at 1; checked against an explicit
    loop over every rejection threshold (reject H_(1..k) while p_(j) <= alpha / (m - j + 1))."""
    p = [0.01, 0.04, 0.03, 0.005, 0.2]
    adj = holm(p)
    assert adj == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.2])
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.uniform(0, 0.1, 6).tolist()
        adj = holm(p)
        for alpha in (0.01, 0.025, 0.05):
            order = np.argsort(p)
            rejected = set()
            for j, i in enumerate(order):
                if p[i] > alpha / (len(p) - j):
                    break
                rejected.add(i)
            assert {i for i, a in enumerate(adj) if a <= alpha} == rejected


def test_sign_test_is_the_binomial_tail():
    """P(X >= k), X ~ Binomial(n, 1/2), against scipy; 9 of 14 (Table VI) is p = 0.21, 12 of 14 reaches 2.5 %
    and 3 of 3 can never (0.125)."""
    from scipy import stats

    for ahead, behind in ((9, 5), (12, 2), (11, 3), (3, 0), (0, 3), (7, 7)):
        assert ledger.sign_test(ahead, behind) == pytest.approx(stats.binom.sf(ahead - 1, ahead + behind, 0.5))
    assert ledger.sign_test(9, 5) == pytest.approx(3473 / 16384)  # sum C(14, 9..14) / 2^14
    assert ledger.sign_verdict(12, 2) == REPRODUCED and ledger.sign_verdict(2, 12) == CONTRADICTED
    assert ledger.sign_verdict(9, 5) == NOT_RESOLVED and ledger.sign_verdict(3, 0) == NOT_RESOLVED
    assert ledger.sign_verdict(6, 0) == REPRODUCED  # 1/64 < 2.5 %: six sets is the fewest that can decide
    assert ledger.sign_test(0, 0) == 1.0


@pytest.mark.parametrize("metric, classes, candidates, want", [
    ("top1", 188, None, 100 / 188), ("top5", 188, None, 500 / 188), ("top5", 3, None, 100.0),
    ("image_to_text_R@1", None, 434, 100 / 434), ("text_to_image_R@5", None, 434, 500 / 434),
    ("mean_recall", None, 100, (1 + 5 + 10) / 3), ("ari", None, None, 0.0), ("ami", None, None, 0.0),
])
def test_chance_levels(metric, classes, candidates, want):
    assert ledger.chance_level(metric, classes, candidates) == pytest.approx(want)


def test_chance_needs_its_count():
    with pytest.raises(ValueError, match="classes"):
        ledger.chance_level("top1")
    with pytest.raises(ValueError, match="candidates"):
        ledger.chance_level("image_to_text_R@1")


@pytest.mark.parametrize("raw, p_holm, want", [
    (REPRODUCED, 0.001, REPRODUCED), (REPRODUCED, 0.064, NOT_RESOLVED), (CONTRADICTED, 0.01, CONTRADICTED),
    (CONTRADICTED, 0.03, NOT_RESOLVED), (REPRODUCED, None, NOT_RESOLVED), (NOT_RESOLVED, 0.001, NOT_RESOLVED),
    (ledger.NOT_DECISIVE, None, ledger.NOT_DECISIVE),
])
def test_holm_decides_the_direction(raw, p_holm, want):
    assert ledger.decide(raw, p_holm) == want


def test_not_decisive_and_at_chance_read_as_such():
    assert verdict_text(ledger.NOT_DECISIVE, NOT_RESOLVED) == ("direction examples only: not decisive, magnitude "
                                                               "not resolved")
    assert verdict_text(ledger.AT_CHANCE, ledger.AT_CHANCE) == ledger.AT_CHANCE
    assert {ledger.NOT_DECISIVE, ledger.AT_CHANCE} <= set(ledger.VERDICTS)


def test_first_line_counts_each_question_over_the_rows_that_ask_it():
    """The ledger's first line is computed from its rows: a row at chance whose claim asks no magnitude adds to
    the directions only (issue 59: 37 magnitudes counted where 36 rows ask one); a not-run row to neither."""
    from protoclip.claims.config import ClaimConfig
    from protoclip.claims.rows import LedgerRow, at_chance, summary_text

    def row(cid: str, magnitude: str, direction: str, mag_verdict: str) -> LedgerRow:
        c = ClaimConfig(id=cid, paper="P", source="p.txt", line=1, where="-", quote="-", paper_value=2.0,
                        paper_text="+2", target="t", a="A", b="B", columns=["c"], magnitude=magnitude,
                        margin=None if magnitude == "none" else 1.0, margin_why="" if magnitude == "none" else "m")
        return LedgerRow(c, direction=direction, magnitude=mag_verdict)

    rows = [row("both", "equivalence", REPRODUCED, NOT_RESOLVED), row("dir_only", "none", NOT_RESOLVED, NOT_TESTED),
            row("floor", "none", NOT_RUN, NOT_RUN), row("floor_m", "equivalence", NOT_RUN, NOT_RUN),
            row("absent", "equivalence", NOT_RUN, NOT_RUN)]
    at_chance(rows[2], "b at chance")
    at_chance(rows[3], "b at chance")
    assert (rows[2].direction, rows[2].magnitude) == (ledger.AT_CHANCE, NOT_TESTED)
    assert (rows[3].direction, rows[3].magnitude) == (ledger.AT_CHANCE, ledger.AT_CHANCE)
    assert rows[2].verdict == ledger.AT_CHANCE and rows[2].p is None and rows[2].reason == "b at chance"
    text = summary_text(rows)
    assert text == ("5 distinct claims, 1 not run, 0 skipped, 0 unavailable; direction (4 tested): 1 decisive (1 "
                    "reproduced, 0 contradicted, Holm within each paper), 1 not resolved, 2 at chance: not judged; "
                    "magnitude (2 tested): 0 decisive (0 reproduced, 0 contradicted), 1 not resolved, 1 at chance: "
                    "not judged")
