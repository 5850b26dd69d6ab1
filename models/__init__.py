"""The model: a pluggable Transformer in pure PyTorch (``models.lightning`` adds the LightningModule)."""

from models.config import ConfigError, ModelConfig
from models.transformer import Transformer

__all__ = ["ConfigError", "ModelConfig", "Transformer"]
