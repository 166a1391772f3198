"""A procedurally generated knowledge base of fictional entities, written as wiki-style passages.

The embedded default of the search-QA family: countries, cities, people and their works, linked by a
few relations (a city lies in a country and was founded in some year, a country has a capital city, a
person was born in a city in some year, a work has a creator and a year). Every name is made of
invented syllables, so no answer can be known without reading the corpus. The same (seed, size) always
gives the same knowledge base.

Each entity is one passage ('"Title"' + text, as in the Wikipedia corpora). Facts are written in one of
two phrasings per relation; `FACT_PATTERNS` holds the regular expressions that read them back, which
is what the expert uses to follow a chain of hops through retrieved text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from roleagent_jax.envs.search_qa.corpus import Passage

# ------------------------------------------------------------------------------------------- names

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "s")


@dataclass(frozen=True)
class Work:
    kind: str  # one of WORK_KINDS
    title: str
    creator: str  # person name
    year: int


@dataclass(frozen=True)
class Person:
    name: str
    occupation: str
    birth_year: int
    birthplace: str  # city name
    works: tuple[str, ...] = ()


@dataclass(frozen=True)
class City:
    name: str
    country: str
    founded: int


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    language: str


# kind -> (creator occupation, verb of creation, verb of the year, the creator's role noun)
WORK_KINDS: dict[str, tuple[str, str, str, str]] = {
    "novel": ("novelist", "written", "published", "author"),
    "poetry collection": ("poet", "written", "published", "poet"),
    "opera": ("composer", "composed", "premiered", "composer"),
    "film": ("director", "directed", "released", "director"),
    "painting": ("painter", "painted", "completed", "painter"),
}
OCCUPATIONS = tuple(dict.fromkeys(v[0] for v in WORK_KINDS.values()))
_TITLE_FORMS = ("{x}", "The {x} Letters", "Songs of {x}", "{x} at Dawn", "The Last {x}", "A Winter in {x}")


@dataclass(frozen=True)
class KBSize:
    """How many entities of each type; defaults give about 460 passages."""

    countries: int = 10
    cities: int = 50
    people: int = 160
    works: int = 240

    def __post_init__(self):
        if self.countries < 2 or self.cities < self.countries or self.people < 2 or self.works < 2:
            raise ValueError(
                f"knowledge base too small: {self} (need countries >= 2, cities >= countries, ...)"
            )


@dataclass
class KnowledgeBase:
    seed: int = 0
    countries: dict[str, Country] = field(default_factory=dict)
    cities: dict[str, City] = field(default_factory=dict)
    people: dict[str, Person] = field(default_factory=dict)
    works: dict[str, Work] = field(default_factory=dict)
    variants: dict[str, int] = field(default_factory=dict)  # entity -> which phrasing its passage uses

    def passages(self) -> list[Passage]:
        """One passage per entity, countries then cities, people, works (ids are the positions)."""
        out = []
        for kind, table in (("country", self.countries), ("city", self.cities), ("person", self.people),
                            ("work", self.works)):  # fmt: skip
            for name in table:
                out.append(Passage(name, _RENDER[kind](self, name, self.variants[name]), str(len(out))))
        return out

    def entity_type(self, name: str) -> str | None:
        for kind, table in (("country", self.countries), ("city", self.cities), ("person", self.people),
                            ("work", self.works)):  # fmt: skip
            if name in table:
                return kind
        return None


class _Namer:
    """Unique invented words; none collides with another name or with a word of the passage templates."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set(_RESERVED)

    def word(self, syllables: tuple[int, int] = (2, 3), suffixes: tuple[str, ...] = ("",)) -> str:
        for _ in range(10_000):
            n = self.rng.randint(*syllables)
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n)]
            w = "".join(parts) + self.rng.choice(_CODAS) + self.rng.choice(suffixes)
            if 4 <= len(w) <= 14 and w not in self.used:
                self.used.add(w)
                return w.capitalize()
        raise RuntimeError("ran out of invented names; lower the knowledge-base size")


