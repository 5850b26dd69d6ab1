"""Every refused configuration is refused when built, with a message that names the field and the fix."""

from __future__ import annotations

import re

import pytest

from models import ConfigError, ModelConfig, Transformer

REFUSED = [
    ({"arch": "rnn"}, r"arch='rnn' is not a valid choice; valid: 'encoder', 'decoder', 'encoder_decoder'"),
    ({"norm": "sandwich"}, r"norm='sandwich' is not a valid choice; valid: 'pre', 'post'"),
    ({"norm_type": "batchnorm"}, r"norm_type='batchnorm'.*'layernorm', 'rmsnorm'"),
    ({"positions": "relative"}, r"positions='relative'.*'sinusoidal', 'learned', 'none', 'rotary', 'alibi'"),
    ({"score": "mlp"}, r"score='mlp'.*'dot', 'dot_unscaled', 'general', 'cosine', 'additive'"),
    ({"pattern": "strided"}, r"pattern='strided'.*'full', 'local', 'dilated'"),
    ({"ffn": "tanh"}, r"ffn='tanh'.*'relu', 'gelu', 'swiglu'"),
    ({"d_model": 0}, r"d_model=0 must be a positive integer"),
    ({"n_heads": 2.5}, r"n_heads=2.5 must be a positive integer"),
    ({"n_layers": True}, r"n_layers=True must be a positive integer"),
    ({"dropout": 1.0}, r"dropout=1.0 must be a number in \[0, 1\)"),
    ({"attn_dropout": -0.1}, r"attn_dropout=-0.1 must be a number in \[0, 1\)"),
    ({"d_model": 100, "n_heads": 3}, r"d_model=100 is not divisible by n_heads=3.*head_dim"),
    ({"pattern": "local"}, r"pattern 'local' or 'dilated' needs window"),
    ({"window": 8}, r"window=8 requires pattern 'local' or 'dilated' \(got pattern='full'\)"),
    ({"dilation": 2}, r"dilation requires pattern 'dilated' \(got pattern='full', dilation=2\)"),
    ({"pattern": "local", "window": 4, "dilation": 2}, r"dilation requires pattern 'dilated' \(got pattern='local'"),
    ({"pattern": "dilated", "window": 4}, r"pattern 'dilated' needs dilation >= 2"),
    (
        {"positions": "rotary", "score": "additive"},
        r"positions='rotary'.*score='additive'.*sinusoidal, learned, alibi or none",
    ),
    ({"positions": "rotary", "d_model": 36, "n_heads": 4}, r"positions='rotary'.*even head_dim \(got 9\)"),
    ({"arch": "encoder"}, r"arch='encoder' needs n_classes"),
    ({"arch": "encoder", "n_classes": 2, "tie_embeddings": True}, r"tie_embeddings=true needs a language-model head"),
    ({"arch": "decoder", "n_classes": 2}, r"n_classes is only for arch='encoder' \(got arch='decoder'\)"),
    # a key that would change nothing is refused like its siblings: two variants would be the same model under two
    # names (and two cell ids)
    ({"arch": "decoder", "classifier": "token"}, r"classifier is only for arch='encoder' \(got arch='decoder'\)"),
    ({"arch": "encoder_decoder", "classifier": "first"}, r"classifier is only for arch='encoder'"),
    ({"arch": "decoder", "tgt_vocab_size": 10}, r"tgt_vocab_size is only for arch='encoder_decoder'"),
    ({"arch": "decoder", "n_decoder_layers": 2}, r"n_decoder_layers is only for arch='encoder_decoder'"),
    ({"pad_id": 300}, r"pad_id=300 must be below vocab_size=256"),
    (
        {"layer_patterns": ["local", "full", "full"], "window": 2},
        r"layer_patterns has 3 entries but the stack has 2 layers",
    ),
    ({"layer_patterns": ["local", "ring"], "window": 2}, r"layer_patterns\[1\]='ring' is not a valid choice"),
    (
        {"arch": "encoder_decoder", "n_decoder_layers": 3, "layer_patterns": ["full", "full"]},
        r"layer_patterns applies to both stacks.*n_layers=2, n_decoder_layers=3",
    ),
    ({"tie_embeddings": "yes"}, r"tie_embeddings='yes' must be true, false or null"),
    ({"norm_eps": 0}, r"norm_eps=0 must be a positive number"),
    # Longformer's global tokens
    ({"pattern": "local", "window": 2, "global_tokens": [-1]}, r"global_tokens=\[-1\] must be a non-empty list"),
    ({"pattern": "local", "window": 2, "global_tokens": []}, r"global_tokens=\[\] must be a non-empty list"),
    ({"pattern": "local", "window": 2, "global_tokens": [3, 0]}, r"global_tokens=\[3, 0\] names .* \[0, 3\]"),
    ({"pattern": "local", "window": 2, "global_tokens": [0, 0]}, r"global_tokens=\[0, 0\] names .* \[0\]"),
    ({"global_tokens": [0]}, r"pattern 'full' sees every key already: remove global_tokens"),
    ({"pattern": "local", "window": 2, "global_tokens": [0]}, r"global_tokens in a causal stack \(arch='decoder'\)"),
    ({"global_projections": "shared"}, r"global_projections='shared' says how global tokens are projected; there are"),
    (
        {
            "arch": "encoder",
            "n_classes": 2,
            "pattern": "local",
            "window": 2,
            "global_tokens": [0],
            "global_projections": 1,
        },
        r"global_projections=1 is not a valid choice; valid: 'separate', 'shared'",
    ),
    # windows and dilation (Longformer)
    ({"window_schedule": "increasing"}, r"window_schedule='increasing' requires pattern 'local' or 'dilated'"),
    ({"pattern": "local", "window": 2, "window_schedule": "up"}, r"window_schedule='up' is not a valid choice"),
    ({"pattern": "local", "layer_windows": [2]}, r"layer_windows has 1 entries but needs 2 \(one window per layer\)"),
    ({"pattern": "local", "layer_windows": [2, 0]}, r"layer_windows\[1\]=0 must be a positive integer"),
    ({"pattern": "local", "window": 2, "layer_windows": [2, 3]}, r"either window .* or layer_windows, not both"),
    ({"layer_windows": [2, 3]}, r"layer_windows requires pattern 'local' or 'dilated'"),
    ({"pattern": "local", "window": 2, "dilated_heads": 1}, r"dilated_heads requires pattern 'dilated'"),
    (
        {"pattern": "dilated", "window": 2, "dilation": 2, "dilated_heads": 5},
        r"dilated_heads=5 must be at most n_heads=4",
    ),
    ({"pattern": "dilated", "window": 2, "head_dilations": [1, 2]}, r"head_dilations has 2 entries but needs 4"),
    (
        {"pattern": "dilated", "window": 2, "dilation": 2, "head_dilations": [1, 2, 1, 2]},
        r"head_dilations gives every head's dilation; remove dilation",
    ),
    ({"pattern": "dilated", "window": 2, "layer_dilations": [1, 2], "dilation": 2}, r"remove dilation"),
    ({"pattern": "dilated", "window": 2, "dilation_schedule": "steps"}, r"dilation_schedule='steps' is not a valid"),
    ({"pattern": "local", "window": 2, "dilation_schedule": "decreasing"}, r"dilation_schedule='decreasing' .* remove"),
    (
        {"pattern": "dilated", "window": 2, "layer_dilations": [1, 2], "dilation_schedule": "fixed"},
        r"dilation_schedule='fixed' .*head_dilations or layer_dilations give the dilations",
    ),
    ({"pattern": "dilated", "window": 2, "head_dilations": [1, 1, 1, 1]}, r"every dilation of head_dilations is 1"),
    ({"pattern": "dilated", "window": 2, "layer_dilations": [1, 1]}, r"every dilation of layer_dilations is 1"),
    # positions
    ({"position_init_std": 0.02}, r"position_init_std=0.02 .*positions='sinusoidal' has none"),
    ({"positions": "learned", "position_init_std": -1}, r"position_init_std=-1 must be a non-negative number"),
    ({"rotary_base": 5e5}, r"rotary_base=500000 .*positions='sinusoidal' has none .*positions='rotary'"),
    ({"arch": "encoder", "n_classes": 2, "positions": "alibi", "n_heads": 1}, r"alibi.*bidirectional.*n_heads=1"),
    # non-autoregressive decoding
    (
        {"decoding": "parallel"},
        r"decoding='parallel' is not a valid choice; valid: 'autoregressive', 'nat_gu', 'uniform_copy', 'mask_predict'",
    ),
    (  # the old name of one-pass mask-predict, refused with the two spellings that say which paper
        {"arch": "encoder_decoder", "decoding": "non_autoregressive"},
        r"decoding='non_autoregressive' named one-pass mask-predict.*decoding='mask_predict'.*decoding='nat_gu'",
    ),
    (  # until 2026-11-28 Gu et al.'s name on their decoder inputs alone: refused, naming what it built
        {"arch": "encoder_decoder", "decoding": "nat"},
        r"decoding='nat' named Gu et al.*built only its decoder inputs.*decoding='uniform_copy' \(what 'nat' built\)",
    ),
    ({"decoding": "nat_gu"}, r"decoding='nat_gu' .* needs arch='encoder_decoder'"),
    ({"decoding": "uniform_copy"}, r"decoding='uniform_copy' .* needs arch='encoder_decoder'"),
    ({"decoding": "mask_predict"}, r"decoding='mask_predict' .* needs arch='encoder_decoder'"),
    ({"arch": "encoder_decoder", "nat_iterations": 4}, r"nat_iterations=4 .*needs decoding='mask_predict'"),
    (
        {"arch": "encoder_decoder", "decoding": "uniform_copy", "nat_iterations": 4},
        r"nat_iterations=4 .*needs decoding='mask_predict' \(got decoding='uniform_copy': Gu et al.'s decoder decodes "
        r"in one pass\)",
    ),
    ({"arch": "encoder_decoder", "decoding": "mask_predict", "nat_iterations": 0}, r"nat_iterations=0 must be"),
    (
        {"arch": "encoder_decoder", "decoding": "nat_gu", "positions": "alibi"},
        r"decoding='nat_gu' gives every decoder layer Gu et al.'s positional attention.*positions='alibi' adds none",
    ),
    ({"arch": "encoder_decoder", "length_candidates": 5}, r"length_candidates=5 .*needs decoding='mask_predict'"),
    (
        {"arch": "encoder_decoder", "decoding": "nat_gu", "length_candidates": 5},
        r"length_candidates=5 .*\(got decoding='nat_gu': Gu et al. decode one length",
    ),
    (
        {"arch": "encoder_decoder", "decoding": "mask_predict", "max_len": 4, "length_candidates": 6},
        r"length_candidates=6 is more than the 5 target lengths the length predictor knows",
    ),
    ({"arch": "encoder_decoder", "decoding": "mask_predict", "length_candidates": 0}, r"length_candidates=0 must be"),
]


