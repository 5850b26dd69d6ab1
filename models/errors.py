"""The model's error type, in a module of its own so that ``models.traits`` and ``models.config`` share it."""


class ConfigError(ValueError):
    """A configuration that cannot be built. The message names the field, the value and the fix."""