def _list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def generate_kb(seed: int = 0, size: KBSize | None = None) -> KnowledgeBase:
    """The knowledge base of `seed` (deterministic)."""
    size = size or KBSize()
    rng = random.Random(f"kb:{seed}")
    namer = _Namer(rng)
    kb = KnowledgeBase(seed)
    country_names = [namer.word((2, 2), ("ia", "and", "or", "ar")) for _ in range(size.countries)]
    for i in range(size.cities):
        country = country_names[i % size.countries]  # every country gets at least one city
        name = namer.word((1, 2), ("", "", "burg", "mouth", "ford", "holm"))
        kb.cities[name] = City(name, country, rng.randint(900, 1850))
    cities = list(kb.cities)
    for c in country_names:
        own = [x for x in cities if kb.cities[x].country == c]
        kb.countries[c] = Country(c, rng.choice(own), c.rstrip("aeiouynd") + "ish")
    firsts = [namer.word((2, 2)) for _ in range(max(8, size.people // 8))]
    people = []
    for i in range(size.people):
        occupation = OCCUPATIONS[i % len(OCCUPATIONS)]
        people.append(
            [f"{rng.choice(firsts)} {namer.word()}", occupation, rng.randint(1700, 1960), rng.choice(cities)]
        )
    works_of: dict[str, list[str]] = {p[0]: [] for p in people}
    by_occupation = {o: [p for p in people if p[1] == o] for o in OCCUPATIONS}
    kinds = list(WORK_KINDS)
    for i in range(size.works):
        kind = kinds[i % len(kinds)]
        creator = rng.choice(by_occupation[WORK_KINDS[kind][0]])
        title = rng.choice(_TITLE_FORMS).format(x=namer.word())
        year = creator[2] + rng.randint(20, 60)
        kb.works[title] = Work(kind, title, creator[0], year)
        works_of[creator[0]].append(title)
    for name, occupation, year, city in people:
        kb.people[name] = Person(name, occupation, year, city, tuple(works_of[name]))
    for name in [*kb.countries, *kb.cities, *kb.people, *kb.works]:
        kb.variants[name] = rng.randint(0, 1)
    return kb


# --------------------------------------------------------------------------------- passage text


def _country_text(kb: KnowledgeBase, name: str, v: int) -> str:
    c = kb.countries[name]
    others = [x for x in kb.cities if kb.cities[x].country == name and x != c.capital][:3]
    first = (f"{name} is a country whose capital is {c.capital}.", f"The capital of {name} is {c.capital}.")[
        v
    ]
    rest = f" Its official language is {c.language}."
    if others:
        rest += f" Other cities of {name} include {_list(others)}."
    return first + rest


def _city_text(kb: KnowledgeBase, name: str, v: int) -> str:
    c = kb.cities[name]
    first = (
        f"{name} is a city in {c.country}, founded in {c.founded}.",
        f"Founded in {c.founded}, {name} is a town in {c.country}.",
    )[v]
    natives = [p for p in kb.people if kb.people[p].birthplace == name][:2]
    return first + (f" Notable people from {name} include {_list(natives)}." if natives else "")


def _person_text(kb: KnowledgeBase, name: str, v: int) -> str:
    p = kb.people[name]
    surname = name.split()[-1]
    first = (
        f"{name} (born {p.birth_year} in {p.birthplace}) is a {p.occupation}.",
        f"{name} is a {p.occupation} who was born in {p.birthplace} in {p.birth_year}.",
    )[v]
    if not p.works:
        return first
    titles = list(p.works[:3])
    return (
        first
        + (f" {surname} is known for {_list(titles)}.", f" Works by {surname} include {_list(titles)}.")[v]
    )


def _work_text(kb: KnowledgeBase, name: str, v: int) -> str:
    w = kb.works[name]
    _, made, dated, _ = WORK_KINDS[w.kind]
    return (
        f"{name} is a {w.year} {w.kind} by {w.creator}.",
        f"{name} is a {w.kind} {made} by {w.creator}, {dated} in {w.year}.",
    )[v]


_RENDER = {"country": _country_text, "city": _city_text, "person": _person_text, "work": _work_text}
_RESERVED = frozenset(
    "the a an and or of in is was who born city town country capital official language other cities "
    "include founded notable people from known for works by written composed directed painted "
    "published premiered released completed letters songs at dawn last winter novel poetry collection "
    "opera film painting novelist poet composer director painter its whose".split()
)

# relation -> regular expressions reading the value out of the entity's own passage text
_NAME = r"([A-Z][^,.()]*?)"
FACT_PATTERNS: dict[str, tuple[re.Pattern, ...]] = {
    "capital": (re.compile(rf"capital is {_NAME}\."), re.compile(rf"capital of [^.]+? is {_NAME}\.")),
    "country": (re.compile(rf"is a (?:city|town) in {_NAME}[,.]"),),
    "founded": (re.compile(r"[Ff]ounded in (\d{3,4})"),),
    "birthplace": (re.compile(rf"\(born \d{{3,4}} in {_NAME}\)"), re.compile(rf"was born in {_NAME} in \d")),
    "birth_year": (re.compile(r"\(born (\d{3,4}) in "), re.compile(r"was born in .+? in (\d{3,4})\.")),
    "creator": (re.compile(rf"\bby {_NAME}[,.]"),),
    "year": (re.compile(r"is a (\d{3,4}) "), re.compile(r"\b(?:published|premiered|released|completed) in (\d{3,4})\.")),
}  # fmt: skip
RELATION_VALUE = {  # relation -> the attribute of the entity record that holds its value
    "capital": ("country", "capital"),
    "country": ("city", "country"),
    "founded": ("city", "founded"),
    "birthplace": ("person", "birthplace"),
    "birth_year": ("person", "birth_year"),
    "creator": ("work", "creator"),
    "year": ("work", "year"),
}


def read_fact(text: str, relation: str) -> str | None:
    """The value of `relation` as an entity's passage states it (None when the text does not say)."""
    for pattern in FACT_PATTERNS[relation]:
        m = pattern.search(text)
        if m:
            return m.group(1).strip()
    return None


def fact(kb: KnowledgeBase, entity: str, relation: str) -> str:
    """The true value of `relation` for `entity`, from the records (what read_fact must recover)."""
    kind, attr = RELATION_VALUE[relation]
    table = {"country": kb.countries, "city": kb.cities, "person": kb.people, "work": kb.works}[kind]
    return str(getattr(table[entity], attr))
