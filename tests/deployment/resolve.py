"""The deployment files read as docker-compose and Kubernetes read them, and the programs they start translated
to this machine (no Docker engine, no Kubernetes here).

Reading: ``.env.example`` with every empty value (a secret) filled with a fresh random one; docker-compose.yml
with compose's variable substitution (``${X}``, ``${X:-default}``, ``${X:?error}``, ``$$``); the manifests in
platform/k8s with Kubernetes' env resolution (``value`` with ``$(VAR)`` expansion, ``secretKeyRef`` into the
Secret made ``--from-env-file=.env``). Where docker-compose is installed, a test checks this reading against
``docker-compose config``.

Translating (``on_this_machine``): only what differs between a container and this machine changes: the
image's paths (/workspace -> the repository), ``tini --`` (not needed for a process), service names
(``postgres:5432`` -> 127.0.0.1:5432, the roles and databases under a test prefix), listening addresses
(0.0.0.0 -> 127.0.0.1: nothing here listens beyond loopback) and ports (free ones). Everything else (the
arguments, the environment, the credentials) is what the files say.
"""

from __future__ import annotations

import re
import secrets
import shlex
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
K8S = ROOT / "platform" / "k8s"


# --- .env ------------------------------------------------------------------------------------------------


def env_values(**overrides: str) -> dict[str, str]:
    """The assignments of .env.example (commented-out ones stay unset), each empty one (a secret) filled with
    a fresh random value, then ``overrides``."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f".env.example: not KEY=VALUE: {line!r}")
        values[key.strip()] = value.strip() or secrets.token_urlsafe(24)
    return {**values, **overrides}


def write_env_file(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


# --- docker-compose --------------------------------------------------------------------------------------

_COMPOSE_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(ValueError):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution (https://docs.docker.com/compose/how-tos/environment-variables/variable-interpolation/)."""

    def one(m: re.Match) -> str:
        if m["escaped"]:
            return "$"
        name = m["name"] or m["bare"]
        op, arg = m["op"], m["arg"] or ""
        is_set, value = name in env, env.get(name, "")
        if op is None:
            return value
        colon = op.startswith(":")
        present = is_set and (value != "" or not colon)
        kind = op[-1]
        if kind == "-":
            return value if present else arg
        if kind == "+":
            return arg if present else ""
        if not present:  # "?"
            raise MissingVariable(f"{name}: {arg}")
        return value

    return _COMPOSE_VAR.sub(one, text)


def _walk(node, env):
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {k: _walk(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, env) for v in node]
    return node


def compose(env: dict[str, str]) -> dict:
    """docker-compose.yml with its anchors merged and every variable substituted from ``env``."""
    return _walk(yaml.safe_load(COMPOSE.read_text()), env)


def compose_env(service: dict) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    return {k: "" if v is None else str(v) for k, v in environment.items()}


def _words(value) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


IMAGE_ENTRYPOINT = ["tini", "--"]  # platform/Dockerfile's ENTRYPOINT


def compose_argv(service: dict) -> list[str]:
    """The program and its arguments as the container runs them (the image's entrypoint unless overridden)."""
    entry = _words(service["entrypoint"]) if "entrypoint" in service else IMAGE_ENTRYPOINT
    return entry + _words(service.get("command"))


# --- Kubernetes ------------------------------------------------------------------------------------------


def k8s_documents() -> list[dict]:
    return [d for f in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def k8s_containers() -> dict[str, dict]:
    """Every container of the manifests by a readable name: Deployment/StatefulSet containers by their name,
    the RayCluster's head and worker groups (``ray-head``, ``ray-worker-cpu``...) and its autoscaler."""
    found: dict[str, dict] = {}
    for doc in k8s_documents():
        kind, spec = doc["kind"], doc.get("spec", {})
        if kind in ("Deployment", "StatefulSet"):
            for c in spec["template"]["spec"]["containers"]:
                found[c["name"]] = c
        elif kind == "RayCluster":
            head = spec["headGroupSpec"]
            for c in head["template"]["spec"]["containers"]:
                found[c["name"]] = {**c, "rayStartParams": head.get("rayStartParams", {})}
            for group in spec["workerGroupSpecs"]:
                for c in group["template"]["spec"]["containers"]:
                    found[f"{c['name']}-{group['groupName']}"] = {
                        **c,
                        "rayStartParams": group.get("rayStartParams", {}),
                    }
            if spec.get("enableInTreeAutoscaling"):
                found["ray-autoscaler"] = spec.get("autoscalerOptions", {})
    return found


_K8S_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def k8s_env(container: dict, secret: dict[str, str], secret_name: str = "ablate-secrets") -> dict[str, str]:
    """A container's environment as the kubelet makes it: envFrom first, then env in order, ``$(VAR)`` expanded
    from the variables defined before it (https://kubernetes.io/docs/tasks/inject-data-application/define-interdependent-environment-variables/)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("secretRef") or {}
        if ref.get("name") == secret_name:
            env.update(secret)
    for item in container.get("env", []):
        if "valueFrom" in item:
            ref = item["valueFrom"].get("secretKeyRef")
            if ref is None:
                continue  # fieldRef and the like: nothing secret, nothing these tests use
            if ref["name"] != secret_name or ref["key"] not in secret:
                raise KeyError(f"{container.get('name')}: {item['name']} refers to a missing secret key {ref}")
            env[item["name"]] = secret[ref["key"]]
        else:
            value = str(item.get("value", ""))
            env[item["name"]] = _K8S_VAR.sub(
                lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value
            )
    return env


def k8s_argv(container: dict) -> list[str]:
    return [str(w) for w in container.get("command", [])] + [str(w) for w in container.get("args", [])]


# --- on this machine -------------------------------------------------------------------------------------


def on_this_machine(argv: list[str]) -> list[str]:
    """A container's command as a process here: no ``tini --``; the image's /workspace is this repository; the
    image's ``python`` and ``ray`` are this interpreter's."""
    if argv[:2] == IMAGE_ENTRYPOINT:
        argv = argv[2:]
    out = []
    for word in argv:
        if word.startswith("/workspace/"):
            word = str(ROOT / word.removeprefix("/workspace/"))
        out.append(word)
    if out and out[0] == "ray":
        out = [sys.executable, "-m", "ray.scripts.scripts", *out[1:]]
    elif out and out[0] == "python":
        out = [sys.executable, *out[1:]]
    return out


def local_database_url(url: str, prefix: str) -> str:
    """A URL to the compose/Kubernetes ``postgres`` service, as the same role and database on this machine's
    PostgreSQL (127.0.0.1:5432) under ``prefix`` (platform/postgres/init.sh's ABLATE_DB_PREFIX)."""
    parts = urlsplit(url)
    if parts.hostname != "postgres" or (parts.port or 5432) != 5432:
        raise ValueError(f"not a URL of the postgres service: {parts.hostname}:{parts.port}")
    userinfo = f"{prefix}{parts.username}" + (f":{parts.password}" if parts.password is not None else "")
    return urlunsplit((parts.scheme, f"{userinfo}@127.0.0.1:5432", f"/{prefix}{parts.path.lstrip('/')}", "", ""))
