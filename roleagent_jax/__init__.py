"""Role-Agent RL in JAX: one LLM as agent (acts), world model (WIA) and failure analyst (AIW)."""

import os

# We use transformers for tokenizers and configs only; its "PyTorch was not found" advice would be the
# first line a user sees and does not apply (a user who wants it can set the variable to "").
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"
