"""record.secrets: passwords and tokens are masked wherever they appear, and nothing else changes.

Oracles: SQLAlchemy's own password hiding (``URL.render_as_string(hide_password=True)``, which also writes
``***``) for database URLs, and urllib's parsers for the parts of a URL that must survive."""

from __future__ import annotations

import os
import secrets as std_secrets
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from sqlalchemy.engine import make_url

from record.secrets import (
    MASK,
    redact,
    redact_mapping,
    redact_url,
    register,
    register_url,
    secret_values,
    split_credentials,
)

PASSWORDS = ["s3cr3t-pw_0123", "p@ss:w/rd?#&=%", "äöü ünïcødé", "x" * 64]

DB_URLS = [
    "postgresql://optuna:{pw}@postgres:5432/optuna",
    "postgresql+psycopg://mlflow:{pw}@10.0.0.5:6543/mlflow_auth?sslmode=require",
    "mysql+pymysql://root:{pw}@db.internal/optuna",
    "postgresql://optuna:{pw}@[::1]:5432/optuna",
]


@pytest.mark.parametrize("template", DB_URLS)
@pytest.mark.parametrize("password", PASSWORDS)
def test_database_urls_are_masked_as_sqlalchemy_masks_them(template, password):
    url = template.format(pw=quote(password, safe=""))
    expected = make_url(url).render_as_string(hide_password=True)
    assert redact_url(url) == expected
    message = f"error: could not connect to {url} (timeout after 30 s)"
    assert redact(message) == f"error: could not connect to {expected} (timeout after 30 s)"
    assert quote(password, safe="") not in redact(message)


@pytest.mark.parametrize("password", PASSWORDS)
def test_every_other_part_of_the_url_survives(password):
    url = f"https://researcher:{quote(password, safe='')}@mlflow.example.org:8443/api/2.0?a=1&b=two#frag"
    for masked in (redact_url(url), redact(url)):
        got, want = urlsplit(masked), urlsplit(url)
        assert (got.scheme, got.hostname, got.port, got.path, got.fragment, got.username) == (
            want.scheme,
            want.hostname,
            want.port,
            want.path,
            want.fragment,
            want.username,
        )
        assert got.password == MASK
        assert parse_qs(got.query) == parse_qs(want.query)


def test_an_unencoded_at_sign_in_the_password_leaves_nothing_of_it():
    text = "storage postgresql://optuna:hunter@2@postgres:5432/optuna failed"
    out = redact(text)
    assert "hunter" not in out and "@2" not in out
    assert out == f"storage postgresql://optuna:{MASK}@postgres:5432/optuna failed"


def test_several_urls_in_one_line_are_each_masked():
    text = "tracking http://ray:aaaaaaaa1@mlflow:5000, storage postgresql://optuna:bbbbbbbb2@postgres/optuna."
    out = redact(text)
    assert "aaaaaaaa1" not in out and "bbbbbbbb2" not in out
    assert "http://ray:***@mlflow:5000" in out and "postgresql://optuna:***@postgres/optuna." in out


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("token", "abc123def"),
        ("access_token", "ya29.a0AfH6"),
        ("X-Amz-Signature", "0f1e2d3c4b5a"),
        ("X-Amz-Security-Token", "FwoGZXIvYXdzE"),
        ("sig", "r2D2%2Bc3po%3D"),
        ("password", "pw-in-query"),
        ("api_key", "AKIA0000"),
        ("client_secret", "s3cr3t"),
    ],
)
def test_secret_query_parameters_are_masked_and_the_others_kept(key, value):
    url = f"https://store.example.org/bucket/obj?versionId=7&{key}={value}&expires=3600"
    for masked in (redact_url(url), redact(f"GET {url} -> 403")):
        assert value not in masked
        query = parse_qs(urlsplit(masked.split()[1] if masked.startswith("GET") else masked).query)
        assert query[key] == [MASK]
        assert query["versionId"] == ["7"] and query["expires"] == ["3600"]


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("host=postgres port=5432 user=optuna password=pw-dsn-123 dbname=optuna", "pw-dsn-123"),
        ("ablate search s.yaml --password=cli-pw-456", "cli-pw-456"),
        ('{"username": "ray", "password": "json pw 789"}', "json pw 789"),
        ("{'token': 'repr-token-000'}", "repr-token-000"),
        ("mlflow_password: yaml-pw-111", "yaml-pw-111"),
        ("Authorization: Basic cmF5OnNlY3JldA==", "cmF5OnNlY3JldA=="),
        ("{'Authorization': 'Bearer eyJhbGciOi.J9.x'}", "eyJhbGciOi.J9.x"),
        ("x-ray-authorization: Bearer ray-token-222", "ray-token-222"),
    ],
)
def test_secret_keys_and_headers_are_masked(text, secret):
    out = redact(text)
    assert secret not in out and MASK in out
    assert out.count(MASK) >= 1


