"""Product search: BM25 over each product's text (bm25s), as WebShop's Lucene index or a plain variant.

WebShop searches a Pyserini/Lucene index (Java) of title, description, the *first* bullet point and the
options, analysed with Lucene's English stop words and Porter stemming; `index="lucene"` reproduces that
text and analysis with bm25s (Lucene's BM25 variant, Anserini's k1 = 0.9, b = 0.4, PyStemmer's original
Porter algorithm). Tokens differ only where bm25s's word pattern differs from Lucene's tokenizer (bm25s
drops one-character words). `index="plain"` indexes every bullet point without stemming (bm25s's English
stop words), the variant the tiny demo was tuned on. Results are the top 50 products with a positive
score, ties broken by catalogue order, so a search is a pure function of the catalogue and the keywords.
"""

from __future__ import annotations

import bm25s
import numpy as np
import Stemmer

SEARCH_RETURN_N = 50  # WebShop's
INDEXES = ("lucene", "plain")
# Lucene's English stop set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET), what Pyserini's analyzer drops.
LUCENE_STOPWORDS = (
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with"
).split()


def product_text(product: dict, index: str = "lucene") -> str:
    """What a product is found by: title, description, the first (lucene) or every (plain) bullet point,
    and 'name: values' per option, lower-cased."""
    bullets = product["BulletPoints"]
    bullets = bullets if isinstance(bullets, list) else [bullets]
    if index == "lucene":
        bullets = bullets[:1]
    options = ", and ".join(f"{k}: {', '.join(v)}" for k, v in product.get("options", {}).items())
    return " ".join([product["Title"], product["Description"], *bullets, options]).lower()


class SearchIndex:
    """A BM25 index of a product list; `search` returns asins, best first."""

    def __init__(self, products: list[dict], index: str = "lucene", k1: float = 0.9, b: float = 0.4):
        if index not in INDEXES:
            raise ValueError(f"search_index={index!r}: must be one of {', '.join(INDEXES)}")
        self.asins = [p["asin"] for p in products]
        lucene = index == "lucene"
        self.stopwords = LUCENE_STOPWORDS if lucene else "en"
        self.stemmer = Stemmer.Stemmer("porter") if lucene else None
        self.bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        self.bm25.index(self._tokens([product_text(p, index) for p in products]), show_progress=False)

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return bm25s.tokenize(
            texts, stopwords=self.stopwords, stemmer=self.stemmer, return_ids=False, show_progress=False
        )

    def scores(self, keywords: str) -> np.ndarray:
        words = self._tokens([keywords.lower()])[0]
        if not words:
            return np.zeros(len(self.asins), dtype=np.float32)
        return np.asarray(self.bm25.get_scores(words), dtype=np.float32)

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[str]:
        s = self.scores(keywords)
        order = np.lexsort((np.arange(len(s)), -s))  # by score, then catalogue order
        return [self.asins[i] for i in order[:k] if s[i] > 0]
