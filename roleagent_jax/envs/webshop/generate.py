"""A procedurally generated shop in WebShop's exact file format: the embedded default.

Products come from 25 product families in WebShop's five categories (fashion, beauty, electronics,
food, furniture). A family fixes the query, the category path, the product nouns, a pool of
attributes, option axes (colour, size, flavour, ...) and a price range; each product draws a brand,
a noun, 3-4 attributes, 2-5 values per option axis and a price, and gets human-style instructions
("i need a non slip running shoes with rubber sole, in black color and size 9"), one by default, each
naming 1-3 of its attributes and one value per option axis. The loader adds the price cap as WebShop does.

One family per category is *unseen*: its goals form the gen_unseen split and never appear in
training; its products are still in the shop (as search distractors). Everything is a function of
the seed. The files are written with WebShop's names, plus ``shop.json`` (the family of each asin).
"""

from __future__ import annotations

import json
import os
import random
import string
from dataclasses import dataclass
from pathlib import Path

from roleagent_jax.envs.webshop.catalog import ATTRIBUTES_FILE, HUMAN_FILE, PRODUCTS_FILE

MANIFEST = "shop.json"
FORMAT_VERSION = 1

_COLORS = (
    "black", "white", "navy", "grey", "red", "blue", "green", "pink", "beige", "brown", "purple", "yellow",
    "khaki", "olive",
)  # fmt: skip
_CLOTHES = ("small", "medium", "large", "x-large", "xx-large")


@dataclass(frozen=True)
class Family:
    key: str
    category: str  # WebShop's goal category
    query: str
    product_category: str
    nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    unseen: bool = False


def _f(key, category, query, path, nouns, attrs, options, price, unseen=False) -> Family:
    return Family(
        key, category, query, path, tuple(nouns), tuple(attrs),
        tuple((k, tuple(v)) for k, v in options.items()), price, unseen,
    )  # fmt: skip