@pytest.mark.parametrize("kwargs,message", REFUSED, ids=[str(k) for k, _ in REFUSED])
def test_refused_configurations(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**kwargs)


def test_unknown_keys_are_refused_with_the_valid_keys_listed():
    with pytest.raises(ConfigError, match=r"unknown model key\(s\) \['n_head'\]; valid keys: .*'n_heads'"):
        ModelConfig.from_dict({"n_head": 4})


def test_round_trip_and_derived_values():
    cfg = ModelConfig(
        arch="encoder_decoder",
        d_model=64,
        n_heads=4,
        head_dim=32,
        n_decoder_layers=2,
        layer_patterns=["local", "full"],
        window=4,
        n_layers=2,
    )
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.layer_patterns == ("local", "full")
    assert cfg.head_size == 32 and cfg.ff_size == 256 and cfg.decoder_layers == 2
    assert ModelConfig(arch="encoder_decoder", n_decoder_layers=3).decoder_layers == 3
    assert cfg.tied and not ModelConfig(arch="encoder", n_classes=2).tied


def test_head_dim_independent_of_width():
    """Vaswani et al. Table 3 rows A/B vary the head size at a fixed width: q/k/v are H*D wide."""
    model = Transformer(ModelConfig(d_model=32, n_heads=8, head_dim=16))
    attn = model.layers[0].attn.sublayer
    assert attn.qkv_proj.weight.shape == (3 * 8 * 16, 32) and attn.out_proj.weight.shape == (32, 8 * 16)


