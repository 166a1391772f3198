"""What a sampler call runs, decided from its requests alone (no model, no device): which requests run
now, how they split into chunks (one jitted prefill and decode loop each), and each chunk's padded
shapes: batch rows, prompt bucket, new-token bucket and shared-prefix layout.

Padding is paid for: every prompt slot of every row is prefilled and every row takes part in every
decode step, whether a request fills it or not. A call may therefore be cut into chunks of similar
prompt length, so that short prompts are not padded to the longest one (nor a sharing group's short
suffixes to an ungrouped row's whole prompt): of the cuts of its requests sorted by prompt length, the
cheapest under `CostModel` is taken when it beats consecutive chunks in request order (otherwise
those, as before). Sharing groups stay whole within a chunk. Background rows beside foreground ones
stay together in one chunk, which runs last: they decode only while a foreground row does, in their
chunk or (the longest response of the others) in the call's other chunks, exactly as in one chunk. A
chunk's shapes do not change what its rows compute, only how much padding comes with them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from roleagent_jax.sampling.prefix import (
    PrefixLayout,
    chunk_by_group,
    group_units,
    layout_of_groups,
    sharing_groups,
)
from roleagent_jax.sampling.requests import SampleRequest

# Steps of a quarter to a half above 32 rows: one call's rows (agent rows plus however many predictions
# are still running, or a 96-game evaluation panel) rarely sit just under a power of two, and a call
# rounded up to the next one would spend up to half its compute on empty rows.
BATCH_BUCKETS = (8, 16, 32, 48, 64, 96, 128, 160, 192, 256)
# Steps of 1.5x above 128 tokens, for the same reason: prompts that grow by a retrieved passage or a
# page per turn (search-QA: 113, 250, then 400 tokens) would otherwise pad up to 2x at every step.
PROMPT_BUCKETS = (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def capped_batch_buckets(max_rows: int) -> tuple[int, ...]:
    """The batch buckets capped at `max_rows` (0 = the default set). Requests beyond the largest bucket
    are generated in consecutive chunks, so the cap bounds one call's KV cache and prefill memory."""
    if max_rows < 0:
        raise ValueError(f"max_rows_per_call must be >= 0, got {max_rows}")
    if not max_rows:
        return BATCH_BUCKETS
    return tuple(b for b in BATCH_BUCKETS if b < max_rows) + (max_rows,)


def bucket(n: int, buckets: Sequence[int], what: str, hint: str) -> int:
    """The smallest bucket that holds ``n``; past the largest, an error naming ``what`` and a fix."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{what} {n} exceeds the largest bucket {buckets[-1]}: {hint}")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _sizes(name: str, sizes: Sequence[int]) -> tuple[int, ...]:
    out = tuple(sorted({int(b) for b in sizes}))
    if not out or out[0] < 1:
        raise ValueError(f"{name} must be a non-empty list of positive sizes, got {sizes!r}")
    return out


@dataclass(frozen=True)
class Buckets:
    """The sizes a sampler rounds its shapes to (sorted). ``row_multiple``: the batch shards (data x
    fsdp mesh axes); a call's rows are a multiple of it."""

    batch: tuple[int, ...]
    prompt: tuple[int, ...]
    new_tokens: tuple[int, ...]
    row_multiple: int = 1

    @classmethod
    def make(
        cls,
        batch: Sequence[int] = BATCH_BUCKETS,
        prompt: Sequence[int] = PROMPT_BUCKETS,
        max_new_tokens_cap: int = 512,
        new_tokens: Sequence[int] | None = None,
        row_multiple: int = 1,
    ) -> Buckets:
        """Checked buckets; new-token buckets default to the powers of two from 16 below the cap, and
        always end at the cap."""
        if max_new_tokens_cap < 1:
            raise ValueError(f"max_new_tokens_cap must be >= 1, got {max_new_tokens_cap}")
        if new_tokens is None:
            new_tokens = [b for b in (2**k for k in range(4, 20)) if b < max_new_tokens_cap]
        capped = [b for b in new_tokens if b <= max_new_tokens_cap] + [max_new_tokens_cap]
        return cls(_sizes("batch_buckets", batch), _sizes("prompt_buckets", prompt),
                   _sizes("new_token_buckets", capped), int(row_multiple))  # fmt: skip

    @property
    def max_rows(self) -> int:
        """Requests one chunk holds: the largest batch bucket, a multiple of the batch shards."""
        top = self.batch[-1]
        return top - top % self.row_multiple or self.row_multiple