FAMILIES: tuple[Family, ...] = (
    _f("sneakers", "fashion", "men's sneakers", "Clothing, Shoes & Jewelry › Men › Shoes › Fashion Sneakers",
       ["sneakers", "running shoes", "walking shoes"],
       ["non slip", "rubber sole", "lace up", "arch support", "memory foam", "breathable mesh", "lightweight"],
       {"color": _COLORS[:10], "size": ("7", "8", "9", "10", "11", "12")}, (25, 90)),
    _f("tshirt", "fashion", "women's t-shirts",
       "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses › T-Shirts",
       ["t-shirt", "tee shirt", "tunic top"],
       ["short sleeve", "long sleeve", "cotton", "loose fit", "v neck", "machine wash", "crew neck"],
       {"color": _COLORS, "size": _CLOTHES}, (10, 35)),
    _f("jeans", "fashion", "men's jeans", "Clothing, Shoes & Jewelry › Men › Clothing › Jeans",
       ["jeans", "denim pants"],
       ["slim fit", "straight leg", "stretch", "button closure", "machine wash", "relaxed fit"],
       {"color": ("black", "blue", "grey", "khaki", "navy", "brown"),
        "size": ("30w x 30l", "32w x 32l", "34w x 32l", "36w x 34l", "38w x 34l")}, (20, 70)),
    _f("dress", "fashion", "women's dresses", "Clothing, Shoes & Jewelry › Women › Clothing › Dresses",
       ["dress", "maxi dress", "midi dress"],
       ["floral print", "sleeveless", "high waist", "polyester", "hand wash", "elastic waist"],
       {"color": _COLORS, "size": _CLOTHES}, (18, 60)),
    _f("socks", "fashion", "men's socks", "Clothing, Shoes & Jewelry › Men › Clothing › Socks",
       ["socks", "crew socks", "ankle socks"],
       ["moisture wicking", "cushioned", "cotton blend", "machine wash", "arch compression"],
       {"color": _COLORS[:8], "size": ("pack of 3", "pack of 6", "pack of 12")}, (8, 30), True),
    _f("shampoo", "beauty", "shampoo",
       "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
       ["shampoo", "hair shampoo", "shampoo and conditioner set"],
       ["sulfate free", "paraben free", "tea tree", "argan oil", "natural ingredients", "dry hair",
        "cruelty free"],
       {"size": ("8 fl oz", "16 fl oz", "32 fl oz"), "scent": ("coconut", "lavender", "mint", "unscented")},
       (8, 40)),
    _f("lipstick", "beauty", "lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick",
       ["lipstick", "lip gloss", "liquid lipstick"],
       ["long lasting", "matte finish", "waterproof", "cruelty free", "moisturizing", "vegan"],
       {"color": ("red", "pink", "plum", "coral", "nude", "berry", "wine")}, (6, 28)),
    _f("moisturizer", "beauty", "face moisturizer",
       "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
       ["face moisturizer", "face cream", "night cream"],
       ["hyaluronic acid", "fragrance free", "sensitive skin", "anti aging", "oil free", "dermatologist tested"],
       {"size": ("1.7 oz", "2.5 oz", "3.4 oz")}, (12, 55)),
    _f("hair_ext", "beauty", "hair extensions",
       "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories › Extensions",
       ["hair extensions", "clip in hair extensions", "wig"],
       ["natural looking", "human hair", "heat resistant", "straight hair", "long hair"],
       {"color": ("black", "brown", "blonde", "red", "grey"), "size": ("14 inch", "18 inch", "22 inch")},
       (20, 90)),
    _f("nail", "beauty", "nail polish", "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Polish",
       ["nail polish", "gel nail polish"],
       ["long lasting", "quick dry", "non toxic", "chip resistant", "high gloss"],
       {"color": ("red", "pink", "nude", "purple", "blue", "black", "white")}, (5, 22), True),
    _f("headphones", "electronics", "wireless headphones",
       "Electronics › Headphones, Earbuds & Accessories › Headphones › Over-Ear Headphones",
       ["headphones", "wireless earbuds", "over ear headphones"],
       ["noise cancelling", "bluetooth", "long battery life", "built in microphone", "fast charging",
        "water resistant"],
       {"color": ("black", "white", "blue", "red", "pink", "grey")}, (20, 150)),
    _f("phone_case", "electronics", "phone case",
       "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
       ["phone case", "iphone case", "protective case"],
       ["shockproof", "slim", "wireless charging compatible", "scratch resistant", "kickstand", "clear"],
       {"color": _COLORS[:9], "size": ("iphone 13", "iphone 14", "iphone 14 pro", "iphone 15")}, (8, 30)),
    _f("cable", "electronics", "usb c cable", "Electronics › Computers & Accessories › Cables › USB Cables",
       ["usb c cable", "charging cable", "lightning cable"],
       ["fast charging", "braided", "durable", "data transfer", "high speed"],
       {"color": ("black", "white", "grey", "red", "blue"), "size": ("3 ft", "6 ft", "10 ft")}, (6, 25)),
    _f("charger", "electronics", "portable charger",
       "Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
       ["portable charger", "power bank"],
       ["fast charging", "usb c", "high capacity", "compact", "led display"],
       {"color": ("black", "white", "blue", "pink"), "capacity": ("10000mah", "20000mah", "26800mah")},
       (15, 60)),
    _f("speaker", "electronics", "bluetooth speaker",
       "Electronics › Portable Audio & Video › Portable Bluetooth Speakers",
       ["bluetooth speaker", "portable speaker"],
       ["waterproof", "wireless", "stereo sound", "long battery life", "hands free"],
       {"color": ("black", "blue", "red", "grey", "green")}, (20, 120), True),
    _f("coffee", "food", "ground coffee", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee",
       ["ground coffee", "coffee beans", "coffee pods"],
       ["dark roast", "medium roast", "decaf", "organic", "fair trade", "non gmo"],
       {"flavor name": ("original", "vanilla", "hazelnut", "caramel", "mocha"),
        "size": ("12 ounce", "pack of 2", "pack of 4")}, (8, 45)),
    _f("bars", "food", "protein bars", "Grocery & Gourmet Food › Snacks & Sweets › Snack Bars",
       ["protein bars", "snack bars", "cookies"],
       ["gluten free", "low sugar", "high protein", "keto friendly", "dairy free", "individually wrapped"],
       {"flavor name": ("chocolate", "peanut butter", "cookie dough", "almond", "berry"),
        "size": ("12 count", "pack of 6", "pack of 12")}, (10, 45)),
    _f("tea", "food", "herbal tea", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea",
       ["green tea", "herbal tea", "tea bags"],
       ["caffeine free", "organic", "non gmo", "sugar free", "kosher"],
       {"flavor name": ("peppermint", "chamomile", "ginger", "lemon", "jasmine"),
        "size": ("20 count", "40 count", "100 count")}, (5, 30)),
    _f("jerky", "food", "beef jerky", "Grocery & Gourmet Food › Meat & Seafood › Jerky & Dried Meats",
       ["beef jerky", "meat sticks"],
       ["high protein", "low fat", "gluten free", "grass fed", "no preservatives"],
       {"flavor name": ("original", "teriyaki", "peppered", "sweet and spicy"),
        "size": ("2.5 ounce", "pack of 3", "pack of 10")}, (7, 40)),
    _f("olive_oil", "food", "olive oil", "Grocery & Gourmet Food › Pantry Staples › Oils › Olive Oil",
       ["olive oil", "extra virgin olive oil"],
       ["cold pressed", "organic", "non gmo", "kosher", "glass bottle"],
       {"size": ("16.9 fl oz", "25.3 fl oz", "33.8 fl oz")}, (9, 40), True),
    _f("chair", "furniture", "office chair", "Home & Kitchen › Furniture › Home Office Furniture › Chairs",
       ["office chair", "desk chair", "gaming chair"],
       ["lumbar support", "adjustable height", "high back", "ergonomic design", "swivel", "easy assembly"],
       {"color": ("black", "white", "grey", "blue", "red", "pink")}, (50, 250)),
    _f("shelf", "furniture", "bookshelf",
       "Home & Kitchen › Furniture › Living Room Furniture › Bookcases",
       ["bookshelf", "bookcase", "storage shelf"],
       ["easy assembly", "solid wood", "5 tier", "space saving", "industrial style"],
       {"color": ("black", "white", "walnut", "brown", "grey")}, (40, 200)),
    _f("ottoman", "furniture", "ottoman bench",
       "Home & Kitchen › Furniture › Living Room Furniture › Ottomans",
       ["ottoman", "storage bench", "footstool"],
       ["faux leather", "storage space", "living room", "tufted", "solid wood legs"],
       {"color": ("black", "beige", "grey", "brown", "navy", "green"), "size": ("small", "medium", "large")},
       (30, 150)),
    _f("sheets", "furniture", "queen sheet set", "Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
       ["sheet set", "bed sheets", "duvet cover"],
       ["deep pocket", "machine wash", "microfiber", "wrinkle free", "hypoallergenic", "egyptian cotton"],
       {"color": _COLORS[:10], "size": ("twin", "full", "queen", "king")}, (20, 90)),
    _f("rug", "furniture", "area rug", "Home & Kitchen › Home Décor Products › Area Rugs, Runners & Pads › Area Rugs",
       ["area rug", "runner rug"],
       ["non slip", "machine washable", "living room", "low pile", "stain resistant"],
       {"color": ("grey", "beige", "blue", "red", "green", "black"), "size": ("2x3", "5x7", "8x10")},
       (25, 160), True),
)  # fmt: skip
CATEGORIES = ("fashion", "beauty", "electronics", "food", "furniture")