def test_round_trip_of_per_layer_and_per_head_keys():
    cfg = ModelConfig(
        arch="encoder_decoder",
        n_layers=2,
        pattern="dilated",
        layer_windows=[2, 5],  # [2, 4] is window 3 with the increasing schedule (refused as a respelling)
        head_dilations=[[1, 1, 2, 2], [1, 3, 1, 3]],
        decoding="mask_predict",
        nat_iterations=3,
    )
    data = cfg.to_dict()
    assert data["head_dilations"] == [[1, 1, 2, 2], [1, 3, 1, 3]] and data["layer_windows"] == [2, 5]
    again = ModelConfig.from_dict(data)
    assert again == cfg and hash(again) == hash(cfg)
    assert [la.dilations for la in again.attention_layers()] == [(1, 1, 2, 2), (1, 3, 1, 3)]


def test_old_configs_keep_loading():
    """Run files written before per-head dilation (`pattern: dilated, window, dilation`) still load; their
    meaning is now Longformer's (docs/components.md): a quarter of the heads dilated, in the upper layers."""
    old = ModelConfig.from_dict({"pattern": "dilated", "window": 8, "dilation": 3, "n_heads": 4, "n_layers": 2})
    assert [la.dilations for la in old.attention_layers()] == [(1, 1, 1, 1), (1, 1, 1, 3)]
    assert ModelConfig.from_dict({"pattern": "local", "window": 8}).attention_layers()[0].window == 8
    assert (
        ModelConfig.from_dict({"layer_patterns": ["local", "full"], "window": 4}).attention_layers()[1].window is None
    )


