"""One registry per kind of component: a new score, position scheme or pattern is one class and one registry
entry, valid in the config at once, trainable, and decodable with the cache. Weight decay and the general
score's identity start."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models import ConfigError, ModelConfig, Transformer
from models.attention import Score
from models.patterns import Pattern
from models.positions import Positions, sinusoid_table
from models.registry import PATTERNS, POSITIONS, SCORES

ROOT = Path(__file__).resolve().parents[2]


class NegativeDistance(Score):
    """A toy score: -|q - k|^2 / sqrt(D), with a learned per-head scale (not a dot product)."""

    dot_like = False

    def __init__(self, n_heads, head_dim, chunk_elements=1 << 20):
        super().__init__(n_heads, head_dim, chunk_elements)
        self.gain = nn.Parameter(torch.ones(n_heads))

    def scores(self, q, k, heads=slice(None)):
        d2 = (q[..., :, None, :] - k[..., None, :, :]).pow(2).sum(-1)  # (B, H, T, S)
        return -self.gain[heads].view(-1, 1, 1).to(q.dtype) * d2 / math.sqrt(self.head_dim)


class ScaledSinusoids(Positions):
    """A toy position scheme: Vaswani's sinusoids times a learned scalar."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.gain = nn.Parameter(torch.tensor(0.5))
        self.d_model = cfg.d_model

    def forward(self, x, start=0, ids=None):
        table = sinusoid_table(start + x.shape[1], self.d_model, device=x.device)
        pe = table[ids] if ids is not None else table[start:]
        return x + self.gain * pe.to(x.dtype)


class PreviousOnly(Pattern):
    """A toy pattern: each query sees itself and the key just before it."""

    @property
    def reach(self):
        return 1

    def allowed(self, dist):
        return ((dist == 0) | (dist == 1))[None]


@pytest.fixture
def toys():
    SCORES.register("toy_distance")(NegativeDistance)
    POSITIONS.register("toy_sinusoids")(ScaledSinusoids)
    PATTERNS.register("toy_previous")(PreviousOnly)
    yield
    SCORES.unregister("toy_distance")
    POSITIONS.unregister("toy_sinusoids")
    PATTERNS.unregister("toy_previous")


def test_an_unregistered_name_is_refused_and_a_registered_one_accepted(toys):
    cfg = ModelConfig(score="toy_distance", positions="toy_sinusoids", pattern="toy_previous")
    assert cfg.attention_layers()[0].pattern == "toy_previous"
    SCORES.unregister("toy_distance")
    with pytest.raises(ConfigError, match=r"score='toy_distance' is not a valid choice; valid: 'dot'"):
        ModelConfig(score="toy_distance")
    with pytest.raises(ValueError, match="already registered"):
        SCORES.register("dot")(NegativeDistance)
    SCORES.register("toy_distance")(NegativeDistance)