@dataclass(frozen=True)
class CostModel:
    """A chunk's cost in prefilled prompt tokens: its padded prefill, plus per decode step
    ``row_step`` for each of its rows and ``step`` for the step itself (reading every weight once).

    On a CPU (`CPU`) a row's decode step costs about two prefilled tokens and reading the weights about
    twenty: on the 2-core CPU that records the search-QA calls, SmolLM2-135M prefills a token in about
    2.6 ms and a 32-row step of 576 cache slots takes about 0.2 s (= 2 x 32 + 20 tokens); reading its
    fp32 weights (540 MB) at about 10 GB/s takes 54 ms. On an accelerator (`ACCELERATOR`) a decode
    step is bound by that read and by kernel launches while prefill runs at the chip's matmul rate, so
    a step is worth thousands of prefilled tokens and a call is cut only for very large savings.

    ``compile``: what each distinct chunk shape of a call costs on top, its prefill and decode programs
    compiled. The plan reads only its requests (a resumed run, and `evaluate --checkpoint`, must cut a
    call as the run did, or their draws differ), so it cannot know which shapes a sampler compiled
    before: every call pays for its shapes, a compile spread over the calls of a run that meet it
    again. On the 2-core CPU a SmolLM2 chunk's two programs take about 16 s (a search-QA iteration with
    2 more of them took 15.6 s longer), about 6,000 of its prefilled tokens; spread over a CPU run's
    6-10 iterations, `CPU` charges 1,000. A compile takes about as long whatever the model's size while
    a position costs in proportion to its weights, so `cost_model` scales the charge by
    `SMOLLM2_WEIGHTS` over the model's: the demo's tiny model (0.7 M weights) is charged about
    190,000 positions a shape, so its calls practically never cut. An
    accelerator's run is long (hundreds of iterations), so there a new program pays for itself and is
    not charged.
    """

    row_step: float
    step: float
    compile: float = 0.0

    def of(self, prefill_positions: int, steps: int, rows: int) -> float:
        return prefill_positions + steps * (self.row_step * rows + self.step)


CPU = CostModel(row_step=2.0, step=20.0, compile=1000.0)
SMOLLM2_WEIGHTS = 134_479_872  # `Qwen2Config.matmul_weights` of SmolLM2-135M, the model `CPU` was measured on
ACCELERATOR = CostModel(row_step=1.0, step=4096.0)


def cost_model(platform: str, weights: int) -> CostModel:
    """The cost model of a JAX platform name ("cpu", "gpu", "tpu", ...) for a model of ``weights``
    matmul weights (`Qwen2Config.matmul_weights`)."""
    if platform != "cpu":
        return ACCELERATOR
    return replace(CPU, compile=CPU.compile * SMOLLM2_WEIGHTS / weights)


@dataclass(frozen=True)
class Chunk:
    """One jitted generation: its requests (indices into the call's requests, in row order) and shapes.

    batch: the batch bucket of its requests (the plain layout's rows, idle ones included).
    prompt_bucket: prompt slots per row (with a shared prefix: the rows' own suffix bucket).
    new_tokens: the new-token bucket (the cache's slots after the prompt).
    steps: the most decode steps it may run (its largest token budget).
    layout: its shared-prefix layout (None: the plain per-row layout).
    real_tokens: its requests' prompt tokens.
    """

    requests: tuple[int, ...]
    batch: int
    prompt_bucket: int
    new_tokens: int
    steps: int
    layout: PrefixLayout | None
    real_tokens: int

    @property
    def rows(self) -> int:
        return self.batch if self.layout is None else self.layout.rows

    @property
    def prefill_positions(self) -> int:
        """Prompt slots prefilled: every row's, plus each shared prefix once."""
        shared = 0 if self.layout is None else self.layout.groups * self.layout.prefix_bucket
        return self.rows * self.prompt_bucket + shared

    @property
    def shape(self) -> tuple:
        """What its compiled programs are specialised to: rows, prompt and new-token buckets, and the
        shared prefix's groups and bucket (the sampler's compile key, less the call's sampling mode and
        the prefill's scored tail, which the requests' `score_tokens` set)."""
        prefix = None if self.layout is None else (self.layout.groups, self.layout.prefix_bucket)
        return (self.rows, self.prompt_bucket, self.new_tokens, prefix)

    def cost(self, model: CostModel) -> float:
        """Its prefill and decode, and its shape's compile."""
        return self.work(model) + model.compile

    def work(self, model: CostModel) -> float:
        return model.of(self.prefill_positions, self.steps, self.rows)


@dataclass(frozen=True)
class CallPlan:
    """What one `Sampler.generate` call runs.

    requests: the requests as run: a background row beside foreground ones capped at the foreground's
        largest token budget, groups dropped in a call of background rows only after a foreground one.
    chunks: in the order they run (chunk ``c`` draws with the call's key folded with ``c``).
    waiting: background requests that do not run now (see `admitted`).
    foreground_rows: with a foreground request, the batch bucket of the requests it runs (at most one
        chunk's); else 0.
    """

    requests: list[SampleRequest]
    chunks: list[Chunk]
    waiting: tuple[int, ...]
    foreground_rows: int

    @property
    def prefill_positions(self) -> int:
        return sum(c.prefill_positions for c in self.chunks)

    @property
    def real_tokens(self) -> int:
        return sum(c.real_tokens for c in self.chunks)

    def cost(self, model: CostModel) -> float:
        return chunks_cost(self.chunks, model)