def test_choices_come_from_the_registries():
    from models.registry import ALL

    for field, registry in ALL.items():
        with pytest.raises(ConfigError) as err:
            ModelConfig(**{field: "no_such_component"})
        assert all(repr(name) in str(err.value) for name in registry), field


def test_global_tokens_go_to_the_windowed_layers_of_bidirectional_stacks():
    """Longformer's global attention (section 3.1) in the encoder's windowed layers; an autoregressive decoder is
    causal and keeps none (a global token there would see the future); a non-autoregressive decoder takes them."""
    cfg = ModelConfig(
        arch="encoder_decoder", layer_patterns=["local", "full"], window=2, global_tokens=[0, 5], n_heads=2, d_model=8
    )
    assert [la.global_tokens for la in cfg.attention_layers()] == [(0, 5), ()]
    model = Transformer(cfg)
    assert [layer.attn.sublayer.pattern.layer.global_tokens for layer in model.layers] == [(0, 5), ()]
    assert [layer.attn.sublayer.pattern.layer.global_tokens for layer in model.dec_layers] == [(), ()]
    nat = Transformer(cfg.replace(decoding="uniform_copy"))
    assert [layer.attn.sublayer.pattern.layer.global_tokens for layer in nat.dec_layers] == [(0, 5), ()]
    assert cfg.to_dict()["global_tokens"] == [0, 5] and ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert "global_tokens" not in ModelConfig().to_dict()  # left out at its default: older cell ids stay
    # Longformer's separate global projections (the default) are left out too; shared is written
    assert "global_projections" not in cfg.to_dict() and "global_projections" not in ModelConfig().to_dict()
    shared = cfg.replace(global_projections="shared")
    assert shared.to_dict()["global_projections"] == "shared" and ModelConfig.from_dict(shared.to_dict()) == shared


# --- one model, one spelling (models/spelling.py) -------------------------------------------------------------

