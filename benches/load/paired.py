"""Statistics the load scripts share (compare.sh, tls.sh): medians with
their spread, a distribution-free interval for a median, and each round's
CPU over the lower of that round's nginx and HAProxy runs."""

import statistics
from math import comb


def spread(values, fmt):
    """The median, and (min-max) when there is more than one value."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return med
    return f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def median_ci(values, fmt):
    """The median, and a distribution-free interval of at least 95 % for
    it (order statistics of the binomial: 7 rounds give min-max, 98.4 %);
    fewer than 6 values: min-max."""
    v = sorted(x for x in values if x is not None)
    n = len(v)
    if n < 6:
        return spread(v, fmt)
    k = max(j for j in range(1, n // 2 + 1)
            if j == 1 or 1 - 2 * sum(comb(n, i) for i in range(j)) / 2 ** n >= 0.95)
    return f"{fmt.format(statistics.median(v))} [{fmt.format(v[k - 1])}-{fmt.format(v[n - k])}]"


def lower_ratios(own, nginx, haproxy):
    """Each round's CPU over the lower of that round's nginx and HAProxy
    CPU: the arguments map a round to its CPU per request (or None)."""
    lower = {r: min(c for c in (nginx[r], haproxy[r]) if c)
             for r in nginx if r in haproxy and (nginx[r] or haproxy[r])}
    return [cpu / lower[r] for r, cpu in own.items() if r in lower and cpu is not None]
