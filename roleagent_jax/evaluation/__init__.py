"""Evaluation: play every task of a split once with a policy and summarise it; a trained checkpoint as
a policy; the settings an exported model was trained and evaluated with."""
