"""The demo configs play exactly as before the families gained the reference protocol: they set the
compact prompt, validity rule, page and passage cuts, plain product index and reward scale explicitly.

What a demo's agent reads and how its answers are judged is rendered over a fixed set of turns (ALFWorld:
constructed turns; WebShop and search QA: the expert playing ten held-out goals of the demo's own
generated shop or knowledge base) and hashed per kind; the hashes were recorded from the code before
the change, so a demo figure measured then still describes the demo now.

The ALFWorld demo's answers are hashed under the validity rule its figures were measured with
(`available`: a listed command); a second test pins how the reference's `format` rule differs from it.
"""

import hashlib
import importlib
import json

from roleagent_jax.config import family_options
from roleagent_jax.envs.registry import get_family

RESPONSES = [
    "<think>x</think><action>go to cabinet 1</action>", "<action>look</action>", "look",
    "<think>a</think><action>click[buy now]</action>", "<action>search[red shoes]</action>",
    "<action>click[nothing]</action>", "<think>t</think><search>Tukafal</search>", "<answer>Rome</answer>",
    "<search>a</search><answer>b</answer>", "<think>x</think><action>help</action>", "<action>去</action>", "",
]  # fmt: skip
# sha256 (first 16 hex digits) of each kind of record, from the demos before the change.
BEFORE = {
    "alf_format": "932804a501df43bf",
    "alf_parse": "7473da44248f7971",
    "alf_pred": "3c58303db51d9cf8",
    "alf_prompt": "7572b4533e0780c8",
    "qa_adm": "a5e638a76115bc83",
    "qa_goals": "a253425b55c1a848",
    "qa_parse": "55adacefc23b6102",
    "qa_plans": "dc0b030ded0173b8",
    "qa_pred": "a3fc029d48326cb7",
    "qa_prompt": "3e03305dc443c63a",
    "qa_resp": "12865cedcb059cd5",
    "qa_reward": "985645f623c5eae5",
    "ws_adm": "9318680597ca2892",
    "ws_goals": "7296b1ac7c84c6d5",
    "ws_parse": "9e0fe9a27a2ce5d5",
    "ws_plans": "ad8037c36799c83a",
    "ws_pred": "5c014d6976a5ab3a",
    "ws_prompt": "0da8c066b3f50cdf",
    "ws_resp": "2b21912ba9587daf",
    "ws_reward": "0b9e9da50309bf86",
}


def _config(name):
    return importlib.import_module(f"configs.{name}").get_config()


def _family(config):
    family = get_family(config.env.name)
    return family.configured(family_options(config, family))


ADMISSIBLE = [
    "go to cabinet 1",
    "go to countertop 1",
    "take apple 1 from countertop 1",
    "look",
    "inventory",
    "help",
]


def _alfworld(rec):
    c = _config("demo")
    c.env.alfworld.valid = "available"
    f = _family(c)
    adm = ADMISSIBLE
    intro = (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
        "you see a cabinet 1.\n\nYour task is to: put a hot apple in cabinet."
    )
    hist = [(intro, "go to cabinet 1"), ("You arrive at cabinet 1.", "look"), ("Nothing happens.", "help")]
    goal = "put a hot apple in cabinet."
    for t in range(4):
        now = intro if t == 0 else hist[t - 1][0]
        rec[f"alf_prompt_{t}"] = f.agent_prompt(goal, hist[:t], now, adm, t, c.env.history_k)
        rec[f"alf_pred_{t}"] = f.predictor_prompt(goal, hist[:t], "obs", "look", c.wia.horizon)
    rec["alf_parse"] = [f.parse_action(r, adm) for r in RESPONSES] + [
        f.parse_action(r, None) for r in RESPONSES
    ]
    rec["alf_format"] = [f.format_action(a) for a in adm]


def _play(rec, name, label, tmp_path):
    c = _config(name)
    f = _family(c)
    pool = f.task_pool("gen_test", gen_dir=tmp_path / label, n=10, seed=c.env.gen.seed + 1000,
                       options=family_options(c, f))  # fmt: skip
    rec[f"{label}_goals"] = pool.goals
    rec[f"{label}_plans"] = [list(t.expert_plan) if t.expert_plan else None for t in pool.tasks]
    env = f.make_env(c.env.max_steps)
    for i, task in enumerate(pool.tasks):
        obs, history, t = env.reset(task, expert=True), [], 0
        while True:
            rec[f"{label}_{i}_{t}_prompt"] = f.agent_prompt(task.goal, history, obs.text, obs.admissible, t,
                                                            c.env.history_k)  # fmt: skip
            rec[f"{label}_{i}_{t}_adm"] = obs.admissible
            rec[f"{label}_{i}_{t}_parse"] = [f.parse_action(r, obs.admissible) for r in RESPONSES]
            if obs.done or not obs.expert_plan or t >= c.env.max_steps:
                break
            resp = f.format_action(obs.expert_plan[0])
            parsed = f.parse_action(resp, obs.admissible)
            rec[f"{label}_{i}_{t}_resp"] = [resp, parsed]
            rec[f"{label}_{i}_{t}_pred"] = f.predictor_prompt(
                task.goal, history, obs.text, parsed[0], c.wia.horizon
            )
            nxt = env.step(parsed[0] if parsed[0] is not None else f.unparsed_action(resp))
            history.append((obs.text, parsed[0]))
            obs, t = nxt, t + 1
            rec[f"{label}_{i}_{t}_reward"] = [nxt.reward, nxt.won, nxt.score, nxt.anchor]


def digests(records: dict) -> dict[str, str]:
    """One hash per kind of record (the family label and the key's last part)."""
    kinds: dict[str, dict] = {}
    for key, value in records.items():
        parts = key.split("_")
        kinds.setdefault(f"{parts[0]}_{parts[-1] if not parts[-1].isdigit() else parts[1]}", {})[key] = value
    return {
        kind: hashlib.sha256(json.dumps(group, sort_keys=True).encode()).hexdigest()[:16]
        for kind, group in sorted(kinds.items())
    }


def render(tmp_path) -> dict:
    records: dict = {}
    _alfworld(records)
    _play(records, "webshop_demo", "ws", tmp_path)
    _play(records, "search_qa_demo", "qa", tmp_path)
    return json.loads(json.dumps(records))  # tuples as lists, as recorded


def test_demos_render_and_judge_exactly_as_before(tmp_path):
    assert digests(render(tmp_path)) == BEFORE


def test_the_format_rule_differs_from_the_available_rule_only_on_unlisted_commands():
    """The format rule (the reference's) differs from the available rule (the demo's) exactly where an
    answer is well formed but not a listed command, or no list is known: the action is the same, only
    its validity flips to True."""
    c = _config("demo")
    c.env.alfworld.valid = "format"
    fmt = _family(c)
    c.env.alfworld.valid = "available"
    available = _family(c)
    for adm in (ADMISSIBLE, None):
        for response in RESPONSES:
            (a_fmt, ok_fmt), (a_avail, ok_avail) = (
                fmt.parse_action(response, adm),
                available.parse_action(response, adm),
            )
            assert a_fmt == a_avail, response
            listed = adm is not None and a_fmt in adm
            assert ok_fmt == (a_fmt is not None), response
            assert ok_avail == (a_fmt is not None and (listed or adm is None)), response