RESPELLINGS = [  # (case, keys as given, the spelling asked for)
    (
        "a window schedule whose windows are all 1",
        {"pattern": "local", "window": 1, "window_schedule": "increasing", "n_layers": 4},
        {"pattern": "local", "window": 1},
    ),
    (
        "a window schedule over one windowed layer",
        {"layer_patterns": ["local", "full"], "window": 3, "window_schedule": "decreasing"},
        {"layer_patterns": ["local", "full"], "window": 3},
    ),
    ("equal layer_windows", {"pattern": "local", "layer_windows": [4, 4]}, {"pattern": "local", "window": 4}),
    (
        "layer_windows that follow a schedule",
        {"pattern": "local", "n_layers": 4, "layer_windows": [3, 6, 10, 13]},
        {"pattern": "local", "n_layers": 4, "window": 8, "window_schedule": "increasing"},
    ),
    (
        "a dilation schedule over one dilated layer",
        {"pattern": "dilated", "n_layers": 1, "window": 2, "dilation": 3, "dilation_schedule": "fixed"},
        {"pattern": "dilated", "n_layers": 1, "window": 2, "dilation": 3},
    ),
    (
        "layer_dilations that follow a schedule",
        {"pattern": "dilated", "n_layers": 3, "window": 2, "layer_dilations": [3, 3, 3]},
        {"pattern": "dilated", "n_layers": 3, "window": 2, "dilation": 3, "dilation_schedule": "fixed"},
    ),
    (
        "one list of head_dilations per layer, all the same",
        {"pattern": "dilated", "window": 2, "head_dilations": [[1, 2, 1, 3], [1, 2, 1, 3]]},
        {"pattern": "dilated", "window": 2, "head_dilations": [1, 2, 1, 3]},
    ),
    (
        "head_dilations that are dilation and dilated_heads",
        {"pattern": "dilated", "window": 2, "head_dilations": [[1, 1, 1, 1], [1, 1, 4, 4]]},
        {"pattern": "dilated", "window": 2, "dilation": 4, "dilated_heads": 2},
    ),
    (
        "head_dilations that are one dilation per layer",
        {
            "pattern": "dilated",
            "window": 2,
            "n_layers": 3,
            "head_dilations": [[1, 1, 1, 1], [1, 1, 1, 5], [1, 1, 1, 2]],
        },
        {"pattern": "dilated", "window": 2, "n_layers": 3, "layer_dilations": [1, 5, 2]},
    ),
    (
        "layer_patterns that repeat one pattern",
        {"layer_patterns": ["local", "local"], "window": 2},
        {"pattern": "local", "window": 2},
    ),
    (
        "layer_patterns that are Longformer's default dilated pattern",
        {"layer_patterns": ["local", "dilated"], "window": 2, "dilation": 3},
        {"pattern": "dilated", "window": 2, "dilation": 3},
    ),
    (
        "a dilated layer whose heads are all undilated, among full layers",
        {"layer_patterns": ["dilated", "dilated", "full"], "n_layers": 3, "window": 2, "dilation": 3},
        {"layer_patterns": ["local", "dilated", "full"], "n_layers": 3, "window": 2, "dilation": 3},
    ),
    (
        "schedules over an encoder and a decoder of different depths, constant in both",
        {
            "arch": "encoder_decoder",
            "n_decoder_layers": 3,
            "pattern": "local",
            "window": 1,
            "window_schedule": "increasing",
        },
        {"arch": "encoder_decoder", "n_decoder_layers": 3, "pattern": "local", "window": 1},
    ),
]


@pytest.mark.parametrize("case,keys,better", RESPELLINGS, ids=[c for c, _, _ in RESPELLINGS])
def test_a_setting_that_resolves_to_another_spelling_is_refused_with_that_spelling(case, keys, better):
    """Two spellings of one model would be two variants and two cell ids of one model (docs/components.md); the
    refusal names the spelling to use, which is accepted and resolves to the same attention in every stack."""
    written = ", ".join(f"{k}: {v}" for k, v in better.items() if k not in ("n_layers", "arch", "n_decoder_layers"))
    with pytest.raises(ConfigError, match=r"resolves to the same attention as " + re.escape(written) + r": write that"):
        ModelConfig(**{"n_heads": 4, "d_model": 16, **keys})
    cfg = ModelConfig(**{"n_heads": 4, "d_model": 16, **better})
    stacks = {cfg.n_layers, cfg.decoder_layers} if cfg.arch == "encoder_decoder" else {cfg.n_layers}
    assert all(cfg.attention_layers(n) for n in stacks)


