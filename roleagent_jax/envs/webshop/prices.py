"""WebShop's price caps: the larger of two of the four multiples of 10 above a product's price.

Both goal builders (human and synthetic) draw a goal's cap this way, WebShop's `PRICE_RANGE` rule.
"""

from __future__ import annotations

import random

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_CAP = 1_000_000


def price_clause(price: float, rng: random.Random) -> tuple[float, str]:
    """(price cap, clause) for a product at `price`; no cap and no clause when fewer than two multiples
    of 10 lie above it."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_CAP, ""
    _, cap = sorted(rng.sample(above, 2))
    return cap, f", and price lower than {cap:.2f} dollars"
