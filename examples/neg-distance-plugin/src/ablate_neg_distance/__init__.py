"""An example plugin: a score (``neg_distance``), a task (``first_last``) and a report warning
(``distance_scale``), each registered through the platform's own registries. Importing the package registers them."""

from ablate_neg_distance import score, task, warning  # noqa: F401  (each module registers what it defines)
