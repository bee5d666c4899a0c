"""TextWorld (PyPI ``textworld``, the engine under ALFWorld) games as a coevo world.

Families are TextWorld's challenges: ``coin_collector``, ``treasure_hunter`` and ``cooking``.
Each variant is one game, generated offline by TextWorld's own generator and Inform 7 compiler
from the world's options and a seed derived from the variant, and kept in a cache directory
keyed by those options (``$COEVO_CACHE/textworld/...``), so a second run, or a second world with
the same options, reuses the games. Train variants are ``0 .. train_games - 1``, held-out ones
``1_000_000 ..``; cooking games draw their foods from TextWorld's own train and valid splits.

TextWorld reports a cumulative score; the world turns it into a per-turn reward and scales it
by the game's maximum, so the score is 1.0 exactly when the game is won. Observations lose the
title banner, the prompt and the status line (room, score and moves) TextWorld appends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import structlog

from engine.world import SPLITS, Observation, Task
from scenarios.worlds.options import (
    cache_root,
    check_bool,
    check_int,
    check_names,
    import_extra,
)

FAMILIES = ("coin_collector", "treasure_hunter", "cooking")
CHALLENGE = {f: f"tw-{f}" for f in FAMILIES}
OPEN_GAMES = 8
"""Game interpreters a world keeps open (each holds its own copy of jericho's library)."""
HELDOUT_BASE = 1_000_000
"""Held-out variant ids start here, as in minilab."""
MAX_ROOMS = 100
"""TextWorld 1.7 compiles games of at most 100 rooms."""
COOKING_DEFAULTS: Mapping[str, int | bool] = {
    "recipe": 1,
    "take": 1,
    "go": 1,
    "open": False,
    "cook": False,
    "cut": False,
    "drop": False,
}
_BANNER_CHARS = frozenset(" _|\\/$<>")
_NOISE_LINES = frozenset(
    {"Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"}
)
META_VERBS = frozenset(
    {"save", "restore", "restart", "quit", "q", "die", "script", "unscript", "transcript",
     "noscript"}
)  # fmt: skip
"""The interpreter's own commands: they write or read files in the working directory (a
saved game another episode could restore, a transcript) or end or restart the game. Never
admissible, but a free-text policy can type them; the world answers :data:`REFUSED` and the
turn is spent."""
REFUSED = "That command is not available in this world."
_log = structlog.get_logger("coevo.textworld")
PLAY_LIMIT_S = 60.0
"""Seconds a call that plays (start, reset, step, close: milliseconds each) may hold
:data:`_TW_LOCK` before the calls waiting on it give up: it hung (a damaged game spinning in
jericho) and will never let go."""
GENERATE_LIMIT_S = 900.0
"""The same for generating and compiling a game (1 to 7 s each on a 2-core machine)."""


class _OneAtATime:
    """TextWorld is not thread-safe: games loaded in two threads at once corrupt its logic
    parser (tatsu) state. Every call into it (generate, start, reset, step, close) holds this
    process-wide lock; the calls are pure Python under the GIL, so little parallelism is lost.

    A call that never returns holds it for good, and every other TextWorld game of the process
    then waited on it: each of their calls until ``[world] step_timeout`` (600 s) abandoned it,
    episode after episode, for hours. The lock knows what holds it and since when: a call
    waiting on a holder past its limit (:data:`PLAY_LIMIT_S`, :data:`GENERATE_LIMIT_S`) fails
    at once with what is stuck, so each episode aborts with that reason.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._holder: tuple[str, float, float, int] | None = None  # what, since, limit, thread

    @contextlib.contextmanager
    def held(self, what: str, limit: float = PLAY_LIMIT_S) -> Any:
        """Hold the lock for ``what`` (a call's description), expected to take under ``limit``
        seconds.

        Raises:
            RuntimeError: the holder has held it past its own limit (it hung).
        """
        while not self._lock.acquire(timeout=0.5):
            holder = self._holder
            if holder is not None and (age := time.monotonic() - holder[1]) > holder[2]:
                raise RuntimeError(
                    f"textworld is stuck in this process: {holder[0]} has not returned for "
                    f"{age:.0f} s, and every game of the process waits on it (TextWorld "
                    "plays one call at a time); a damaged game? delete it to have it "
                    "generated again"
                )
        outer = self._holder
        if outer is None or outer[3] != threading.get_ident():
            self._holder = (what, time.monotonic(), limit, threading.get_ident())
        try:
            yield
        finally:
            mine = outer is not None and outer[3] == threading.get_ident()
            self._holder = outer if mine else None
            self._lock.release()


_TW_LOCK = _OneAtATime()
"""The one lock around every call into TextWorld (:class:`_OneAtATime`)."""


def clean(feedback: str) -> str:
    """TextWorld's feedback without the banner, the prompt and the status line.

    Drops lines drawn only with the banner's characters (which also covers the bare ``>``
    prompt), the prompt line that carries the status (``>   -= Kitchen =-0/1``) and the
    restart question after the end; strips every line and keeps at most one blank line in a row.
    """
    lines: list[str] = []
    for raw in feedback.split("\n"):
        line = raw.strip()
        if line.startswith(">") or line in _NOISE_LINES:
            continue
        if line and set(line) <= _BANNER_CHARS:
            continue
        if line or (lines and lines[-1]):
            lines.append(line)
    return "\n".join(lines).strip()


def _quiet_jericho() -> None:
    """Ignore jericho's warning that a game is "not fully supported": it says so of every
    TextWorld game (jericho knows Infocom's games), and TextWorld keeps the score itself.
    Installed again on every use, since tests reset the filters; an identical filter replaces
    the earlier one, so the list does not grow."""
    warnings.filterwarnings("ignore", message=r"Game '.*' is not fully supported")


def game_seed(family: str, variant: int, seed: int) -> int:
    """The generator seed of a variant: a stable hash (TextWorld takes seeds below 2**31)."""
    text = f"textworld/{family}/{variant}/{seed}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") % (2**31 - 1)


class _Episode:
    def __init__(self, task: Task, goal: str, max_score: float, walkthrough: tuple[str, ...]):
        self.task = task
        self.goal = goal
        self.max_score = max_score
        self.walkthrough = walkthrough
        self.steps = 0
        self.points = 0.0
        self.done = False
        self.admissible: tuple[str, ...] = ()


class TextWorldGames:
    """TextWorld challenge games as a coevo world (see the module docstring).

    Args:
        families: challenges offered (default all three, in :data:`FAMILIES` order).
        level: difficulty of coin collector (1-150 and 201-233: at most 100 rooms) and
            treasure hunter (1-30) games.
        cooking: cooking settings, TextWorld's ``tw-cooking`` flags: ``recipe`` (ingredients,
            1-5), ``take`` (ingredients to find, 0-recipe), ``go`` (rooms: 1, 6, 9 or 12),
            ``open``, ``cook``, ``cut``, ``drop`` (booleans).
        train_games: train variants (games) per family.
        heldout_games: held-out variants per family.
        seed: the generation seed every game's own seed derives from.
        max_steps: step limit of every episode.
        cache_dir: where games are kept (default ``$COEVO_CACHE/textworld``).

    Raises:
        ValueError: the ``textworld`` extra is missing or an option is wrong.
    """

    name = "textworld"

    def __init__(
        self,
        *,
        families: Sequence[str] = FAMILIES,
        level: int = 1,
        cooking: Mapping[str, int | bool] | None = None,
        train_games: int = 8,
        heldout_games: int = 4,
        seed: int = 0,
        max_steps: int = 50,
        cache_dir: str | None = None,
    ) -> None:
        self._tw = import_extra("textworld", "textworld")
        names = check_names("families", families)
        unknown = [f for f in names if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown textworld families {unknown}; known: {', '.join(FAMILIES)}")
        self._families = tuple(f for f in FAMILIES if f in names)
        self.level = _check_level(level, self._families)
        self._cooking = _cooking_settings(cooking or {})
        self.train_games = check_int("train_games", train_games, 1, 100_000)
        self.heldout_games = check_int("heldout_games", heldout_games, 0, 100_000)
        self.seed = check_int("seed", seed, 0, 2**31 - 1)
        self.max_steps = check_int("max_steps", max_steps, 1, 100_000)
        if cache_dir is not None and not isinstance(cache_dir, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"cache_dir must be a path, got {cache_dir!r}")
        if cache_dir is not None and not cache_dir.strip():  # read as "not set", silently
            raise ValueError(f"cache_dir is empty ({cache_dir!r}): leave it out for the default")
        version = str(self._tw.__version__)
        self.cache = Path(cache_dir) if cache_dir else cache_root() / "textworld" / version
        there = next((p for p in (self.cache, *self.cache.parents) if p.exists()), None)
        if there is not None and not there.is_dir():  # every episode aborted on it
            raise ValueError(f"cache_dir {str(self.cache)!r}: {str(there)!r} is not a directory")
        self._env: Any = None
        self._envs: dict[Path, Any] = {}
        self._episode: _Episode | None = None
        self.generated = 0
        """Games this instance generated (the rest came from the cache)."""

    # -- the TextWorld protocol -------------------------------------------------------------

    def families(self) -> tuple[str, ...]:
        """The challenges this world offers."""
        return self._families

    def tasks(self, family: str, split: str) -> list[Task]:
        """The games of ``family`` in ``split`` (nothing is generated until one is reset).

        Raises:
            ValueError: unknown family or split.
        """
        self._check(family, split)
        if split == "train":
            return [Task(family=family, variant=v, split=split) for v in range(self.train_games)]
        ids = range(HELDOUT_BASE, HELDOUT_BASE + self.heldout_games)
        return [Task(family=family, variant=v, split=split) for v in ids]

    def reset(self, task: Task, seed: int) -> Observation:
        """Start ``task``'s game (generating it first if the cache lacks it). TextWorld games
        have no randomness of their own, so the seed is not used.

        Raises:
            ValueError: unknown family, split or variant.
        """
        del seed
        self._check_variant(task)
        path = self.game_path(task)
        if path not in self._envs:  # not yet started: a damaged cached game is made again
            self._ensure_game(task, path)
        self._episode = None
        with _TW_LOCK.held(f"world.reset of textworld game {path}"):
            state = self._open(path).reset()
        walkthrough = tuple(str(a) for a in (state.get("extra.walkthrough") or ()))
        goal = " ".join(str(state.objective).split())
        self._episode = _Episode(task, goal, float(state.max_score), walkthrough)
        self._episode.admissible = _commands(state)
        return Observation(
            text=clean(state.feedback), admissible=self._episode.admissible, goal=goal
        )

    def step(self, action: str) -> Observation:
        """Apply ``action``; a command the game does not understand wastes the turn.

        Raises:
            RuntimeError: before ``reset`` or after the episode is done.
        """
        ep = self._episode
        if ep is None or ep.done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        verb = action.split()[:1]
        if verb and verb[0].lower() in META_VERBS:
            ep.steps += 1
            ep.done = ep.steps >= self.max_steps
            return Observation(
                text=REFUSED,
                admissible=() if ep.done else ep.admissible,
                goal=ep.goal,
                done=ep.done,
                score=ep.points / (ep.max_score or 1.0),
            )
        with _TW_LOCK.held(f"world.step({action!r}) of a textworld game"):
            state, points, done = self._env.step(action)
        ep.steps += 1
        won = bool(state.won)
        scale = ep.max_score or 1.0
        reward, ep.points = (float(points) - ep.points) / scale, float(points)
        ep.done = bool(done) or won or bool(state.lost) or ep.steps >= self.max_steps
        ep.admissible = _commands(state)
        return Observation(
            text=clean(state.feedback),
            admissible=() if ep.done else ep.admissible,
            goal=ep.goal,
            reward=reward,
            done=ep.done,
            score=ep.points / scale,
            success=won,
        )

    def close(self) -> None:
        """Close the games' interpreters. Safe to call twice."""
        envs, self._envs, self._env = self._envs, {}, None
        self._episode = None
        with _TW_LOCK.held("world.close of textworld games"):
            for env in envs.values():
                env.close()

    # -- beyond the protocol ------------------------------------------------------------------

    def walkthrough(self) -> tuple[str, ...]:
        """The current game's walkthrough (TextWorld's winning command sequence).

        Raises:
            RuntimeError: before ``reset``.
        """
        if self._episode is None:
            raise RuntimeError("walkthrough() needs a reset() first")
        return self._episode.walkthrough

    def settings(self, family: str, split: str) -> dict[str, Any]:
        """The ``tw-make`` settings of ``family`` (cooking's depend on the split)."""
        if family == "cooking":
            tw_split = "train" if split == "train" else "valid"
            return {**self._cooking, "recipe_seed": 0, "split": tw_split}
        return {"level": self.level}

    def game_path(self, task: Task) -> Path:
        """Where ``task``'s game is cached: a directory per family and settings, a file per
        variant."""
        settings = self.settings(task.family, task.split)
        slug = "-".join(f"{k}{_flag(v)}" for k, v in sorted(settings.items()) if v is not False)
        return self.cache / f"{task.family}-{slug}-seed{self.seed}" / f"v{task.variant}.z8"

    # -- internals ------------------------------------------------------------------------------

    def _check(self, family: str, split: str) -> None:
        if family not in self._families:
            raise ValueError(f"unknown textworld family {family!r}; offered: {self._families}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of: {', '.join(SPLITS)}")

    def _check_variant(self, task: Task) -> None:
        self._check(task.family, task.split)
        ids = {t.variant for t in self.tasks(task.family, task.split)}
        if task.variant not in ids:
            raise ValueError(f"{task.family} has no {task.split} variant {task.variant}")

    def _ensure_game(self, task: Task, path: Path) -> None:
        """Make sure ``path`` holds a whole game: generate it if missing, and again if the
        cached one is damaged (jericho's interpreter ends the whole process on a story file it
        cannot read, so it never sees one).

        Raises:
            ValueError: the game is still damaged after it was generated again.
        """
        if path.is_file():
            why = broken_game(path)
            if why is None:
                return
            _log.warning("damaged textworld game: generating it again", game=str(path), why=why)
            with _TW_LOCK.held(f"removing damaged textworld game {path}"):
                path.unlink(missing_ok=True)  # the .z8 first: the pair is then incomplete
                path.with_suffix(".json").unlink(missing_ok=True)
        self._generate(task, path)
        if (why := broken_game(path)) is not None:
            raise ValueError(f"textworld game {path} is damaged: {why}")

    def _open(self, path: Path) -> Any:
        """The interpreter of ``path``'s game, started once and kept among the
        :data:`OPEN_GAMES` most recently used (starting one takes tens of milliseconds)."""
        env = self._envs.pop(path, None)
        if env is None:
            _quiet_jericho()
            infos = self._tw.EnvInfos(
                admissible_commands=True,
                objective=True,
                max_score=True,
                won=True,
                lost=True,
                extras=["walkthrough"],
            )
            try:
                env = self._tw.start(str(path), request_infos=infos)
            except Exception as exc:  # a game file damaged where the checks do not look
                raise ValueError(
                    f"textworld game {path} does not load ({type(exc).__name__}: {exc}); "
                    "delete it and its .json to have them generated again"
                ) from exc
        self._envs[path] = env  # most recent last
        while len(self._envs) > OPEN_GAMES:
            oldest = next(iter(self._envs))
            self._envs.pop(oldest).close()
        self._env = env
        return env

    def _generate(self, task: Task, path: Path) -> None:
        """Generate and compile ``task``'s game into ``path`` (and its ``.json`` beside it),
        atomically: a game is built in a temporary directory and moved into place."""
        challenges = import_extra("textworld.challenges", "textworld")
        generator = import_extra("textworld.generator", "textworld")
        _quiet_jericho()  # the generator plays the walkthrough to check it
        with _TW_LOCK.held(f"generating textworld game {path}", GENERATE_LIMIT_S):
            if path.is_file():  # another worker of this process made it meanwhile
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            sweep_stale(path.parent)
            with tempfile.TemporaryDirectory(dir=path.parent, prefix=".gen-") as tmp:
                options = self._tw.GameOptions()
                options.seeds = game_seed(task.family, task.variant, self.seed)
                options.path = str(Path(tmp) / path.name)
                options.file_ext = ".z8"
                options.force_recompile = True
                _, make, _ = challenges.CHALLENGES[CHALLENGE[task.family]]
                game = make(settings=self.settings(task.family, task.split), options=options)
                built = Path(generator.compile_game(game, options))
                os.replace(built.with_suffix(".json"), path.with_suffix(".json"))
                os.replace(built, path)  # last: a .z8 in the cache means a whole game
            self.generated += 1


STALE_S = 3600.0
"""Age past which a game's temporary directory is another process's leftover: a generation
takes seconds, and a process killed during one (SIGKILL) leaves its ``.gen-*`` for good."""


def sweep_stale(folder: Path, now: float | None = None) -> None:
    """Remove the ``.gen-*`` directories in ``folder`` older than :data:`STALE_S`."""
    cutoff = (time.time() if now is None else now) - STALE_S
    for tmp in folder.glob(".gen-*"):
        with contextlib.suppress(OSError):  # another process removed it meanwhile
            if tmp.is_dir() and tmp.stat().st_mtime < cutoff:
                shutil.rmtree(tmp, ignore_errors=True)


def broken_game(path: Path) -> str | None:
    """Why the cached game at ``path`` (a ``.z8`` story file and its ``.json``) cannot be
    played, or None: the Z-machine header's version, length and checksum against the file,
    and the ``.json`` present and readable."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if len(data) < 64:
        return f"{len(data)} bytes, shorter than a Z-machine header"
    version = data[0]
    if not 1 <= version <= 8:
        return f"not a Z-machine story file (version byte {version})"
    length = int.from_bytes(data[0x1A:0x1C], "big") * (
        2 if version <= 3 else 4 if version <= 5 else 8
    )
    checksum = int.from_bytes(data[0x1C:0x1E], "big")
    if not length or not checksum:  # Inform, TextWorld's compiler, always writes both
        return "damaged: its header gives no length or no checksum"
    if not 64 <= length <= len(data):
        return f"cut short or damaged: its header says {length} bytes, the file has {len(data)}"
    if sum(data[0x40:length]) & 0xFFFF != checksum:
        return "damaged: its checksum does not match its contents"
    meta = path.with_suffix(".json")
    try:
        game: object = json.loads(meta.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{meta.name} is missing"
    except (OSError, ValueError) as exc:
        return f"{meta.name} does not read ({exc})"
    lacks = GAME_KEYS - set(cast(dict[str, Any], game)) if isinstance(game, dict) else GAME_KEYS
    if lacks:
        return f"{meta.name} is not a TextWorld game's (no {', '.join(sorted(lacks))})"
    return None


GAME_KEYS = frozenset({"world", "grammar", "quests", "infos", "KB"})
"""The top-level keys of a TextWorld game's ``.json`` that loading the game requires
(TextWorld 1.7's ``Game.deserialize``; it also writes ``version``, ``metadata`` and
``objective``, which it reads if present)."""


def _commands(state: Any) -> tuple[str, ...]:
    return tuple(sorted(set(str(c) for c in (state.admissible_commands or ()))))


def _flag(value: int | bool) -> str:
    return "" if value is True else str(value)


def _check_level(level: object, families: Sequence[str]) -> int:
    """The level, checked against every family that uses it.

    Coin collector (1-300): the quest is ``(level - 1) % 100 + 1`` rooms long and every 100
    levels add that many distractor rooms; TextWorld refuses games of more than 100 rooms.
    Treasure hunter: 1-30.
    """
    value = check_int("level", level, 1, 300)
    if "treasure_hunter" in families and value > 30:
        raise ValueError(f"level must be between 1 and 30 for treasure_hunter, got {value}")
    if "coin_collector" in families and (rooms := _coin_rooms(value)) > MAX_ROOMS:
        allowed = [v for v in range(1, 301) if _coin_rooms(v) <= MAX_ROOMS]
        spans = [  # the runs of consecutive allowed levels: 1-150, 201-233
            f"{a}-{b}"
            for a, b in zip(
                [v for v in allowed if v - 1 not in allowed],
                [v for v in allowed if v + 1 not in allowed],
                strict=True,
            )
        ]
        raise ValueError(
            f"level {value} makes coin_collector games of {rooms} rooms; TextWorld allows "
            f"{MAX_ROOMS} (levels {', '.join(spans[:-1])} and {spans[-1]})"
        )
    return value


def _coin_rooms(level: int) -> int:
    """The rooms of a coin collector game of ``level``: a quest of ``(level - 1) % 100 + 1``
    rooms, and every 100 levels as many distractor rooms again."""
    return ((level - 1) // 100 + 1) * ((level - 1) % 100 + 1)


def _cooking_settings(value: object) -> dict[str, int | bool]:
    if not isinstance(value, Mapping):
        raise ValueError(f"cooking must be a table of settings, got {value!r}")
    settings: Mapping[str, object] = value  # pyright: ignore[reportUnknownVariableType]
    unknown = sorted(set(settings) - set(COOKING_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown cooking settings {unknown}; known: {list(COOKING_DEFAULTS)}")
    merged: dict[str, object] = {**COOKING_DEFAULTS, **settings}
    out: dict[str, int | bool] = {}
    for key, default in COOKING_DEFAULTS.items():
        if isinstance(default, bool):
            out[key] = check_bool(f"cooking.{key}", merged[key])
    out["recipe"] = check_int("cooking.recipe", merged["recipe"], 1, 5)
    out["take"] = check_int("cooking.take", merged["take"], 0, int(out["recipe"]))
    out["go"] = check_int("cooking.go", merged["go"], 1, 12)
    if out["go"] not in (1, 6, 9, 12):
        raise ValueError(f"cooking.go must be 1, 6, 9 or 12, got {out['go']}")
    return out
