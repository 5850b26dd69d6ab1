"""A researcher's own components, tasks and report warnings: plugins.

A plugin is a module that registers through the same registries as the built-in ones (``models.registry``'s
``SCORES``, ``PATTERNS``, ``POSITIONS``, ``NORMS``, ``FEED_FORWARDS``, ``models.tasks.TASKS``,
``dashboards.caveats.WARNINGS``). It is named three ways, all loaded by this module before anything is validated:

  a module name          ``plugins: [my_scores]``: importable here (installed, or on the path)
  a path                 ``plugins: [ideas/neg_distance.py]`` (a file) or ``[ideas/my_pkg]`` (a package folder), relative
                         to the file that names it; imported as the file's stem or the folder's name
  an entry point         an installed distribution that declares ``[project.entry-points."ablate.plugins"]``: loaded by
                         every command and every worker

Each loaded plugin is described (``Plugin``): the module it was imported as, its path, its source files with their
digests, and what it registered. A run's identity holds the digests of the plugins whose components it uses
(``used_by``), so an edited plugin retrains exactly the cells that use it; the digests and file list are recorded with
each run. Workers load the same plugins (``load_refs``) and check they got the same source.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROUP = "ablate.plugins"  # the entry-point group of installed plugins


class PluginError(ImportError):
    """A plugin that cannot be found or imported: ``str(err)`` says which, where, why and the fix."""


class PluginUnavailable(RuntimeError):
    """On a worker: a plugin the driver loaded does not load here. No variant causes it, so it is never a result of
    one: the driver stops the submission with this message (ablations.sweep.driver)."""


@dataclass(frozen=True)
class PluginRef:
    """How a worker loads a plugin the driver loaded: by path when it has the file, else by module name (a path
    that travelled in Ray's runtime environment, ``py_modules``, or an installed module); ``digest``: what it must
    find."""

    module: str
    path: str | None
    digest: str
    entry_point: str | None = None
    travelled: bool = False  # its path went to the cluster in Ray's runtime environment: import Ray's copy by name


@dataclass
class Plugin:
    """A loaded plugin: what it is, where its source is, and what it registered (kind -> names)."""

    spec: str
    module: str
    path: str | None
    files: dict[str, str]  # source file (relative to the module's folder) -> sha256
    digest: str
    registered: dict[str, list[str]] = field(default_factory=dict)
    entry_point: str | None = None
    imported_from: str = ""  # the file Python imported it from (on a worker: Ray's copy)

    @property
    def ref(self) -> PluginRef:
        return PluginRef(self.module, self.path, self.digest, self.entry_point)

    def manifest(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "spec": self.spec,
            "path": self.path,
            "entry_point": self.entry_point,
            "digest": self.digest,
            "files": self.files,
            "registered": self.registered,
            "imported_from": self.imported_from,
        }


LOADED: dict[str, Plugin] = {}  # module -> plugin, in the order loaded
FAILED: dict[str, str] = {}  # what was named -> why it did not import (said beside an unknown name)


_REGISTRIES: dict[str, Any] = {}  # kind -> a registry a plugin may add to (each announces itself: ``track``)
_BUILT_IN: dict[str, set] = {}  # kind -> the names it held when it announced itself


def track(kind: str, registry: Any) -> None:
    """A registry plugins may add to (``models.registry``'s, ``models.tasks.TASKS``, ``dashboards.caveats.WARNINGS``
    call this when they are made): what a plugin registers there is counted as its own. This module imports none
    of them (they import it)."""
    _REGISTRIES[kind] = registry
    _BUILT_IN[kind] = set(registry)


def registries() -> dict[str, Any]:
    """Every registry a plugin may add to that is loaded, by the key that names its entries (kind -> registry)."""
    return dict(_REGISTRIES)


def load(specs: Iterable[str], base: str | Path | None = None, *, what: str = "") -> list[Plugin]:
    """Import each plugin named (module names, or paths relative to ``base``), once; PluginError when one cannot be.
    ``what``: where they were named (a file, ``--plugin``), for the messages."""
    out = []
    for spec in specs:
        module, path = resolve(spec, base, what)
        out.append(_import(spec, module, path, None, what))
    return out


def load_installed() -> list[Plugin]:
    """Every installed plugin (entry points of ``GROUP``); one that fails is remembered (``FAILED``), not raised:
    an unknown name then says why."""
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=GROUP):
        try:
            out.append(_import(ep.value, ep.module, None, ep.name, f"entry point {ep.name!r} of group {GROUP!r}"))
        except PluginError as err:
            FAILED[ep.value] = str(err)
    return out


def resolve(spec: str, base: str | Path | None, what: str = "") -> tuple[str, str | None]:
    """(module name, path or None) of a plugin as written: a path (it has a slash, or ends in .py, or names an
    existing folder or file relative to ``base``) or a dotted module name."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(
            f"{what}: a plugin is a module name or a path to a .py file or a package folder (got {spec!r})"
        )
    candidate = Path(spec).expanduser()
    if not candidate.is_absolute() and base is not None:
        candidate = Path(base) / candidate
    looks_like_path = "/" in spec or spec.endswith(".py") or candidate.exists()
    if not looks_like_path:
        return spec, None
    if not candidate.exists():
        raise PluginError(f"{what}: plugin {spec!r}: no such file or folder ({candidate}); give its path, relative to "
                          "the file that names it, or the name of an installed module")  # fmt: skip
    candidate = candidate.resolve()
    if candidate.is_dir() and not (candidate / "__init__.py").exists():
        raise PluginError(f"{what}: plugin {spec!r}: {candidate} is a folder without __init__.py: name a package "
                          "folder, or the .py file itself")  # fmt: skip
    if candidate.is_file() and candidate.suffix != ".py":
        raise PluginError(f"{what}: plugin {spec!r}: {candidate} is not a .py file or a package folder")
    return candidate.stem if candidate.is_file() else candidate.name, str(candidate)


