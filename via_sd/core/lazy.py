"""A package's public names, each loaded from its module on first use (PEP 562): `import via_sd` and `import
via_sd.bench` stay light, and whoever uses a name pays for its module's imports (torch, for most)."""

from __future__ import annotations

from importlib import import_module


def lazy_names(package: str, namespace: dict, public: dict[str, tuple[str, ...]]):
    """(__all__, __getattr__, __dir__) of `package` (its globals: `namespace`) whose names in `public`
    ({submodule: names}) load on first use."""
    where = {name: module for module, names in public.items() for name in names}

    def __getattr__(name: str):
        if name in where:
            value = namespace[name] = getattr(import_module(f".{where[name]}", package), name)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(where))

    return sorted(where), __getattr__, __dir__