def chunks_cost(chunks: Sequence[Chunk], model: CostModel) -> float:
    """The chunks' prefill and decode, and one compile for each distinct shape among them."""
    return sum(c.work(model) for c in chunks) + model.compile * len({c.shape for c in chunks})


def sharing_key(r: SampleRequest) -> Hashable | None:
    """Requests share prompt prefixes within one role and group."""
    return None if r.group is None else (r.role, r.group)


Sharing = tuple[list[tuple[list[int], int]], list[int]]  # `prefix.sharing_groups` of a chunk's requests


def _sharing(reqs: Sequence[SampleRequest]) -> Sharing:
    prompts = [r.prompt_ids for r in reqs]
    return sharing_groups(prompts, [sharing_key(r) for r in reqs], keep=[r.score_tokens + 1 for r in reqs])


def chunk_plan(
    requests: Sequence[SampleRequest],
    idx: Sequence[int],
    buckets: Buckets,
    min_rows: int = 0,
    sharing: Sharing | None = None,
) -> Chunk:
    """The shapes the sampler runs requests ``idx`` in, as one chunk padded to at least ``min_rows``.
    ``sharing``: their `prefix.sharing_groups` (positions in ``idx``), when already known."""
    reqs = [requests[i] for i in idx]
    batch = bucket(max(len(reqs), min_rows), buckets.batch, "batch size", "raise batch_buckets")
    batch = _round_up(batch, buckets.row_multiple)
    longest = max(len(r.prompt_ids) for r in reqs)
    plen = bucket(longest, buckets.prompt, "prompt length", "truncate prompts or add a prompt bucket")
    budget = max(r.max_new_tokens for r in reqs)
    new_tokens = bucket(budget, buckets.new_tokens, "max_new_tokens", "raise the cap")
    layout = None
    if any(r.group is not None for r in reqs):
        if sharing is None:
            sharing = _sharing(reqs)
        layout = layout_of_groups(
            [len(r.prompt_ids) for r in reqs],
            *sharing,
            new_tokens=new_tokens,
            prompt_buckets=buckets.prompt,
            batch_buckets=buckets.batch,
            row_multiple=buckets.row_multiple,
        )
    width = plen if layout is None else layout.suffix_bucket
    real = sum(len(r.prompt_ids) for r in reqs)
    return Chunk(tuple(idx), batch, width, new_tokens, budget, layout, real)


def admitted(requests: Sequence[SampleRequest], buckets: Buckets, size: int) -> set[int]:
    """Indices of the requests a call runs: every foreground request, and background requests (in
    order) while they fit the idle rows of the foreground's batch bucket and its prompt bucket.

    Every row of a bucket costs its prefill and each decode step whether it serves a request or idles,
    so a background row placed there is free; one that would raise the bucket would make every decode
    step of the call dearer, which on a CPU (every row costs compute) or with long agent responses
    (predictions done after a few steps, their rows then idle) costs far more than running it later.
    With no foreground request, every request runs (to its end)."""
    fg = [i for i, r in enumerate(requests) if not r.background]
    if not fg or len(fg) == len(requests):
        return set(range(len(requests)))
    run = set(fg)
    if len(fg) > size:
        return run
    rows = bucket(len(fg), buckets.batch, "batch size", "raise batch_buckets")
    spare = _round_up(rows, buckets.row_multiple) - len(fg)
    width = bucket(max(len(requests[i].prompt_ids) for i in fg), buckets.prompt, "prompt length",
                   "truncate prompts or add a prompt bucket")  # fmt: skip
    for i, r in enumerate(requests):
        if spare and r.background and len(r.prompt_ids) <= width:
            run.add(i)
            spare -= 1
    return run