def _import(spec: str, module: str, path: str | None, entry_point: str | None, what: str) -> Plugin:
    if module in LOADED:
        return _same_plugin(LOADED[module], path, what)
    before = {kind: set(reg) for kind, reg in registries().items()}
    try:
        mod = _import_module(module, path)
    except PluginError:
        raise
    except Exception as err:  # anything its import raised: said once, with the plugin's name
        FAILED[spec] = f"{type(err).__name__}: {err}"
        raise PluginError(f"{what}: plugin {spec!r} failed to import: {type(err).__name__}: {err}") from err
    FAILED.pop(spec, None)
    files = source_files(mod)
    plugin = Plugin(
        spec=spec,
        module=module,
        path=path,
        files=files,
        digest=_digest(files),
        entry_point=entry_point,
        imported_from=str(getattr(mod, "__file__", "") or ""),
    )
    plugin.registered = {}
    for kind, registry in registries().items():  # a registry the plugin loaded itself: its built-ins are not its own
        new = sorted(set(registry) - before.get(kind, _BUILT_IN[kind]))
        if new:
            plugin.registered[kind] = new
    LOADED[module] = plugin
    return plugin


def _same_plugin(plugin: Plugin, path: str | None, what: str) -> Plugin:
    if path is not None and plugin.path is not None and Path(path) != Path(plugin.path):
        raise PluginError(
            f"{what}: two plugins are both named {plugin.module!r} ({plugin.path} and {path}): rename one"
        )
    return plugin


