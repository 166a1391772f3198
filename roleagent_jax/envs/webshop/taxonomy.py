"""WebShop's AIW failure types: names, analyst glosses, and words small models use for them.

Defined from the failures this shop produces (the paper's WebShop memory held 11 types): the agent
searches badly, opens or buys the wrong product, skips or misses options, ignores the budget, or
never buys (lost in paging, hopping between items, or just out of steps).
"""

from __future__ import annotations

from roleagent_jax.types import UNKNOWN

FAILURE_TYPES: dict[str, str] = {
    "action_format_error": "answers without a valid search[...] or click[...] action in the required format",
    "no_search": "never searched, so no product was ever listed",
    "wrong_search_terms": "searched with keywords that miss the product the instruction describes",
    "wrong_item": "bought a product of a different type than the one asked for",
    "missing_attribute": "bought a product that lacks an attribute the instruction asks for",
    "option_not_chosen": "bought without selecting every option (colour, size, ...) the instruction names",
    "wrong_option": "selected an option value other than the one asked for",
    "over_budget": "bought a product that costs more than the price limit",
    "paging_loop": "turned result pages back and forth instead of opening a product",
    "item_hopping": "kept opening products or their sub-pages without deciding to buy",
    "never_bought": "ran out of steps without clicking Buy Now",
}

FAILURE_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("format", "action_format_error"),
    ("invalid_action", "action_format_error"),
    ("no_search", "no_search"),
    ("never_search", "no_search"),
    ("keyword", "wrong_search_terms"),
    ("query", "wrong_search_terms"),
    ("search", "wrong_search_terms"),
    ("budget", "over_budget"),
    ("expensive", "over_budget"),
    ("price", "over_budget"),
    ("not_chosen", "option_not_chosen"),
    ("unselected", "option_not_chosen"),
    ("forgot", "option_not_chosen"),
    ("color", "wrong_option"),
    ("colour", "wrong_option"),
    ("size", "wrong_option"),
    ("option", "wrong_option"),
    ("attribute", "missing_attribute"),
    ("feature", "missing_attribute"),
    ("wrong_product", "wrong_item"),
    ("wrong_type", "wrong_item"),
    ("page", "paging_loop"),
    ("next", "paging_loop"),
    ("hopping", "item_hopping"),
    ("indecis", "item_hopping"),
    ("browsing", "item_hopping"),
    ("never_b", "never_bought"),
    ("did_not_buy", "never_bought"),
    ("no_purchase", "never_bought"),
    ("timeout", "never_bought"),
    ("out_of_steps", "never_bought"),
)

# type -> (lesson, query) templates; {p} is the task pattern, never the product
LESSONS: dict[str, tuple[str, str]] = {
    "action_format_error": (
        "In {p} tasks, always answer with one search[...] or click[...] action inside the action tags.",
        "{p}: invalid action format",
    ),
    "no_search": (
        "In {p} tasks, start by searching for the product the instruction names.",
        "{p}: never searched",
    ),
    "wrong_search_terms": (
        "In {p} tasks, search with the product noun and its key attributes from the instruction.",
        "{p}: search keywords missed the product",
    ),
    "wrong_item": (
        "In {p} tasks, open a product whose title names the kind of item asked for before buying.",
        "{p}: bought the wrong kind of product",
    ),
    "missing_attribute": (
        "In {p} tasks, check the title and features for every attribute the instruction lists.",
        "{p}: bought a product missing a required attribute",
    ),
    "option_not_chosen": (
        "In {p} tasks, click every option value the instruction names before Buy Now.",
        "{p}: bought without choosing the options",
    ),
    "wrong_option": (
        "In {p} tasks, click exactly the colour, size or flavour the instruction names.",
        "{p}: chose the wrong option value",
    ),
    "over_budget": (
        "In {p} tasks, compare the listed price with the price limit before opening a product.",
        "{p}: bought above the price limit",
    ),
    "paging_loop": (
        "In {p} tasks, open the best listed match instead of turning result pages back and forth.",
        "{p}: paging back and forth through results",
    ),
    "item_hopping": (
        "In {p} tasks, once a product matches, choose its options and buy instead of browsing on.",
        "{p}: opened products without deciding",
    ),
    "never_bought": (
        "In {p} tasks, keep the step budget in mind and click Buy Now once the product matches.",
        "{p}: never clicked Buy Now",
    ),
    UNKNOWN: (
        "In {p} tasks, search, open the matching product, choose its options and buy.",
        "{p}: failed",
    ),
}
