"""The splits of a task as a LightningDataModule (training order shuffled by the run's seed). Apart from
``models.tasks.base`` so that declaring and checking tasks imports no Lightning."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from models.tasks.base import Task
from models.tasks.batches import collate


class TaskDataModule(L.LightningDataModule):
    """The splits of a task as DataLoaders; training order shuffled by the run's seed."""

    def __init__(
        self, task: Task, batch_size: int, seed: int, eval_batch_size: int | None = None, cache_dir: str | None = None
    ) -> None:
        super().__init__()
        self.task, self.batch_size, self.seed = task, batch_size, seed
        self.eval_batch_size = eval_batch_size or batch_size
        self.cache_dir = cache_dir
        self.data: dict[str, Any] = {}  # split -> datasets.Dataset (its lineage goes to MLflow)
        self.rows: dict[str, list[dict]] = {}  # split -> examples in memory (Arrow row access is slow)

    def setup(self, stage: str | None = None) -> None:
        for split in self.task.splits:
            if split not in self.data:
                self.data[split] = self.task.build(split, self.cache_dir)
                self.rows[split] = self.data[split].to_list()

    def loader(self, split: str, shuffle: bool = False) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            self.rows[split],
            batch_size=self.batch_size if shuffle else self.eval_batch_size,
            shuffle=shuffle,
            generator=gen,
            collate_fn=self._collate,
            drop_last=False,
        )

    def digest(self, split: str) -> str:
        """A digest of the split's content (changes whenever any example does)."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.rows[split]).encode()).hexdigest()[:16]

    def _collate(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        return collate(self.task.kind, examples)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("validation", shuffle=False)

    def test_dataloader(self) -> list[DataLoader]:
        return [self.loader(s, shuffle=False) for s in self.task.splits if s not in ("train", "validation")]
