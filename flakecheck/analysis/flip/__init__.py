"""Flip probability: how likely each case, and the score, is to change on a busy server.

- load: the load model and the compositions sampled from it (`flakecheck run --sample N --load ...`);
- observed: per case, the share of draws that flip, with exact intervals; TARr@N / TARa@N;
- adaptive: when `--repeat auto` / `--sample auto` stop measuring a case, and where the rest of the budget goes;
- predict: the flip probability predicted from the reference's gaps and the gap shifts the run measured;
- calibration: AUROC, Spearman, Brier and reliability bins of predicted against observed;
- score: the suite's score over the draws (mean, std, percentiles, retry-free);
- summary: the `flip` block of meta.json, built from the analysed tables.
"""