_SYLLABLES = (
    "zor",
    "lu",
    "ma",
    "vik",
    "ten",
    "ro",
    "sa",
    "ka",
    "nel",
    "dri",
    "bo",
    "qui",
    "fa",
    "ren",
    "tos",
)
_PHRASE = {"color": "{} color", "size": "size {}", "flavor name": "{} flavor", "scent": "{} scent"}
_STARTS = ("i need", "i'm looking for", "i want", "find me", "i am looking for", "get me")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _title(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split())


def _asin(rng: random.Random, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in used:
            used.add(asin)
            return asin


def _product(fam: Family, rng: random.Random, asin: str, n_goals: int) -> tuple[dict, dict, list[dict]]:
    """(raw product, attribute record, `n_goals` human instructions) for one product of `fam`."""
    brand = "".join(rng.sample(_SYLLABLES, 2)).capitalize()
    noun = rng.choice(fam.nouns)
    attrs = rng.sample(fam.attributes, min(len(fam.attributes), rng.randint(3, 4)))
    title = f"{brand} {_title(attrs[0])} {_title(noun)} - {_title(attrs[1])}, {_title(attrs[2])}"
    options = {}
    for name, pool in fam.options:
        k = min(len(pool), rng.randint(2, 5))
        options[name] = sorted(rng.sample(pool, k), key=pool.index)
    lo, hi = fam.price
    price = round(rng.uniform(lo, hi)) - 0.01
    pricing = f"${price:.2f}"
    if rng.random() < 0.1:
        pricing += f"${price + round(rng.uniform(2, 10)):.2f}"
    bullets = [f"{_title(a)}: made for everyday use, this {noun} is {a}." for a in attrs[1:]]
    description = f"{brand} {noun}. Designed with {attrs[0]} for comfort and value; {', '.join(attrs[1:])}."
    raw = {
        "asin": asin,
        "name": title,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "customization_options": {
            name: [{"value": v, "image": None} for v in values] for name, values in options.items()
        },
        "images": [""],
        "category": fam.category,
        "query": fam.query,
        "product_category": fam.product_category,
    }
    human = [_instruction(rng, asin, noun, attrs, options)]
    # More instructions come from a stream of their own (so the products do not depend on how many), each
    # unlike the earlier ones where the product allows it
    extra = random.Random(f"webshop-goals:{asin}")
    for _ in range(n_goals - 1):
        for _ in range(20):
            ins = _instruction(extra, asin, noun, attrs, options)
            if all(ins["instruction"] != h["instruction"] for h in human):
                break
        human.append(ins)
    attributes = {
        "attributes": attrs,
        "instruction": human[0]["instruction"],
        "instruction_attributes": human[0]["instruction_attributes"],
    }
    return raw, attributes, human


def _instruction(rng: random.Random, asin: str, noun: str, attrs: list[str], options: dict) -> dict:
    """One human-style instruction for a product: 1-3 of its attributes and one value per option axis."""
    wanted = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
    chosen = [rng.choice(values) for values in options.values()]
    head = wanted[0]
    text = f"{rng.choice(_STARTS)} {_article(head)} {head} {noun}"
    if len(wanted) > 1:
        text += " with " + " and ".join(wanted[1:])
    phrases = [_PHRASE.get(name, "{} " + name).format(v) for name, v in zip(options, chosen)]
    if phrases:
        text += ", in " + " and ".join(phrases)
    return {
        "asin": asin,
        "instruction": text,
        "instruction_attributes": wanted,
        "instruction_options": chosen,
    }


@dataclass(frozen=True)
class GeneratedShop:
    folder: Path
    family_of: dict[str, str]  # asin -> family key


def generate(
    folder: str | os.PathLike, seed: int, n_products: int = 1000, goals_per_product: int = 1
) -> GeneratedShop:
    """Write (or reuse, when it is already there with the same settings) a generated shop.

    `goals_per_product` > 1 gives each product that many instructions (other attributes, option values
    and price caps), as WebShop's human file often does: its goal split then puts goals on the same
    product on both sides, so held-out goals ask for new combinations on products seen in training."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    settings = {"seed": seed, "n_products": n_products, "version": FORMAT_VERSION}
    if goals_per_product != 1:
        settings["goals_per_product"] = goals_per_product
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        if data.get("settings") == settings:
            return GeneratedShop(folder, data["family_of"])
    if n_products < len(FAMILIES):
        raise ValueError(f"n_products must be >= {len(FAMILIES)} (one per family), got {n_products}")
    if goals_per_product < 1:
        raise ValueError(f"goals_per_product must be >= 1, got {goals_per_product}")
    rng = random.Random(f"webshop-gen:{seed}")
    used: set[str] = set()
    raws, attrs, human, family_of = [], {}, {}, {}
    for i in range(n_products):
        fam = FAMILIES[i % len(FAMILIES)]
        asin = _asin(rng, used)
        raw, attr, ins = _product(fam, rng, asin, goals_per_product)
        raws.append(raw)
        attrs[asin] = attr
        human[asin] = ins
        family_of[asin] = fam.key
    rng.shuffle(raws)  # WebShop's product file is shuffled too
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in ((PRODUCTS_FILE, raws), (ATTRIBUTES_FILE, attrs), (HUMAN_FILE, human)):
        tmp = folder / (name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, folder / name)
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"settings": settings, "family_of": family_of}))
    os.replace(tmp, manifest)
    return GeneratedShop(folder, family_of)