IGNORED = [  # values a layer does not read: null is the one spelling
    ({"layer_patterns": ["local", "full"], "layer_windows": [2, 5]}, r"layer_windows\[1\]=5 is given for layer 1"),
    (
        {"layer_patterns": ["dilated", "local"], "window": 2, "layer_dilations": [2, 3]},
        r"layer_dilations\[1\]=3 is given for layer 1, whose pattern does not use it: write null",
    ),
    (
        {"layer_patterns": ["local", "dilated"], "window": 2, "head_dilations": [[1, 1, 1, 2], [1, 1, 2, 3]]},
        r"head_dilations\[0\]=\[1, 1, 1, 2\] is given for layer 0",
    ),
    ({"pattern": "local", "layer_patterns": ["local", "full"], "window": 2}, r"pattern='local' is not read"),
]


@pytest.mark.parametrize("keys,message", IGNORED, ids=[m for _, m in IGNORED])
def test_a_value_no_layer_reads_is_refused(keys, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{"n_heads": 4, "d_model": 16, **keys})


def test_the_null_spellings_are_accepted_and_distinct_models_are_not_refused():
    ok = [
        {"layer_patterns": ["local", "full", "local"], "n_layers": 3, "layer_windows": [2, None, 5]},
        {
            "layer_patterns": ["dilated", "full", "dilated"],
            "n_layers": 3,
            "window": 2,
            "layer_dilations": [3, None, 2],
        },
        {
            "layer_patterns": ["dilated", "full", "dilated"],
            "n_layers": 3,
            "window": 2,
            "head_dilations": [[1, 2, 1, 3], None, [1, 1, 3, 2]],
        },
        {"pattern": "local", "n_layers": 4, "window": 8, "window_schedule": "increasing"},
        {"pattern": "dilated", "n_layers": 4, "window": 2, "dilation": 4, "dilation_schedule": "decreasing"},
        {"pattern": "local", "layer_windows": [2, 5]},  # a mean of 3.5: no schedule gives it
        {
            "arch": "encoder_decoder",
            "n_decoder_layers": 3,
            "pattern": "local",
            "window": 3,
            "window_schedule": "increasing",
        },
    ]
    for keys in ok:
        ModelConfig(**{"n_heads": 4, "d_model": 16, **keys})


def test_a_value_equal_to_what_leaving_it_out_means_is_written_as_left_out():
    """Such values are not refused: they are one spelling in the cell id (record.spec.configs.canonical)."""
    from record.spec.configs import canonical

    for keys, same in [
        ({"positions": "learned", "position_init_std": 1.0}, {"positions": "learned"}),
        (
            {"positions": "learned", "scale_embeddings": False, "position_init_std": 16**-0.5},
            {"positions": "learned", "scale_embeddings": False},
        ),
        (
            {"pattern": "dilated", "window": 2, "dilation": 2, "dilated_heads": 1},
            {"pattern": "dilated", "window": 2, "dilation": 2},
        ),
        ({"head_dim": 4}, {}),
    ]:
        base = {"n_heads": 4, "d_model": 16}
        assert canonical(ModelConfig(**base, **keys)) == canonical(ModelConfig(**base, **same))


# --- a refusal as data (ConfigError's field, value, fix): what the spec layer blames a file's line on -----------

EVERY_REFUSAL = (
    [keys for keys, _ in REFUSED]
    + [{"n_heads": 4, "d_model": 16, **keys} for keys, _ in IGNORED]
    + [{"n_heads": 4, "d_model": 16, **keys} for _, keys, _ in RESPELLINGS]
    + [{"n_heads": 2, "d_model": 8, "pattern": "dilated", "window": 2, "head_dilations": [2, 3]}]
)


@pytest.mark.parametrize("keys", EVERY_REFUSAL, ids=[str(k) for k in EVERY_REFUSAL])
def test_every_refusal_names_its_field_as_data(keys):
    """The all-default config builds, so a refusal reads at least one key the config was given: ``fields`` must
    hold it (the spec layer blames that key's line). The field is a real key, the message names it, and the fix
    is said."""
    ModelConfig()
    with pytest.raises(ConfigError) as info:
        ModelConfig(**keys)
    err, names = info.value, set(ModelConfig.__dataclass_fields__)
    assert err.field in names and set(err.related) <= names, err.fields
    assert set(err.fields) & set(keys), (err.fields, keys)
    assert err.field in str(err) and err.fix and err.message == str(err)


