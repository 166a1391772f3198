"""The shop's pages and actions, in WebShop's text mode, without a web server.

Pages: search, results (10 per page as in WebShop, or `page_size`; ``< Prev`` / ``Next >``), item
(option values as choices, ``Description`` / ``Features`` / ``Reviews``, ``Buy Now``), the item's
sub-pages, and the done page.
A page is its visible strings joined by `` [SEP] ``, as WebShop's "simple" text mode renders it,
less the instruction header (the prompt states the task once; verl-agent strips it the same way), and
that text is the GiGPO anchor. Like WebShop's simple mode it does not mark chosen options; the state
(`info["state"]`) is the page with the options chosen so far, so an item page before and after a choice
are two states.

Actions are ``search[keywords]`` and ``click[element]``, case-insensitive as in WebShop. A search
works from any page (WebShop's server accepts one anywhere) but is only *listed* on the search page;
a click must name one of the page's clickables; anything else changes nothing. An episode ends at
``Buy Now`` or after `max_steps` steps. Buying scores the purchase with WebShop's formula; the reward
is 10 when the score is 1.0 (success), 0 otherwise, and the raw score is reported in the info.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from roleagent_jax.envs.webshop.catalog import Catalogue
from roleagent_jax.envs.webshop.reward import purchase_score, token_set_score
from roleagent_jax.envs.webshop.search import SearchIndex

SEP = " [SEP] "
PAGE_SIZE = 10
WIN_REWARD = 10.0
MAX_STEPS = 15
BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features", "reviews")
SEARCH_PLACEHOLDER = "search[<your query>]"
_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_PRICE_CLAUSE = re.compile(r",?\s*and price lower than [\d.]+ dollars\s*$", re.IGNORECASE)


def split_action(action: str) -> tuple[str, str] | None:
    """('search' | 'click', argument) of a well-formed action, else None."""
    m = _ACTION.match(action or "")
    if not m or not m.group(2).strip():
        return None
    return m.group(1).lower(), " ".join(m.group(2).split())


_FILLER = frozenset(
    "i im i'm am need want looking look find me get a an the for with and in of that is it to color colour "
    "size flavor scent some please would like buy".split()
)
_WORD = re.compile(r"[a-z0-9]+(?:['.-][a-z0-9]+)*")


def goal_words(instruction: str) -> str:
    """The instruction without its price clause."""
    return _PRICE_CLAUSE.sub("", instruction).strip()


def content_words(text: str) -> list[str]:
    """The words of `text` that describe a product (lower case, in order; filler such as "i need" dropped)."""
    return [w for w in _WORD.findall(text.lower()) if w not in _FILLER]


def search_keywords(instruction: str) -> str:
    """What the expert types into the search bar: the instruction's content words, without the price."""
    return " ".join(content_words(goal_words(instruction)))


@dataclass
class Shop:
    """A catalogue and its search index (built once per process and shared by its environments);
    `search_index` is the index's kind (`search.INDEXES`)."""

    catalogue: Catalogue
    search_index: str = "lucene"
    index: SearchIndex = field(init=False)

    def __post_init__(self):
        self.index = SearchIndex(self.catalogue.products, self.search_index)


@dataclass
class _State:
    page: str = "search"  # search | results | item | sub | done
    keywords: str = ""
    results: list[str] = field(default_factory=list)
    page_no: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub: str = ""
    score: float = 0.0
    score_parts: dict = field(default_factory=dict)


