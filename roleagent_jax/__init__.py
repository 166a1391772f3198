"""Role-Agent RL in JAX: one LLM as agent (acts), world model (WIA) and failure analyst (AIW)."""

__version__ = "0.1.0"