@pytest.mark.parametrize(
    "keys,field,value,related",
    [
        ({"d_model": 100, "n_heads": 3}, "d_model", 100, ("n_heads",)),  # the default refused beside n_heads=3
        ({"pattern": "local"}, "window", None, ("pattern", "layer_patterns")),  # a key missing beside its need
        ({"pattern": "local", "layer_windows": [2, 0]}, "layer_windows", 0, ()),  # an entry: its list, its value
        ({"pattern": "local", "layer_windows": [4, 4]}, "layer_windows", [4, 4], ("pattern", "window")),
        ({"positions": "rotary", "score": "additive"}, "positions", "rotary", ("score",)),
    ],
)
def test_a_refusal_carries_the_field_at_fault_its_value_and_the_keys_it_reads(keys, field, value, related):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**keys)
    assert (info.value.field, info.value.value, info.value.related) == (field, value, related)


def test_a_refusal_survives_pickling_with_its_fields():
    """Ray carries a trial's exception to the driver by pickling it."""
    import pickle

    with pytest.raises(ConfigError) as info:
        ModelConfig(d_model=100, n_heads=3)
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is ConfigError and str(back) == str(info.value)
    assert (back.field, back.value, back.fix, back.related) == (
        info.value.field,
        info.value.value,
        info.value.fix,
        info.value.related,
    )


def test_every_config_error_in_models_passes_field_value_and_fix():
    """Raises no test reaches included: the keywords are required, and a missing one would be a TypeError in a
    user's hands instead of the refusal."""
    import ast
    from pathlib import Path

    from tests.conftest import ROOT

    missing = []
    for path in sorted(Path(ROOT, "models").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ConfigError"
            if call and not {"field", "value", "fix"} <= {k.arg for k in node.keywords}:
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing


# --- one validation system: pydantic (models/fields.py, models/checks.py, models/errors.py) ----------------------


@pytest.mark.parametrize(
    "keys,field",
    [
        ({"d_model": 0, "arch": "rnn"}, "arch"),  # the choices first
        ({"n_layers": 300, "d_model": 0}, "d_model"),  # every size positive, then the counts' bounds
        ({"dropout": 2, "bias": 1, "norm_eps": 0}, "dropout"),  # the probabilities, the flags, the other numbers
        ({"bias": 1, "norm_eps": 0}, "bias"),
        ({"layer_windows": [2, 0], "d_model": 100, "n_heads": 3}, "layer_windows"),  # a field's own, then the rules
    ],
)
def test_the_first_of_several_mistakes_is_said_in_the_order_of_the_fields_own_checks(keys, field):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**keys)
    assert info.value.field == field, str(info.value)


def test_values_are_strict_and_kept_as_written():
    """True is not a number nor 1 a boolean; a number written as an integer stays one (a config's dictionary, hence
    its cell id, is what it was); a key no field has is a TypeError, as a dataclass's."""
    for keys, message in [
        ({"norm_eps": True}, r"norm_eps=True must be a positive number"),
        ({"bias": 1}, r"bias=1 must be true or false"),
        ({"n_layers": 2.0}, r"n_layers=2.0 must be a positive integer"),
        ({"head_dilations": 5}, r"head_dilations=5 must be a list of positive integers"),
        ({"layer_patterns": "local"}, r"layer_patterns='local' must be a list of patterns, one per layer"),
    ]:
        with pytest.raises(ConfigError, match=message):
            ModelConfig(**keys)
    cfg = ModelConfig(dropout=0, positions="learned", position_init_std=1)
    assert type(cfg.dropout) is int and cfg.to_dict()["dropout"] == 0 and type(cfg.to_dict()["dropout"]) is int
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_head'"):
        ModelConfig(n_head=4)


# --- the cross-attention's own score and projections (issue 63): Luong et al.'s setting ------------------------

