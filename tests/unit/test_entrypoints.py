"""Plug-ins by short name: a name two installed packages register for different classes is
refused, never resolved to one of them in silence (worlds and methods alike)."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from agents.methods.builtin import Grpo
from agents.methods.registry import METHODS_GROUP, method_class
from engine import entrypoints
from engine.world_registry import WORLDS_GROUP, load_world
from scenarios.worlds.minilab import MiniLab

MINILAB = "scenarios.worlds.minilab:MiniLab"
GRPO = "agents.methods.builtin:Grpo"


def installed(monkeypatch: pytest.MonkeyPatch, *eps: tuple[str, str, str]) -> None:
    """The installed entry points are ``(group, name, value)``."""

    def entry_points(group: str) -> list[EntryPoint]:
        return [EntryPoint(name, value, g) for g, name, value in eps if g == group]

    monkeypatch.setattr(entrypoints, "entry_points", entry_points)
    monkeypatch.setattr(entrypoints, "_read", {})


def test_a_world_name_two_packages_register_for_different_classes_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(
        monkeypatch,
        (WORLDS_GROUP, "minilab", MINILAB),
        (WORLDS_GROUP, "minilab", "their_worlds.lab:Lab"),
    )
    with pytest.raises(ValueError, match="world 'minilab' is registered by several") as info:
        load_world("minilab", {})
    assert MINILAB in str(info.value) and "their_worlds.lab:Lab" in str(info.value)
    assert isinstance(load_world(MINILAB, {}), MiniLab)  # its import path still names it


def test_one_class_registered_twice_under_a_name_is_no_clash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An editable install seen next to its own metadata lists its entry points twice."""
    installed(monkeypatch, (WORLDS_GROUP, "minilab", MINILAB), (WORLDS_GROUP, "minilab", MINILAB))
    assert isinstance(load_world("minilab", {}), MiniLab)


def test_a_plugin_method_named_like_a_builtin_is_refused_not_shadowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``method = "grpo"`` ran coevo's GRPO while an installed package's ``grpo`` entry point
    was ignored without a word."""
    installed(monkeypatch, (METHODS_GROUP, "grpo", "their_methods.mine:MyGrpo"))
    with pytest.raises(ValueError, match="is coevo's built-in, and an installed package"):
        method_class("grpo")
    assert method_class("empo2").__name__ == "Empo2"


def test_a_method_name_two_packages_register_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(
        monkeypatch,
        (METHODS_GROUP, "mine", GRPO),
        (METHODS_GROUP, "mine", "their_methods.mine:Other"),
    )
    with pytest.raises(ValueError, match="method 'mine' is registered by several"):
        method_class("mine")
    installed(monkeypatch, (METHODS_GROUP, "mine", GRPO))
    assert method_class("mine").__name__ == "Grpo"


def test_installed_methods_are_read_once_and_again_for_a_name_not_yet_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As worlds: the entry points are read once per process (5-50 ms each time), and again
    only for a short name they did not have (a plug-in installed while the process runs)."""
    reads: list[str] = []
    eps = [EntryPoint("mine", GRPO, METHODS_GROUP)]

    def entry_points(group: str) -> list[EntryPoint]:
        reads.append(group)
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(entrypoints, "entry_points", entry_points)
    monkeypatch.setattr(entrypoints, "_read", {})
    for name in ("grpo", "mine", "empo2", "mine"):
        method_class(name)
    assert reads == [METHODS_GROUP]
    eps.append(EntryPoint("theirs", GRPO, METHODS_GROUP))
    assert method_class("theirs") is Grpo and len(reads) == 2
    with pytest.raises(ValueError, match="unknown method 'nobody'"):
        method_class("nobody")
    assert len(reads) == 3
    method_class(GRPO)  # an import path needs no read
    assert len(reads) == 3


def test_a_plug_in_package_this_user_may_not_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plug-in package whose directory this user may not enter imported as an empty
    namespace package, and the method was refused as "has no class 'MyMethod'": the class is
    there, the directory is not readable."""
    import os
    import sys

    root = tmp_path
    (root / "shutpkg").mkdir()  # (no __init__.py: a namespace package, as one unreadable is)
    (root / "shutpkg" / "meth.py").write_text("class MyMethod: ...\n")
    monkeypatch.syspath_prepend(str(root))
    shut = str(root / "shutpkg")
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != shut and access(p, mode))
    monkeypatch.delitem(sys.modules, "shutpkg", raising=False)
    with pytest.raises(ValueError) as info:
        method_class("shutpkg:MyMethod")
    assert str(info.value) == (
        f"cannot import method module 'shutpkg': {shut} may not be read by this user"
    )
    monkeypatch.setitem(sys.modules, "shutpkg.gone", None)  # as Python finds no module there
    with pytest.raises(ValueError, match=rf"\({shut} may not be read by this user\)$"):
        method_class("shutpkg.gone:MyMethod")


def test_a_world_package_or_search_path_this_user_may_not_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mend for methods left worlds reading "has no class 'W'", and a PYTHONPATH entry
    that may not be read was "is its directory on PYTHONPATH?" (it is)."""
    import os
    import sys

    (tmp_path / "shutworld").mkdir()  # (a namespace package, as one unreadable is)
    monkeypatch.syspath_prepend(str(tmp_path))
    shut = str(tmp_path / "shutworld")
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != shut and access(p, mode))
    monkeypatch.delitem(sys.modules, "shutworld", raising=False)
    with pytest.raises(ValueError, match=rf"^cannot import world module 'shutworld': {shut} may"):
        load_world("shutworld:W", {})
    entry = tmp_path / "entry"
    entry.mkdir()
    monkeypatch.syspath_prepend(str(entry))
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != str(entry) and access(p, mode))
    with pytest.raises(ValueError, match=rf"\({entry} may not be read by this user\)$"):
        method_class("nowhere_pkg_x.meth:M")
