"""Product search: BM25 over each product's title, description, bullet points and options (bm25s).

WebShop searches a Lucene index (Pyserini, Java) of the same text; we use bm25s with Lucene's BM25
variant and Anserini's default parameters (k1 = 0.9, b = 0.4), English stop words, no stemming.
Results are the top 50 products with a positive score, ties broken by catalogue order, so a search
is a pure function of the catalogue and the keywords.
"""

from __future__ import annotations

import bm25s
import numpy as np

SEARCH_RETURN_N = 50  # WebShop's


def product_text(product: dict) -> str:
    """What a product is found by: title, description, bullet points and 'name: values' per option."""
    bullets = product["BulletPoints"]
    bullets = bullets if isinstance(bullets, list) else [bullets]
    options = ", and ".join(f"{k}: {', '.join(v)}" for k, v in product.get("options", {}).items())
    return " ".join([product["Title"], product["Description"], *bullets, options]).lower()


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class SearchIndex:
    """A BM25 index of a product list; `search` returns asins, best first."""

    def __init__(self, products: list[dict], k1: float = 0.9, b: float = 0.4):
        self.asins = [p["asin"] for p in products]
        self.bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        self.bm25.index(_tokens([product_text(p) for p in products]), show_progress=False)

    def scores(self, keywords: str) -> np.ndarray:
        words = _tokens([keywords.lower()])[0]
        if not words:
            return np.zeros(len(self.asins), dtype=np.float32)
        return np.asarray(self.bm25.get_scores(words), dtype=np.float32)

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        s = self.scores(keywords)
        order = np.lexsort((np.arange(len(s)), -s))  # by score, then catalogue order
        return [self.asins[i] for i in order[:k] if s[i] > 0]
