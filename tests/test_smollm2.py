"""SmolLM2-135M-Instruct converted from its GGUF vs transformers' own GGUF loader (torch, float32).

Runs when ``python -m roleagent_jax.models.smollm2`` has cached the model (the README's test command
does that first) and skips with that reason otherwise. The model is loaded once per module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from roleagent_jax.envs.alfworld import prompts as alfworld_prompts
from roleagent_jax.envs.search_qa import prompts as search_qa_prompts
from roleagent_jax.envs.webshop import prompts as webshop_prompts
from roleagent_jax.models import load_pretrained, smollm2
from roleagent_jax.models.tokenizer import chat_prompt, eos_ids
from roleagent_jax.sampling import Sampler, SampleRequest, SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
FOUND = smollm2.cached()
pytestmark = pytest.mark.skipif(
    FOUND is None, reason="SmolLM2-135M-Instruct is not cached: run python -m roleagent_jax.models.smollm2"
)

FAMILY_PROMPTS = {
    "alfworld": alfworld_prompts.build_agent_prompt(
        "put a clean mug in coffeemachine.",
        [("You are in the middle of a room.", "go to countertop 1")],
        "On the countertop 1, you see a mug 2, a knife 1, and a bread 3.",
        ["take mug 2 from countertop 1", "take knife 1 from countertop 1", "look", "inventory"],
        1,
    ),
    "webshop": webshop_prompts.build_agent_prompt(
        "i need a long lasting 6.76 fl oz bottle of l'eau d'issey, and price lower than 100.00 dollars",
        [],
        "[Back to Search] Page 1 (Total results: 3) [Next >] [B000VOHH8I] L'eau D'issey By Issey Miyake "
        "for Men 6.7 oz $64.98 [B000MJZOPK] L'eau d'Issey by Issey Miyake for Women 3.3 oz $49.90",
        ["click[back to search]", "click[next >]", "click[b000vohh8i]", "click[b000mjzopk]"],
        1,
    ),
    "search_qa": search_qa_prompts.build_agent_prompt(
        "Who was born later, Faba Ruresol or Redo Ruva?",
        [],
        "",
        0,
    ),
}
HARD_STRINGS = [
    "naïve café, Ünïcödé: 中文字符, 日本語, 한국어, emoji 😀🚀 and a zero-width\u200bjoiner",
    "pi is 3.14159265358979323846264338327950288419716939937510 and 2**64 = 18446744073709551616",
    "runs   of    spaces,\t\ttabs,\n\n\nnewlines \r\n and  trailing   ",
    "<|im_start|>user\nnested <|im_end|> specials<|endoftext|>",
]


def _readme_sentences() -> list[str]:
    """Prompts this test's author did not write: the first sentences of the project's README."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = [line for line in text.splitlines() if len(line) > 60 and line[0].isalpha()]
    return lines[:2]


@pytest.fixture(scope="module")
def models():
    gguf, hf_dir = FOUND
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    ours, cfg = load_pretrained(hf_dir)
    return ref, ref_tok, tok, ours, cfg


def _chat(tok, family: str) -> list[int]:
    return tok.encode(chat_prompt(tok, FAMILY_PROMPTS[family]), add_special_tokens=False)


def test_token_ids_match_transformers_gguf_tokenizer(models):
    _, ref_tok, tok, _, _ = models
    for text in [*FAMILY_PROMPTS.values(), *HARD_STRINGS]:
        assert tok.encode(text) == ref_tok.encode(text), text
        assert tok.decode(tok.encode(text)) == ref_tok.decode(ref_tok.encode(text))
    for family in FAMILY_PROMPTS:
        assert _chat(tok, family) == _chat(ref_tok, family)


def test_chat_template_renders_identically(models):
    _, ref_tok, tok, _, _ = models
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": FAMILY_PROMPTS["webshop"]}],
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
    ]
    for messages in conversations:
        for gen in (False, True):
            ours = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours == ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == ("<|im_end|>", "<|im_start|>", "<|im_end|>")


def test_logits_match_transformers_gguf_loader(models):
    """The three families' prompts in one call, right-padded (causal: padding never reaches a prompt)."""
    ref, ref_tok, _, ours, _ = models
    prompts = [_chat(ref_tok, family) for family in sorted(FAMILY_PROMPTS)]
    width = max(map(len, prompts))
    batch = jnp.asarray([p + [ref_tok.pad_token_id] * (width - len(p)) for p in prompts])
    got = np.asarray(ours(batch))
    for row, ids in zip(got, prompts):
        with torch.no_grad():
            expected = ref(torch.tensor([ids])).logits[0].numpy()
        assert np.abs(row[: len(ids)] - expected).max() < 1e-3


@pytest.mark.slow  # about a minute on 2 cores; the logits test above and the tiny model's greedy test cover it
def test_greedy_32_tokens_through_our_sampler_match_transformers(models):
    from flax import nnx

    ref, ref_tok, tok, ours, cfg = models
    prompts = [_chat(tok, family) for family in sorted(FAMILY_PROMPTS)]
    graphdef, params = nnx.split(ours)
    sampler = Sampler(graphdef, cfg, tok, eos_ids=eos_ids(tok), max_new_tokens_cap=32)
    results = sampler.generate(
        params,
        [SampleRequest(p, 32) for p in prompts],
        SamplingParams(temperature=0.0),
        jax.random.PRNGKey(0),
    )
    for prompt, result in zip(prompts, results):
        with torch.no_grad():
            out = ref.generate(
                torch.tensor([prompt]),
                max_new_tokens=32,
                do_sample=False,
                eos_token_id=eos_ids(ref_tok),
                pad_token_id=ref_tok.pad_token_id,
            )
        expected = out[0, len(prompt) :].tolist()
        assert result.token_ids == expected
        assert len(expected) == 32 or expected[-1] in eos_ids(ref_tok)


def test_converted_directory_in_transformers_writes_what_the_gguf_writes(models):
    ref, ref_tok, _, _, _ = models
    hf_dir = FOUND[1]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    for text in _readme_sentences():
        texts = []
        for m, t in ((model, tok), (ref, ref_tok)):
            ids = t(chat_prompt(t, text), return_tensors="pt", add_special_tokens=False).input_ids
            with torch.no_grad():
                out = m.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=t.pad_token_id)
            texts.append(t.decode(out[0, ids.shape[1] :]))
        assert texts[0] == texts[1] and texts[0].strip()
