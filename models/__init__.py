"""The model: a pluggable Transformer in pure PyTorch (``models.lightning`` adds the LightningModule)."""

from models.config import ConfigError, ModelConfig
from models.transformer import Transformer  # imports every component module: the registries are full

__all__ = ["ConfigError", "ModelConfig", "Transformer"]