class ShopSession:
    """One shopper on one goal at a time: reset(goal index) -> (obs, info); step(action) -> (obs, r, done, info)."""

    def __init__(self, shop: Shop, max_steps: int = MAX_STEPS, page_size: int = PAGE_SIZE):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.shop = shop
        self.max_steps = max_steps
        self.page_size = page_size
        self.goal: dict = {}
        self.goal_index = -1
        self.state = _State()
        self.steps = 0
        self.done = True

    # ----- pages -------------------------------------------------------------------------------
    def _product(self) -> dict:
        return self.shop.catalogue.by_asin[self.state.asin]

    def _page_items(self) -> list[str]:
        s = self.state
        return s.results[(s.page_no - 1) * self.page_size : s.page_no * self.page_size]

    def render(self) -> str:
        s = self.state
        if s.page == "search":
            parts = ["WebShop", "Search"]
        elif s.page == "results":
            parts = [
                "Back to Search",
                f"Page {s.page_no} (Total results: {len(s.results)})",
                *(["< Prev"] if s.page_no > 1 else []),
                "Next >",
            ]
            for asin in self._page_items():
                p = self.shop.catalogue.by_asin[asin]
                parts += [asin, p["Title"], p["Price"]]
        elif s.page == "item":
            p = self._product()
            parts = ["Back to Search", "< Prev"]
            for name, values in p["options"].items():
                parts += [name, *values]
            parts += [p["Title"], f"Price: {p['Price']}", f"Rating: {p['Rating']}"]
            parts += ["Description", "Features", "Reviews", "Buy Now"]
        elif s.page == "sub":
            p = self._product()
            parts = ["Back to Search", "< Prev"]
            if s.sub == "description":
                parts.append(p["Description"])
            elif s.sub == "features":
                bullets = p["BulletPoints"]
                parts += bullets if isinstance(bullets, list) else [bullets]
            else:
                parts += [str(r.get("body", "")) for r in p.get("Reviews", [])]
        else:
            parts = [
                "Thank you for shopping with us!",
                "Your score (min 0.0, max 1.0)",
                f"{round(s.score, 3)}",
            ]
            parts += done_details(s.score_parts, self.goal)
        return SEP.join(x.strip() for x in parts if x and x.strip())

    def clickables(self) -> dict[str, tuple[str, str]]:
        """Lower-cased clickable text -> (kind, value), as WebShop lists them for the current page."""
        s = self.state
        out: dict[str, tuple[str, str]] = {}
        if s.page == "results":
            out[BACK_TO_SEARCH] = ("nav", BACK_TO_SEARCH)
            if s.page_no > 1:
                out[PREV_PAGE] = ("nav", PREV_PAGE)
            out[NEXT_PAGE] = ("nav", NEXT_PAGE)
            for asin in self._page_items():
                out[asin.lower()] = ("product", asin)
        elif s.page == "item":
            out[BACK_TO_SEARCH] = ("nav", BACK_TO_SEARCH)
            out[PREV_PAGE] = ("nav", PREV_PAGE)
            for sub in SUB_PAGES:
                out[sub] = ("sub", sub)
            out[BUY_NOW] = ("nav", BUY_NOW)
            for name, values in self._product()["options"].items():
                for v in values:
                    out[v] = ("option", name)  # a value shared by two axes selects the last, as in WebShop
        elif s.page == "sub":
            out[BACK_TO_SEARCH] = ("nav", BACK_TO_SEARCH)
            out[PREV_PAGE] = ("nav", PREV_PAGE)
        return out

    def admissible(self) -> list[str]:
        """WebShop's available actions: the search bar on the search page, the clickables elsewhere."""
        if self.done:
            return []
        if self.state.page == "search":
            return [SEARCH_PLACEHOLDER]
        return [f"click[{c}]" for c in self.clickables()]

    # ----- episode -----------------------------------------------------------------------------
    def reset(self, goal_index: int) -> tuple[str, dict]:
        goals = self.shop.catalogue.goals
        if not 0 <= goal_index < len(goals):
            raise ValueError(f"goal index {goal_index} out of range (the shop has {len(goals)} goals)")
        self.goal_index, self.goal = goal_index, goals[goal_index]
        self.state, self.steps, self.done = _State(), 0, False
        obs = self.render()
        return obs, self._info(obs)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.goal_index < 0:
            raise RuntimeError("step() before reset()")
        if self.done:
            obs = self.render()
            return obs, 0.0, True, self._info(obs)
        self.steps += 1
        reward = self._apply(split_action(action))
        self.done = self.state.page == "done" or self.steps >= self.max_steps
        obs = self.render()
        return obs, reward, self.done, self._info(obs)

    def _search(self, keywords: str, page_no: int = 1) -> None:
        s = self.state
        s.page, s.keywords, s.page_no, s.asin, s.options = "results", keywords, page_no, None, {}
        s.results = self.shop.index.search(keywords)

    def _apply(self, parsed: tuple[str, str] | None) -> float:
        s = self.state
        if parsed is None:
            return 0.0
        kind, arg = parsed
        if kind == "search":
            self._search(arg.lower())
            return 0.0
        target = self.clickables().get(arg.lower())
        if target is None:
            return 0.0
        what, value = target
        key = arg.lower()
        if key == BUY_NOW:
            return self._buy()
        if key == BACK_TO_SEARCH:
            self.state = _State()
        elif key == NEXT_PAGE:
            s.page_no += 1
        elif key == PREV_PAGE:
            if s.page == "results":
                s.page_no -= 1
            elif s.page == "item":
                s.page, s.asin, s.options = "results", None, {}
            else:
                s.page = "item"
        elif what == "product":
            s.page, s.asin, s.options = "item", value, {}
        elif what == "option":
            s.options[value] = key
        elif what == "sub":
            s.page, s.sub = "sub", value
        return 0.0

    def _buy(self) -> float:
        s = self.state
        price = self.shop.catalogue.prices[s.asin]
        parts = purchase_score(self._product(), self.goal, price, s.options)
        s.page, s.score, s.score_parts = "done", float(parts["score"]), parts
        return WIN_REWARD if s.score == 1.0 else 0.0

    def _info(self, obs: str) -> dict:
        s = self.state
        return {
            "won": s.page == "done" and s.score == 1.0,
            "score": s.score,
            "bought": s.asin if s.page == "done" else None,
            "chosen_options": dict(s.options),
            "page": s.page,
            "admissible_commands": self.admissible(),
            "task_type": self.goal.get("category", ""),
            "goal": self.goal.get("instruction_text", ""),
            "anchor": obs,
            "state": obs + SEP + "chosen: " + ", ".join(f"{k}={v}" for k, v in sorted(s.options.items())),
            "env_failed": False,
            "step": self.steps,
        }


