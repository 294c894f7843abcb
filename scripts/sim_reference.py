"""Reference figures for `decision sim`'s statistics (sim/src/stats.rs).

Writes sim/tests/fixtures/noninferiority.json: for paired task outcomes built from counts
(`both` tasks both modes solved, `worse` only llm solved, `better` only the mode solved, the
rest neither), the one-sided non-inferiority t-test of the mode against llm at the margin
(scipy.stats.ttest_1samp on the paired differences, H1: mean > -margin) and the mode's 95 %
Wilson interval (statsmodels). The Rust test rebuilds the same outcomes and compares to 1e-9.

    python -m venv .venv-sim && .venv-sim/bin/pip install -r scripts/requirements-sim.txt
    .venv-sim/bin/python scripts/sim_reference.py
"""

import json
import pathlib

import numpy as np
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

CASES = [
    # n, both, worse, better, margin
    (100, 80, 6, 2, 0.03),
    (500, 400, 5, 5, 0.03),
    (500, 380, 30, 4, 0.03),
    (500, 410, 12, 3, 0.03),
    (150, 120, 1, 0, 0.03),
    (500, 300, 90, 2, 0.05),
    (40, 30, 2, 3, 0.03),
]


def main() -> None:
    out = []
    for n, both, worse, better, margin in CASES:
        mode = np.array([1] * both + [0] * worse + [1] * better + [0] * (n - both - worse - better))
        llm = np.array([1] * both + [1] * worse + [0] * better + [0] * (n - both - worse - better))
        d = mode - llm
        res = stats.ttest_1samp(d, -margin, alternative="greater")
        lo, hi = proportion_confint(int(mode.sum()), n, alpha=0.05, method="wilson")
        out.append(
            {
                "n": n,
                "both": both,
                "worse": worse,
                "better": better,
                "margin": margin,
                "difference": float(d.mean()),
                "t": float(res.statistic),
                "p_value": float(res.pvalue),
                "mode_success_low": float(lo),
                "mode_success_high": float(hi),
            }
        )
    path = pathlib.Path(__file__).resolve().parent.parent / "sim/tests/fixtures/noninferiority.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"made_by": "scripts/sim_reference.py", "cases": out}, indent=1) + "\n")
    print(f"wrote {path} ({len(out)} cases)")


if __name__ == "__main__":
    main()