def _import_module(module: str, path: str | None):
    if path is None:
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is not None and module.split(".")[0] == err.name.split(".")[0]:
                raise PluginError(
                    f"plugin {module!r} is not an installed module here (python {sys.executable}): install it, or name "
                    "its .py file or package folder"
                ) from err
            raise
    existing = sys.modules.get(module)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() != _init_of(path):
        raise PluginError(
            f"plugin {path} would be imported as {module!r}, a module already loaded from "
            f"{getattr(existing, '__file__', 'elsewhere')}: rename the plugin"
        )
    location = _init_of(path)
    spec = importlib.util.spec_from_file_location(
        module, location, submodule_search_locations=[path] if Path(path).is_dir() else None
    )
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path} cannot be imported (not a Python file)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(module, None)
        raise
    return mod


def _init_of(path: str) -> Path:
    p = Path(path)
    return (p / "__init__.py").resolve() if p.is_dir() else p.resolve()


def source_files(mod) -> dict[str, str]:
    """The plugin's source: its file, or every .py file of its package folder, with their sha256."""
    origin = Path(getattr(mod, "__file__", "") or "")
    if not origin.name:
        return {}
    if origin.name == "__init__.py":
        root = origin.parent
        found = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    else:
        root, found = origin.parent, [origin]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in found}


def _digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{files[name]}\0".encode())
    return h.hexdigest()[:16]


# --- which plugins a run uses ---------------------------------------------------------------------------------------


def owner(kind: str, name: str) -> Plugin | None:
    """The loaded plugin that registered ``name`` in the registry of ``kind``, if any."""
    for plugin in LOADED.values():
        if name in plugin.registered.get(kind, ()):
            return plugin
    return None


def used_by(names: dict[str, Iterable[str]]) -> dict[str, str]:
    """module -> digest of the plugins that registered any of ``names`` (kind -> the names a run uses)."""
    out = {}
    for kind, values in names.items():
        for name in values:
            plugin = owner(kind, name)
            if plugin is not None:
                out[plugin.module] = plugin.digest
    return dict(sorted(out.items()))


def refs(travelled: bool = False) -> list[PluginRef]:
    """How a worker loads every plugin loaded here; ``travelled``: the plugins named by path go to the workers in
    Ray's runtime environment (a cluster at an address), which they import by name."""
    return [dataclasses.replace(p.ref, travelled=travelled and p.path is not None) for p in LOADED.values()]


def load_refs(refs_: Iterable[PluginRef]) -> list[Plugin]:
    """On a worker: each plugin the driver loaded, by its path where this machine has it, else by module name (Ray's
    copy, or installed); PluginError when it is missing or its source differs from the driver's."""
    out = []
    for ref in refs_:
        path = ref.path if ref.path is not None and Path(ref.path).exists() and not ref.travelled else None
        where = "the driver's plugin"
        if ref.entry_point is not None:
            where = f"entry point {ref.entry_point!r} of group {GROUP!r}"
        plugin = _import(ref.path or ref.module, ref.module, path, ref.entry_point, where)
        if plugin.digest != ref.digest:
            raise PluginError(
                f"plugin {ref.module!r} here ({plugin.imported_from}) is not the driver's: its source differs "
                f"(digest {plugin.digest}, the driver's {ref.digest}); install the same version on every node, or name "
                "it by path so that it travels with the submission"
            )
        out.append(plugin)
    return out


def unknown_hint(kind: str) -> str:
    """What an unknown name's refusal adds: how to load a component of one's own, and the plugins that failed."""
    hint = (
        f"a {kind} of your own is loaded by naming its module or file in `plugins:` (run, study or search file) or "
        "with --plugin (docs/plugins.md)"
    )
    if FAILED:
        hint += "; these plugins did not import: " + "; ".join(f"{k} ({v})" for k, v in FAILED.items())
    return hint


def load_on_worker(refs_: list[PluginRef]) -> None:
    """The driver's plugins on a worker, before anything is read or recorded; PluginUnavailable naming this machine."""
    if not refs_:
        return
    import socket

    try:
        load_refs(refs_)
    except Exception as err:  # not found, failed to import, another version
        raise PluginUnavailable(f"on {socket.gethostname()}: {err}") from None
