"""What every SmolLM2-135M-Instruct config shares: the cached checkpoint, LoRA for RL, and a short
warm start at a pretrained model's learning rate. A family's `*_smol.py` applies it to that family's
demo config and sets its own sizes."""

from ml_collections import ConfigDict

from roleagent_jax.config import CONFIG
from roleagent_jax.models import smollm2


def pretrained(c: ConfigDict, workdir: str) -> ConfigDict:
    c.workdir = workdir
    c.iterations = 6

    c.model.path = str(smollm2.model_dir())
    c.model.required = True  # no checkpoint: fail at start-up (python -m roleagent_jax.models.smollm2)
    c.model.init.update(CONFIG.build().model.init)  # the demo's random-model sizes do not apply

    c.lora.rank = 16  # RL only: 1.2-1.37x faster train steps than full fine-tuning on this shape
    c.lora.alpha = 32.0

    c.rollout.group_size = 4
    c.rollout.max_response_tokens = 32  # the longest expert answer is about 20 tokens

    c.optim.lr = 2e-5  # LoRA adapters; the demos' 2e-4 was for a from-scratch tiny model
    c.train.mini_batch_rows = 32
    c.train.micro_batch_rows = 4
    # Real rows vary in length (search QA 122-412 tokens): a 16-row mini-batch on one grid is half padding;
    # packed end to end it is a fifth, and the update runs 1.33x faster than torch + peft (0.88x unpacked)
    c.train.pack_rows = True

    c.warmstart.batch_rows = 4
    c.warmstart.lr = 5e-5
    c.warmstart.predictor_fraction = 0.1  # a few predictor rows teach WIA's reply format, cheaply
    c.warmstart.end_turn = True  # the chat model learns to end its turn after its action
    return c
