"""ALFWorld's failure taxonomy for AIW: the type names, their glosses, and the words small models use."""

# Short glosses in our own words; they go into the analysis prompt so the model knows what each name means.
FAILURE_TYPES: dict[str, str] = {
    "repetitive_exploration": "re-searched places or repeated looks that were already done",
    "wrong_target_location": "had the right object but never brought it to the goal place",
    "wrong_receptacle": "put the object into a different receptacle than the goal's",
    "premature_give_up": "stopped acting before the task was finished",
    "missing_precondition": "skipped a required step (clean/heat/cool, holding the object) before finishing",
    "repeated_failed_action": "repeated an action that had no effect",
    "navigation_loop": "walked back and forth between the same few places",
    "entity_confusion": "handled a different object than the one the task names",
    "wrong_object_interaction": "used the wrong appliance or an action that does not apply to the object",
    "exhaustive_exploration_failure": "searched many places and never got the needed object",
    "action_format_error": "answers without a valid action in the required format",
}


# Phrases small models use for a type instead of its name (checked after exact and fuzzy matching).
FAILURE_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("format", "action_format_error"),
    ("invalid_action", "action_format_error"),
    ("precondition", "missing_precondition"),
    ("prerequisite", "missing_precondition"),
    ("skipped_step", "missing_precondition"),
    ("give_up", "premature_give_up"),
    ("gave_up", "premature_give_up"),
    ("giving_up", "premature_give_up"),
    ("premature", "premature_give_up"),
    ("loop", "navigation_loop"),
    ("back_and_forth", "navigation_loop"),
    ("confus", "entity_confusion"),
    ("wrong_object", "entity_confusion"),
    ("exhaust", "exhaustive_exploration_failure"),
    ("never_found", "exhaustive_exploration_failure"),
    ("repeated_fail", "repeated_failed_action"),
    ("failed_action", "repeated_failed_action"),
    ("repetit", "repetitive_exploration"),
    ("redundant", "repetitive_exploration"),
    ("receptacle", "wrong_receptacle"),
    ("wrong_location", "wrong_target_location"),
    ("target_location", "wrong_target_location"),
    ("wrong_tool", "wrong_object_interaction"),
    ("interaction", "wrong_object_interaction"),
)
