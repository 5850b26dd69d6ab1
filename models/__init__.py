"""The model: a pluggable Transformer in pure PyTorch (``models.lightning`` adds the LightningModule).

``ModelConfig`` and the registries import no torch (a study's driver validates every variant with them);
``Transformer`` imports the model's modules on first use.
"""

from models.config import ConfigError, ModelConfig

__all__ = ["ConfigError", "ModelConfig", "Transformer"]


def __getattr__(name: str):
    if name == "Transformer":
        from models.transformer import Transformer

        return Transformer
    raise AttributeError(f"module 'models' has no attribute {name!r}")