def done_details(parts: dict, goal: dict) -> list[str]:
    """The done page's reward details (WebShop's done page prints its reward breakdown too)."""
    n_opt = len(goal["goal_options"])
    return [
        "Reward Details",
        f"product type: {parts['r_type']}",
        f"attributes matched: {parts['attributes_matched']}/{len(goal['attributes'])}",
        f"options matched: {parts['options_matched']}/{n_opt}",
        f"price within limit: {'yes' if parts['price_ok'] else 'no'}",
    ]


def expert_action(session: ShopSession) -> str:
    """The next action of a shopper who knows the goal: search the goal's words, page to the goal's
    product (or, when the search missed it, the best-scoring listed product), choose the goal's
    options, buy."""
    s, goal, shop = session.state, session.goal, session.shop
    target = goal["asin"]
    if s.page == "search":
        return f"search[{search_keywords(goal['instruction_text'])}]"
    if s.page == "sub":
        return f"click[{PREV_PAGE}]"
    if s.page == "results":
        if target not in s.results and s.results:
            target = max(s.results, key=lambda a: _score_of(session, a))
        if target not in s.results:
            return f"click[{BACK_TO_SEARCH}]"
        where = s.results.index(target) // session.page_size + 1
        if where == s.page_no:
            return f"click[{target.lower()}]"
        return f"click[{NEXT_PAGE if where > s.page_no else PREV_PAGE}]"
    if s.page == "item":
        if s.asin != target and target in s.results:
            return f"click[{PREV_PAGE}]"
        product = shop.catalogue.by_asin[s.asin]
        for name, value in _wanted_options(product, goal).items():
            if s.options.get(name) != value:
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"
    return f"click[{BUY_NOW}]"


def _wanted_options(product: dict, goal: dict) -> dict[str, str]:
    """For each of the product's option axes, the value closest to one of the goal's options."""
    wanted = goal["goal_options"]
    wanted = list(wanted.values()) if isinstance(wanted, dict) else list(wanted)
    out = {}
    for name, values in product["options"].items():
        scored = [(v == w, token_set_score(v, w), -i, v) for w in wanted for i, v in enumerate(values)]
        best = max(scored, default=None)
        if best is not None and best[1] > 85:
            out[name] = best[3]
    return out


def _score_of(session: ShopSession, asin: str) -> float:
    product = session.shop.catalogue.by_asin[asin]
    opts = _wanted_options(product, session.goal)
    return purchase_score(product, session.goal, session.shop.catalogue.prices[asin], opts)["score"]