def by_length(
    requests: Sequence[SampleRequest], units: list[list[int]], size: int, buckets: Buckets, model: CostModel
) -> list[Chunk]:
    """The cheapest chunks of at most ``size`` requests that cut ``units`` (index lists that must share
    a chunk), sorted by their longest prompt, into consecutive runs; ties go to fewer chunks. Chunks
    come shortest prompts first. Each chunk is charged a compile (two chunks of one shape both: a bias
    toward fewer chunks; `plan_call` compares the cut's true cost with the call's in request order)."""
    units = sorted(units, key=lambda u: max(len(requests[i].prompt_ids) for i in u))
    longest = [max(len(requests[i].prompt_ids) for i in u) for u in units]
    budget = [max(requests[i].max_new_tokens for i in u) for u in units]
    grouped = [any(requests[i].group is not None for i in u) for u in units]
    # a unit is one sharing group (or a part of one, never beside another part): its prefix is its own
    share = [_sharing([requests[i] for i in u])[0] for u in units]
    share = [groups[0][1] if groups else 0 for groups in share]

    best: list[tuple[float, int]] = [(0.0, 0)] + [(float("inf"), 0)] * len(units)
    start = [0] * (len(units) + 1)
    for j in range(1, len(units) + 1):
        count = widest = most = 0
        shares = False
        for i in range(j - 1, -1, -1):
            count += len(units[i])
            if count > size:
                break
            widest, most, shares = max(widest, longest[i]), max(most, budget[i]), shares or grouped[i]
            if shares:
                members = sorted(x for u in units[i:j] for x in u)
                at = {x: k for k, x in enumerate(members)}
                groups = sorted(([at[x] for x in units[k]], share[k]) for k in range(i, j) if share[k])
                loose = sorted(at[x] for k in range(i, j) if not share[k] for x in units[k])
                cost = chunk_plan(requests, members, buckets, sharing=(groups, loose)).cost(model)
            else:  # the plain layout: `chunk_plan`'s shapes and cost, without building them
                batch = _round_up(bucket(count, buckets.batch, "batch size", ""), buckets.row_multiple)
                plen = bucket(widest, buckets.prompt, "prompt length", "")
                cost = model.of(batch * plen, most, batch) + model.compile
            option = (best[i][0] + cost, best[i][1] + 1)
            if option < best[j]:
                best[j], start[j] = option, i
    cuts = [len(units)]
    while cuts[-1]:
        cuts.append(start[cuts[-1]])
    return [
        chunk_plan(requests, sorted(x for u in units[i:j] for x in u), buckets)
        for i, j in zip(cuts[::-1], cuts[-2::-1], strict=False)
    ]


def _units(requests: Sequence[SampleRequest], order: Sequence[int], size: int) -> list[list[int]]:
    """What must share a chunk: each sharing group (in parts of at most ``size``); beside foreground
    requests, also all background ones (they decode while the call's foreground rows do, so their
    chunk runs last and follows the others' longest response)."""
    fg = [i for i in order if not requests[i].background]
    bg = [i for i in order if requests[i].background]
    units = []
    for part in (fg, bg):
        units += [[part[k] for k in u] for u in group_units([sharing_key(requests[i]) for i in part], size)]
    if fg and bg:
        units = [u for u in units if not requests[u[0]].background] + [bg]
    return units


def plan_call(
    requests: Sequence[SampleRequest], buckets: Buckets, model: CostModel, foreground_rows: int = 0
) -> CallPlan:
    """How `Sampler.generate` runs ``requests``: which wait (`admitted`), the budgets and groups they run
    with, and the chunks. ``foreground_rows``: that of the sampler's last call with a foreground request
    (`CallPlan.foreground_rows`; 0: none yet).

    A call of only background rows (what waits after a rollout's last agent step) runs in the plain
    layout, in chunks of at most the last foreground call's rows: on a CPU narrow chunks keep their
    cache in cache memory. Its chunks in request order are padded to those rows, which reuses that
    call's batch shape (no new program) unless chunks cut by prompt length cost less."""
    size, min_rows = buckets.max_rows, 0
    if foreground_rows and all(r.background for r in requests):
        requests = [replace(r, group=None) for r in requests]
        size = min_rows = min(size, foreground_rows)
    run = admitted(requests, buckets, size)
    order = sorted(run)
    # A background row decodes only while a foreground row does, so it can never use more new tokens
    # than the longest foreground budget: capped there, it leaves the call's shapes (and compiled
    # programs) those of its foreground rows. Stopped by the cap, it is paused, not finished.
    fg_budget = max((r.max_new_tokens for r in requests if not r.background), default=0)
    todo = [replace(r, max_new_tokens=min(r.max_new_tokens, fg_budget)) if r.background and fg_budget
            else r for r in requests]  # fmt: skip
    chunks = [
        chunk_plan(todo, [order[k] for k in idx], buckets, min_rows)
        for idx in chunk_by_group([sharing_key(todo[i]) for i in order], size)
    ]
    units = _units(todo, order, size)
    if max(map(len, units)) <= size:
        cut = by_length(todo, units, size, buckets, model)
        if chunks_cost(cut, model) < chunks_cost(chunks, model):
            chunks = sorted(cut, key=lambda c: any(todo[i].background for i in c.requests))
    waiting = tuple(i for i in range(len(requests)) if i not in run)
    rows = 0
    if not all(r.background for r in requests):
        rows = _round_up(
            bucket(min(len(order), size), buckets.batch, "batch size", "raise batch_buckets"),
            buckets.row_multiple,
        )
    return CallPlan(todo, chunks, waiting, rows)