@pytest.mark.parametrize(
    "text",
    [
        "[3/8] cell 4f2a9c finished  val_loss=1.2345  tokens_per_s=10234  max_tokens=512  step 200/200",
        "model.n_heads=8 model.d_model=128 training.lr=0.0003 task.vocab_size=64",
        "open: http://127.0.0.1:5000/#/experiments/3/runs/0123456789abcdef",
        "Ray: ray://127.0.0.1:10001, dashboard http://127.0.0.1:8265",
        "store sqlite:////work/.ablate/mlflow.db; optuna journal:/tmp/o.log",
        "postgresql://optuna@postgres:5432/optuna (no password given)",
        "mail alice@example.org about the bypass=1 flag and first_token_loss: 2.5",
        "best: {'training.lr': 0.001, 'model.norm': 'pre'}",
    ],
)
def test_ordinary_text_is_left_alone(text):
    assert redact(text) == text


def test_secret_environment_values_are_masked_wherever_they_appear(monkeypatch):
    password = "Zx9-" + std_secrets.token_urlsafe(12)
    token = std_secrets.token_hex(16)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    monkeypatch.setenv("SOME_SERVICE_API_KEY", "k-" + token[:10])
    monkeypatch.setenv("ABLATE_NOTE", "not-a-secret-value")  # a name that does not say secret
    monkeypatch.setenv("CI_TOKEN", "1")  # too short to mask by value
    text = (
        f"login failed for ray with {password} (encoded: {quote(password + '/@', safe='')}); "
        f"ray token {token} rejected; key k-{token[:10]}; note not-a-secret-value; retries 1"
    )
    monkeypatch.setenv("OTHER_PASSWORD", password + "/@")  # its URL-encoded form is masked too
    out = redact(text)
    assert password not in out and token not in out and token[:10] not in out
    assert "not-a-secret-value" in out and "retries 1" in out
    assert set(secret_values()) >= {password, token, quote(password + "/@", safe="")}


def test_registered_values_and_url_passwords_are_masked_from_then_on():
    value = "reg-" + std_secrets.token_urlsafe(10)
    assert value in redact(f"trial failed: {value}")
    register(value)
    assert redact(f"trial failed: {value}") == f"trial failed: {MASK}"
    pw = "p/w@" + std_secrets.token_urlsafe(8)
    register_url(f"postgresql://optuna:{quote(pw, safe='')}@postgres/optuna")
    # the same password, later quoted somewhere that is not a URL (an error message of a driver, say)
    assert pw not in redact(f'FATAL: password "{pw}" rejected')
    register("abc")  # too short to mask by value: ignored
    assert redact("abc abc") == "abc abc"


def test_redaction_is_idempotent(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "idem-" + std_secrets.token_urlsafe(8))
    samples = [
        "postgresql://optuna:pw123456@postgres/optuna?password=xyz123",
        "Authorization: Basic cmF5OnNlY3JldA==",
        '{"token": "abc def ghi"}',
        f"env {std_secrets.token_hex(4)} {os.environ['MLFLOW_TRACKING_PASSWORD']}",
    ]
    for text in samples:
        once = redact(text)
        assert redact(once) == once
        assert redact_url(redact_url(text)) == redact_url(text)


def test_redact_mapping_masks_nested_values_and_secret_keys():
    params = {
        "storage": "postgresql://optuna:map-pw-1@postgres/optuna",
        "training.lr": 0.001,
        "tracking": {"uri": "http://ray:map-pw-2@mlflow:5000", "password": "map-pw-3", "token": ""},
        "urls": ["redis://:map-pw-4@h:6379/0", "sqlite:///x.db"],
        "n_heads": 8,
    }
    out = redact_mapping(params)
    text = repr(out)
    assert not any(f"map-pw-{i}" in text for i in range(1, 5))
    assert out["training.lr"] == 0.001 and out["n_heads"] == 8 and out["urls"][1] == "sqlite:///x.db"
    assert out["tracking"]["password"] == MASK and out["tracking"]["token"] == ""
    assert out["storage"] == "postgresql://optuna:***@postgres/optuna"
    assert params["tracking"]["password"] == "map-pw-3"  # a copy: the input is untouched


@pytest.mark.parametrize("password", PASSWORDS)
def test_split_credentials_takes_them_out_of_the_uri(password):
    url = f"http://ray%40lab:{quote(password, safe='')}@mlflow:5000/sub?x=1"
    clean, user, pw = split_credentials(url)
    assert (clean, user, pw) == ("http://mlflow:5000/sub?x=1", "ray@lab", password)
    assert redact(f"later, a driver error: {password}") == f"later, a driver error: {MASK}"  # registered
    assert split_credentials("http://mlflow:5000") == ("http://mlflow:5000", None, None)
    assert split_credentials("sqlite:///x.db") == ("sqlite:///x.db", None, None)


def test_credentials_reach_a_trial_in_its_arguments_and_show_only_their_names(monkeypatch):
    """The driver's MLflow credentials travel pickled inside a trial's arguments (never Ray's runtime_env, whose
    variables every node's log prints: tests/deployment/test_services.py) and are set in the trial's process."""
    import pickle

    from record.secrets import Credentials

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "you")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-Pa55")
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    sent = pickle.loads(pickle.dumps(Credentials.from_environ()))
    assert "s3cret-Pa55" not in repr(sent) and "MLFLOW_TRACKING_PASSWORD" in repr(sent)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "the node's own")
    sent.apply()  # the trial writes as the driver's user, whatever the node says
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "you" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3cret-Pa55"
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ
