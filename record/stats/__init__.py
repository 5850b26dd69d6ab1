"""Statistics for ablation tables, ``ablate compare``, ``ablate heads`` and the HTML report: one package, so
the same rules hold everywhere, split by concern (summaries, paired tests, power, contrasts, effects). docs/statistics.md explains every number.

- Successes: a variant's cells that finished and learned, out of its cells, with the exact (Clopper-Pearson)
  interval (``scipy.stats.binomtest``); a success rate against its comparator by Fisher's exact test.
- Paired contrasts (a variant against a comparator over the seeds both have): the mean difference; the exact
  paired sign-flip permutation test (``scipy.stats.permutation_test``, every one of the 2^n sign flips for
  n <= 16 seeds, Monte Carlo beyond), or the paired t-test; the Student-t and BCa bootstrap intervals;
  Hedges' g; equivalence by two one-sided tests (TOST) against a margin; the smallest difference the seeds
  could detect and the seeds a stated difference needs (the exact test's own power, simulated, up to 12 seeds;
  ``statsmodels`` TTestPower for the t-test and beyond); the correlation between
  the paired runs (what pairing bought).
- Factorial effects of a grid: main effects and interactions computed within each seed from its own cells (the
  difference, or the difference of differences) and tested like a paired difference, so that a Holm family
  holds tests of one kind; a seed without every cell of an effect stays out of it, as a pair's seed without
  both values does.
- Holm's correction (``statsmodels.stats.multitest``) over exactly the declared family; a contrast with no
  data counts in it with p = 1 (it never silently leaves the family).
- Verdicts: the words "different (better|worse)", "equivalent within ±m", "not resolved" and "untestable" come
  from the tests only; "not testable here" (dashboards/verdicts.py) from the room and convergence checks.

statsmodels and scipy.stats are imported inside the functions that need them (about a second and 0.8 s): a driver
that only plans its cells (holm_floor, smallest_exact_n) does not pay for them.
"""

from record.stats.contrasts import (
    NO_EQUIVALENCE,
    Contrast,
    Corrected,
    MarginOf,
    Measured,
    Standing,
    correct,
    holm,
    measure,
    paired_contrast,
    seed_contrast,
    verdict,
)
from record.stats.effects import factorial_effects
from record.stats.family import (
    EXACT_MAX_N,
    MC_RESAMPLES,
    effect_labels,
    holm_best_steps,
    holm_floor,
    interaction_label,
    main_label,
    min_p,
    smallest_exact_n,
)
from record.stats.paired import (
    TESTS,
    hedges_correction,
    hedges_g,
    paired_p,
    paired_p_many,
    resamples_for,
    sign_flip_p,
    tost_p,
)
from record.stats.power import (
    EXACT_POWER_MAX_N,
    POWER_DRAWS,
    detectable,
    noncentral_power_integral,
    power_of,
    seeds_needed,
    sign_flip_power,
    t_power_integral,
)
from record.stats.summaries import (
    BOOT_RESAMPLES,
    BOOT_UNDER_COVERS_BELOW,
    NAN,
    NAN2,
    Successes,
    Summary,
    bca_interval,
    describe,
    finite,
    has_spread,
    rate_test,
    success_interval,
    successes,
    t_interval,
)

__all__ = [
    "NO_EQUIVALENCE",
    "BOOT_RESAMPLES",
    "BOOT_UNDER_COVERS_BELOW",
    "EXACT_MAX_N",
    "EXACT_POWER_MAX_N",
    "MC_RESAMPLES",
    "NAN",
    "NAN2",
    "POWER_DRAWS",
    "TESTS",
    "Contrast",
    "Corrected",
    "MarginOf",
    "Measured",
    "Standing",
    "measure",
    "Successes",
    "Summary",
    "bca_interval",
    "correct",
    "describe",
    "detectable",
    "effect_labels",
    "factorial_effects",
    "finite",
    "has_spread",
    "hedges_correction",
    "hedges_g",
    "holm",
    "holm_best_steps",
    "holm_floor",
    "interaction_label",
    "main_label",
    "min_p",
    "noncentral_power_integral",
    "paired_contrast",
    "paired_p",
    "paired_p_many",
    "power_of",
    "rate_test",
    "resamples_for",
    "seed_contrast",
    "seeds_needed",
    "sign_flip_p",
    "sign_flip_power",
    "smallest_exact_n",
    "success_interval",
    "successes",
    "t_interval",
    "t_power_integral",
    "tost_p",
    "verdict",
]