def test_toy_components_train_and_decode_with_the_cache(toys):
    """A decoder made of the toy score, position scheme and pattern learns to repeat the previous token
    (which its pattern allows) in a few steps, every toy parameter gets a gradient, and cached decoding
    equals the full forward (the pattern's reach gives a ring buffer of 2 keys)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch="decoder",
        vocab_size=12,
        d_model=32,
        n_heads=2,
        n_layers=1,
        score="toy_distance",
        positions="toy_sinusoids",
        pattern="toy_previous",
    )
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        seq = torch.randint(1, 12, (32, 10))
        seq[:, 1::2] = seq[:, 0::2]  # every odd token repeats the one before it
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits[:, 0::2].reshape(-1, 12), seq[:, 1::2].reshape(-1))
        opt.zero_grad()
        loss.backward()
        if not losses:
            assert model.positions.gain.grad is not None and model.positions.gain.grad.abs() > 0
            assert model.layers[0].attn.sublayer.score.gain.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    model = model.double().eval()
    tokens = torch.randint(1, 12, (2, 9))
    cache = model.new_cache()
    steps = [model.step(tokens[:, :3], cache, 0)] + [model.step(tokens[:, t : t + 1], cache, t) for t in range(3, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), model(tokens), rtol=1e-9, atol=1e-9)
    assert cache[0].k.shape[2] == 2


def test_weight_decay_pulls_the_general_score_towards_its_identity_start():
    """Luong et al.'s bilinear score starts at W = I (dot attention). AdamW's decoupled decay on the stored
    delta = W - I shrinks W towards I, never towards 0 (which would switch attention off)."""
    from models.lightning import LitTransformer, TrainingConfig

    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=11, d_model=16, n_heads=2, score="general")
    module = LitTransformer(cfg, TrainingConfig(lr=0.1, weight_decay=0.5, schedule="constant"), "lm")
    score = module.model.layers[0].attn.sublayer.score
    with torch.no_grad():
        score.delta.normal_(std=0.1)
    start = score.weight.detach().clone()
    opt = module.configure_optimizers()["optimizer"]
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(score.delta) in decayed
    for _ in range(10):  # no gradient: only the decay acts
        opt.zero_grad()
        (0.0 * sum(p.sum() for p in module.parameters())).backward()
        opt.step()
    eye = torch.eye(8).expand_as(start)
    torch.testing.assert_close(score.weight.detach(), eye + (1 - 0.1 * 0.5) ** 10 * (start - eye))


def test_checkpoints_that_stored_the_general_score_matrix_still_load():
    cfg = ModelConfig(arch="decoder", vocab_size=11, d_model=16, n_heads=2, score="general")
    model = Transformer(cfg)
    state = model.state_dict()
    W = torch.randn(2, 8, 8)
    for name in [n for n in state if n.endswith("score.delta")]:
        del state[name]
        state[name.replace("delta", "weight")] = W
    model.load_state_dict(state)
    torch.testing.assert_close(model.layers[0].attn.sublayer.score.weight.detach(), W)


# -- the built-ins are declared without torch -----------------------------------------------------------------


def _public_flags(traits: type) -> dict:
    return {k: getattr(traits, k) for k in dir(traits) if not k.startswith("_") and not callable(getattr(traits, k))}


def test_every_builtin_is_declared_with_the_module_that_registers_it_and_its_own_traits():
    """The config reads a built-in's flags and check from its declaration until its module is imported;
    once imported, the class must answer the same (a declaration that drifted would validate one thing in
    the driver and build another on the worker)."""
    import models.transformer  # noqa: F401  (every component module)
    from models.registry import ALL

    for kind, registry in ALL.items():
        assert registry.builtins, kind
        for name, declared in registry.builtins.items():
            component = registry[name]
            assert component.__module__ == declared.module, (kind, name)
            if declared.traits is None:
                assert not hasattr(component, "check"), (kind, name)
                continue
            assert issubclass(component, declared.traits), (kind, name)
            assert _public_flags(component) | _public_flags(declared.traits) == _public_flags(component), (kind, name)
            check = getattr(component, "check", None)
            assert getattr(check, "__func__", None) is getattr(
                getattr(declared.traits, "check", None), "__func__", None
            )
        # and nothing registered by the component modules is missing from the declarations
        assert set(registry.builtins) == {n for n in registry.names() if registry[n].__module__.startswith("models.")}


_BAD_CONFIGS = """
bad = [
    dict(positions="rotary", score="additive"),
    dict(positions="rotary", head_dim=7),
    dict(positions="alibi", arch="encoder", n_classes=2, n_heads=1, d_model=32),
    dict(positions="sinusoidal", position_init_std=0.1),
    dict(pattern="local"),
    dict(pattern="full", window=4),
    dict(pattern="local", window=4, dilation=2),
    dict(pattern="dilated", window=4, dilation=1),
    dict(layer_patterns=["full", "local"], n_layers=2, window_schedule="increasing"),
    dict(score="nope"),
    dict(cross_score="general"),
    dict(arch="encoder_decoder", cross_score="nope"),
    dict(arch="encoder_decoder", cross_qk_projections=False, head_dim=8),
    dict(norm_type="nope"),
    dict(ffn="nope"),
    dict(global_projections="shared"),
    dict(arch="encoder_decoder", decoding="nat_gu", positions="rotary"),  # positional attention needs encodings
]
good = [
    dict(positions="rotary", score="cosine"),
    dict(arch="encoder_decoder", positions="rotary", cross_score="additive", cross_qk_projections=False, n_heads=1),
    dict(pattern="dilated", window=4, dilation=2, n_heads=4, dilated_heads=2),
    dict(layer_patterns=["full", "local", "dilated"], n_layers=3, window=4, dilation=2, window_schedule="increasing"),
    dict(positions="learned", position_init_std=0.1, norm_type="rmsnorm", ffn="swiglu"),
    dict(arch="encoder", n_classes=2, pattern="local", window=4, global_tokens=[0], global_projections="shared"),
]


def outcomes():
    out = []
    for kw in bad:
        try:
            ModelConfig(**kw)
            out.append("accepted")
        except ConfigError as e:
            out.append(str(e))
    out += [repr(ModelConfig(**kw).attention_layers()) for kw in good]
    return out
"""


def test_configs_are_validated_without_torch_and_exactly_as_with_it():
    """A study's driver validates every variant before anything starts; it must not pay for torch (about a
    second per command) and must refuse and accept exactly what the built model does."""
    script = (
        "import json, sys\n"
        "from models import ConfigError, ModelConfig\n" + _BAD_CONFIGS + "before = outcomes()\n"
        "assert 'torch' not in sys.modules, 'validating a config imported torch'\n"
        "import models.transformer\n"
        "assert 'torch' in sys.modules\n"
        "print(json.dumps([before, outcomes()]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after = json.loads(done.stdout)
    assert before == after
    assert before[: len(before) - 6].count("accepted") == 0, before  # every bad config was refused
    assert "does not compute" in before[0] and "even head_dim" in before[1] and "bidirectional" in before[2]


def test_a_study_is_planned_without_torch(tmp_path):
    """``ablate sweep --dry-run`` (what every submission does first) over the locality study, whose variants
    use local and dilated patterns, imports neither torch nor Lightning."""
    script = (
        "import sys\n"
        "from ablate.main import main\n"
        f"sys.argv = ['ablate', 'sweep', {str(ROOT / 'ablations/studies/locality.yaml')!r}, '--dry-run',"
        f" '--tracking-uri', {f'sqlite:///{tmp_path}/mlflow.db'!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('TORCH' if 'torch' in sys.modules or 'lightning' in sys.modules else 'NO TORCH')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "to train" in done.stdout and done.stdout.strip().endswith("NO TORCH"), done.stdout[-2000:]
