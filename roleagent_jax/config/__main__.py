"""Print every config key: its default, its check and its meaning, section by section."""

from roleagent_jax.config.keys import CONFIG

if __name__ == "__main__":
    print("Every key (override with --config.<key>=<value>; a config file sets its own values):")
    print("\n".join(CONFIG.describe()))