ED = {"arch": "encoder_decoder", "d_model": 16, "n_heads": 2}
CROSS_REFUSED = [  # (keys, message, field, related)
    (
        {"cross_score": "general"},
        r"cross_score sets the cross-attention of arch='encoder_decoder'; arch='decoder' has none, so it would change "
        r"nothing: remove it",
        "cross_score",
        ("arch",),
    ),
    (
        {"arch": "encoder", "n_classes": 3, "cross_qk_projections": False},
        r"cross_qk_projections sets the cross-attention of arch='encoder_decoder'; arch='encoder' has none",
        "cross_qk_projections",
        ("arch",),
    ),
    (
        {**ED, "cross_score": "genral"},
        r"cross_score='genral' is not a valid choice; did you mean 'general'\?",
        "cross_score",
        (),
    ),
    (
        {**ED, "cross_qk_projections": "no"},
        r"cross_qk_projections='no' must be true, false or null",
        "cross_qk_projections",
        (),
    ),
    (
        {**ED, "head_dim": 4, "cross_qk_projections": False},
        r"cross_qk_projections=false scores target states against source states themselves, each of the n_heads=2 "
        r"heads over its slice of head_dim=4, which must cover d_model=16",
        "head_dim",
        ("cross_qk_projections", "n_heads", "d_model"),
    ),
]


@pytest.mark.parametrize("keys,message,field,related", CROSS_REFUSED, ids=[str(c[0]) for c in CROSS_REFUSED])
def test_a_cross_key_that_changes_nothing_or_cannot_be_built_is_refused(keys, message, field, related):
    """cross_score and cross_qk_projections set the encoder_decoder's cross-attention: elsewhere there is none, and
    the key would spell one model two ways; over the states themselves the heads' slices must tile d_model."""
    with pytest.raises(ConfigError, match=message) as info:
        ModelConfig(**keys)
    assert (info.value.field, info.value.related) == (field, related) and info.value.fix
    assert info.value.value == keys[field] if field in keys else info.value.value is None


def test_the_cross_keys_default_to_the_self_attentions_and_an_equal_value_is_written_as_left_out():
    """Left out, the cross-attention scores as the self-attention does (every config written before the keys
    existed keeps its dictionary, hence its cell id); a value equal to that is the same model, written as left out;
    MLflow's params (``effective``) show what the cross-attention does."""
    from record.spec.configs import canonical, effective

    plain = ModelConfig(**ED, score="general")
    assert (plain.cross_attention_score, plain.cross_attention_projected) == ("general", True)
    assert not {"cross_score", "cross_qk_projections"} & set(plain.to_dict())
    assert ModelConfig().cross_attention_score is None and "cross_score" not in ModelConfig().to_dict()
    for same in (
        ModelConfig(**ED, score="general", cross_score="general"),
        ModelConfig(**ED, score="general", cross_qk_projections=True),
    ):
        assert same.to_dict() == plain.to_dict() and canonical(same) == canonical(plain)
    states = ModelConfig(**ED, qk_projections=False)
    assert ModelConfig(**ED, qk_projections=False, cross_qk_projections=False).to_dict() == states.to_dict()

    luong = ModelConfig(**ED, cross_score="general", cross_qk_projections=False)
    assert (luong.score, luong.qk_projections) == ("dot", True)
    assert (luong.cross_attention_score, luong.cross_attention_projected) == ("general", False)
    assert {k: luong.to_dict()[k] for k in ("cross_score", "cross_qk_projections")} == {
        "cross_score": "general",
        "cross_qk_projections": False,
    }
    assert ModelConfig.from_dict(luong.to_dict()) == luong and canonical(luong) != canonical(plain)
    assert "crossgeneral-states" in luong.describe() and "cross" not in plain.describe()
    assert (effective(luong)["cross_score"], effective(plain)["cross_score"]) == ("general", "general")
    assert effective(ModelConfig())["cross_score"] is None
    # rotary positions need a dot-product score in the self-attention only: the cross-attention has no positions
    ModelConfig(**ED, positions="rotary", cross_score="additive", cross_qk_projections=False)
