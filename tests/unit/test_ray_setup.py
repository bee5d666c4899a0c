"""The ``[runtime]`` backend of a scenario, checked before anything runs (no Ray instance needed):
what ``backend = "ray"`` assembles, what it refuses, and the placement's bounds."""

from __future__ import annotations

import concurrent.futures
import contextlib
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import structlog.testing
import trio

from agents.learning.trainee_host import LearnerProcessLost
from engine import ray_backend, ray_cluster
from engine.actor import Actor, ActorSpec, Context
from engine.errors import ClusterUnavailable, ScenarioInvalid
from engine.events import Event
from engine.recovery import Replayed
from engine.remote import Inflight, RemoteActorLost, RemoteActorRestartable, RemoteClusterLost
from scenarios.assemble import assemble, cluster
from scenarios.cli import main
from scenarios.loader import load_scenario

ROLLOUT = """
name = "ray-setup"

[agent]
kind = "explorer"

[run]
episodes = 4
workers = 2

[runtime]
backend = "ray"
"""


def scenario_path(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "s.toml"
    path.write_text(ROLLOUT + extra, encoding="utf-8")
    return path


def test_a_ray_scenario_places_its_env_workers_behind_proxies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_backend, "available", lambda: True)  # Ray is not started
    extra = "\n[runtime.ray.env_workers]\nnum_cpus = 0.5\nresources = { env = 1 }\nin_flight = 3\n"
    path = scenario_path(tmp_path, extra)
    assembly = assemble(load_scenario(path), str(path))
    by_name = {spec.name: spec for spec in assembly.specs}
    assert set(by_name) == {"scheduler", "worker-0", "worker-1"}
    proxy = by_name["worker-1"].factory()
    assert type(proxy).__name__ == "RemoteEnvWorker"
    assert isinstance(proxy, ray_backend.RemoteActor)
    assert proxy.restart_for == (Exception,)  # restarted for any error, as in the driver
    assert "EpisodeAssigned" in [t.__name__ for t in proxy.subscribes]
    placement = by_name["worker-1"].factory.placement  # pyright: ignore[reportFunctionMemberAccess]
    assert placement == ray_backend.Placement(num_cpus=0.5, resources={"env": 1.0}, in_flight=3)
    assert by_name["worker-1"].accepts is not None  # still only its own assignments
    assert type(by_name["scheduler"].factory()).__name__ == "Scheduler"  # the driver's


def test_workers_per_process_share_one_process_record_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_backend, "available", lambda: True)  # Ray is not started
    path = scenario_path(tmp_path, "\n[runtime.ray.env_workers]\nper_process = 2\n")
    text = path.read_text(encoding="utf-8").replace("workers = 2", "workers = 5")
    path.write_text(text, encoding="utf-8")
    assembly = assemble(load_scenario(path), str(path))
    factories = {s.name: s.factory for s in assembly.specs if s.name.startswith("worker-")}
    process = {name: f.process for name, f in factories.items()}  # pyright: ignore[reportFunctionMemberAccess]
    groups = [["worker-0", "worker-1"], ["worker-2", "worker-3"], ["worker-4"]]
    for group in groups:
        assert all(process[n] is process[group[0]] for n in group)
    assert len({id(p) for p in process.values()}) == 3
    assert [process[g[0]]._size for g in groups] == [2, 2, 1]  # what each reserves for


POLICY = """
name = "ray-inference"

[agent]
kind = "policy"

[run]
episodes = 8
workers = 2
method = "grpo"

[grpo]
group_size = 4
groups_per_update = 2

[runtime]
backend = "ray"

[runtime.ray.inference]
num_gpus = 1

[runtime.ray.learner]
num_cpus = 2
"""


@pytest.mark.parametrize("threads", [0, 1])
def test_inference_and_learner_are_placed_on_ray_restarting_when_their_process_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """... or for what their spec restarts for in the driver: nothing, but for a learner
    training in a process of its own, that process's loss."""
    monkeypatch.setattr(ray_backend, "available", lambda: True)  # Ray is not started
    path = tmp_path / "p.toml"
    path.write_text(POLICY + f"\n[policy]\nlearner_threads = {threads}\n", encoding="utf-8")
    scenario = load_scenario(path)
    assembly = assemble(scenario, str(path), prepare_model=False, run_dir=tmp_path / "run")
    by_name = {spec.name: spec for spec in assembly.specs}
    inference = by_name["inference"]
    assert type(inference.factory()).__name__ == "RemoteInferenceActor"
    assert inference.factory.placement.num_gpus == 1  # pyright: ignore[reportFunctionMemberAccess]
    restarts = (RemoteActorLost, RemoteActorRestartable)
    assert (inference.on_failure, inference.restart_for) == ("restart", restarts)
    assert inference.factory().restart_for == ()  # its code raising stops the run
    sticky = inference.factory.inflight.sticky  # pyright: ignore[reportFunctionMemberAccess]
    assert [k.__name__ for k in sticky] == ["PolicyUpdated"]
    learner = by_name["learner"]
    assert type(learner.factory()).__name__ == "RemoteLearner"
    assert (learner.on_failure, learner.restart_for) == ("restart", restarts)
    assert learner.factory().restart_for == ((LearnerProcessLost,) if threads else ())
    assert learner.recover_on_restart and not inference.recover_on_restart
    assert type(by_name["trainer"].factory()).__name__ == "GrpoTrainer"  # still the driver's


def test_a_learning_run_with_remote_inference_needs_a_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_backend, "available", lambda: True)
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "p.toml"
    path.write_text(POLICY, encoding="utf-8")
    with pytest.raises(ScenarioInvalid) as err:
        assemble(load_scenario(path), str(path))
    assert str(err.value) == (
        f"{path}: $.runtime.ray.inference: a learning run with a remote inference needs a run "
        "directory (the learner and the extractor write their checkpoints there, inference "
        "reads the learner's)"
    )


COMPLEMENTARY = (
    POLICY.replace('method = "grpo"', 'method = "complementary"')
    .replace("[runtime.ray.inference]\nnum_gpus = 1\n", "")
    .replace("[runtime.ray.learner]\nnum_cpus = 2\n", "")
    + '\n[complementary]\nembedder = "hashing"\nextractor = "embedded-ops"\nwarmup = 0\n'
    + "\n[runtime.ray.extractor]\nnum_gpus = 1\n\n[runtime.ray.memory]\nnum_cpus = 0.5\n"
)


def test_the_extractor_and_the_memory_are_placed_on_ray_and_rebuilt_from_the_log_if_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_backend, "available", lambda: True)  # Ray is not started
    path = tmp_path / "c.toml"
    path.write_text(COMPLEMENTARY, encoding="utf-8")
    assembly = assemble(load_scenario(path), str(path), prepare_model=False)
    by_name = {spec.name: spec for spec in assembly.specs}
    for name, kind, placement in [
        ("extractor", "RemoteExtractorActor", ray_backend.Placement(num_gpus=1)),
        ("memory", "RemoteMemoryActor", ray_backend.Placement(num_cpus=0.5)),
    ]:
        spec = by_name[name]
        assert type(spec.factory()).__name__ == kind
        assert spec.factory.placement == placement  # pyright: ignore[reportFunctionMemberAccess]
        restarts = (RemoteActorLost, RemoteActorRestartable)
        assert (spec.on_failure, spec.restart_for) == ("restart", restarts)
        assert spec.factory().restart_for == ()  # its code raising stops the run
        assert spec.recover_on_restart
        assert getattr(spec.factory(), "recovers")  # noqa: B009 (its history crosses)
    for name, kind in [("credit", "CreditActor"), ("inference", "InferenceActor")]:
        assert type(by_name[name].factory()).__name__ == kind  # still the driver's


@pytest.mark.parametrize(
    ("method", "kind"), [("grpo", "extractor"), ("grpo", "memory"), ("empo2", "extractor")]
)
def test_placing_an_actor_the_method_does_not_have_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, kind: str
) -> None:
    monkeypatch.setattr(ray_backend, "available", lambda: True)
    path = tmp_path / "p.toml"
    text = POLICY.replace('method = "grpo"', f'method = "{method}"')
    path.write_text(text + f"\n[runtime.ray.{kind}]\nnum_cpus = 1\n", encoding="utf-8")
    with pytest.raises(ScenarioInvalid) as err:
        assemble(load_scenario(path), str(path), prepare_model=False)
    message = str(err.value)
    assert message.startswith(
        f"{path}: $.runtime.ray.{kind}: run.method = {method!r} has no {kind} actor to place "
        "(it has: "
    )
    assert "\n" not in message


def test_a_ray_scenario_without_ray_installed_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_backend, "available", lambda: False)
    path = scenario_path(tmp_path)
    with pytest.raises(ScenarioInvalid) as err:
        assemble(load_scenario(path), str(path))
    assert str(err.value) == (
        f"{path}: $.runtime.backend: \"ray\" needs Ray installed: pip install 'coevo[ray]' "
        "(in a checkout: pip install -e '.[ray]')"
    )


def test_a_world_s_missing_extra_says_how_to_install_it_both_ways() -> None:
    """The hint named only a checkout's editable install, which fails where coevo was
    installed from a wheel."""
    from scenarios.worlds.options import ExtraMissing, import_extra

    with pytest.raises(ExtraMissing) as err:
        import_extra("no_such_world_package", "scienceworld")
    assert str(err.value).endswith(
        "install coevo with the extra: pip install 'coevo[scienceworld]' (in a checkout: "
        "pip install -e '.[scienceworld]')"
    )


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("\n[runtime.ray.env_workers]\nnum_cpus = -1\n", "$.runtime.ray.env_workers.num_cpus"),
        ("\n[runtime.ray.env_workers]\nin_flight = 0\n", "$.runtime.ray.env_workers.in_flight"),
        ("\n[runtime.ray.env_workers]\nper_process = 0\n", "$.runtime.ray.env_workers.per_process"),
        ("\n[runtime.ray.env_workers]\ngpus = 1\n", "gpus"),
        ("\n[runtime.ray.extractor]\nnum_gpus = -1\n", "$.runtime.ray.extractor.num_gpus"),
        ("\n[runtime.ray.memory]\nper_process = 0\n", "$.runtime.ray.memory.per_process"),
        ("\n[runtime.ray.credit]\nnum_cpus = 1\n", "credit"),
        ("\n[runtime.ray.learner]\nin_flight = 0\n", "$.runtime.ray.learner.in_flight"),
        ("\n[runtime.ray.inference]\nnum_gpus = -1\n", "$.runtime.ray.inference.num_gpus"),
        ('\n[runtime.ray]\naddress = ""\n', "$.runtime.ray.address"),
        ('\n[runtime.ray]\naddress = "ray://head:10001"\n', "$.runtime.ray.address: 'ray://"),
        ('\n[runtime.ray]\naddress = "head"\n', "$.runtime.ray.address: 'head' is not local"),
        ('\n[runtime.ray]\naddress = "head:0"\n', "$.runtime.ray.address: 'head:0': the port"),
        ('\n[runtime.ray]\naddress = "head:x"\n', "$.runtime.ray.address: 'head:x': the port"),
        # Ray's own resources in `resources`: refused by Ray as each actor started (exit 1)
        ("\n[runtime.ray.env_workers]\nresources = {CPU = 1}\n", "'CPU' is one of Ray's own"),
        ("\n[runtime.ray.learner]\nresources = {GPU = 1}\n", "'GPU' is one of Ray's own"),
        ("\n[runtime.ray.memory]\nresources = {memory = 1e9}\n", "'memory' is one of Ray's"),
    ],
)
def test_placements_out_of_bounds_are_refused(tmp_path: Path, extra: str, fragment: str) -> None:
    with pytest.raises(ScenarioInvalid, match=fragment.replace("$", r"\$").replace(".", r"\.")):
        load_scenario(scenario_path(tmp_path, extra))


def test_an_actor_that_recovers_on_resume_keeps_its_history_for_its_process() -> None:
    class Keeper(Replayed):
        subscribes = ()

        async def begin(self, ctx: Context) -> None:
            return None

        async def handle(self, ctx: Context, ev: Event) -> bool:
            return True

    class Plain(Actor):
        async def run(self, ctx: Context) -> None:
            return None

    keeper = ray_backend.remote_spec(ActorSpec(name="k", factory=Keeper), ray_backend.Placement())
    plain = ray_backend.remote_spec(ActorSpec(name="p", factory=Plain), ray_backend.Placement())
    proxies = keeper.factory(), plain.factory()
    assert all(isinstance(p, ray_backend.RemoteActor) for p in proxies)
    assert [getattr(p, "recovers") for p in proxies] == [True, False]  # noqa: B009


def test_placement_bounds() -> None:
    with pytest.raises(ValueError, match="in_flight must be >= 1"):
        ray_backend.Placement(in_flight=0)
    with pytest.raises(ValueError, match="start_timeout must be > 0"):
        ray_backend.Placement(start_timeout=0)
    with pytest.raises(ValueError, match="per_process must be >= 1"):
        ray_backend.Placement(per_process=0)
    assert isinstance(ray_backend.Placement(), ray_backend.Placement)
    assert issubclass(ray_backend.RemoteActor, Actor)


class FakeRay:
    """What ``unplaceable`` asks of Ray: its nodes, each with the resources it offers."""

    def __init__(self, *nodes: dict[str, float], dead: dict[str, float] | None = None) -> None:
        self._nodes = [{"Alive": True, "Resources": dict(n)} for n in nodes]
        if dead is not None:
            self._nodes.append({"Alive": False, "Resources": dead})

    def nodes(self) -> list[dict[str, object]]:
        return self._nodes


@pytest.mark.parametrize(
    ("placement", "size", "nodes", "lacking"),
    [
        (ray_backend.Placement(num_cpus=0.25), 8, [{"CPU": 2.0}], ""),
        (ray_backend.Placement(num_cpus=1), 4, [{"CPU": 2.0}, {"CPU": 3.0}],
         "each process reserves 4 CPU; the most any node has is 3 CPU"),
        (ray_backend.Placement(num_gpus=1), 1, [{"CPU": 4.0}],
         "each process reserves 1 CPU, 1 GPU; the most any node has is 0 GPU"),
        (ray_backend.Placement(num_cpus=0, resources={"env": 1}), 2, [{"CPU": 4.0, "env": 1.0}],
         "each process reserves 2 env; the most any node has is 1 env"),
        (ray_backend.Placement(num_gpus=1), 1, [{"CPU": 4.0}, {"CPU": 0.5, "GPU": 1.0}],
         "each process reserves 1 CPU, 1 GPU; no node has all of them"),
        (ray_backend.Placement(num_gpus=1), 1, [{"CPU": 4.0, "GPU": 1.0}], ""),
        (ray_backend.Placement(num_cpus=0.14), 50, [{"CPU": 7.0}], ""),  # not 7.000000000000001
    ],
)  # fmt: skip
def test_a_placement_no_live_node_can_hold_is_named_with_what_it_lacks(
    monkeypatch: pytest.MonkeyPatch,
    placement: ray_backend.Placement,
    size: int,
    nodes: list[dict[str, float]],
    lacking: str,
) -> None:
    fake = FakeRay(*nodes, dead={"CPU": 64.0, "GPU": 8.0, "env": 8.0})  # a dead node counts not
    monkeypatch.setattr(ray_cluster, "ray_api", lambda: fake)
    assert ray_cluster.unplaceable(placement, size) == lacking


@pytest.mark.parametrize("address", ["local", "auto"])
def test_a_run_whose_placement_no_node_can_hold_is_refused_on_its_own_ray_instance(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    address: str,
) -> None:
    """At once, before any actor waits ``start_timeout`` for a node (a joined cluster, which
    an autoscaler may grow, only warns), naming the placement: the workers' largest process
    hosts ``min(per_process, workers)`` of them."""
    monkeypatch.setattr(ray_cluster, "ray_api", lambda: FakeRay({"CPU": 2.0}))
    monkeypatch.setattr(ray_cluster, "connected", lambda *_: contextlib.nullcontext())
    extra = (
        f'\n[runtime.ray]\naddress = "{address}"\n'
        "[runtime.ray.env_workers]\nnum_cpus = 1.5\nper_process = 8\n"
    )
    path = scenario_path(tmp_path, extra)
    scenario = load_scenario(path)
    if address == "local":
        with pytest.raises(ScenarioInvalid) as caught, cluster(scenario, str(path)):
            pytest.fail("the block ran")
        assert str(caught.value) == (
            f"{path}: $.runtime.ray.env_workers: each process reserves 3 CPU; the most any node "
            "has is 2 CPU (the Ray instance started for the run offers this machine's CPUs, or "
            "runtime.ray.num_cpus of them, its GPUs and no custom resource: ask for less, or "
            "join a cluster that has them with runtime.ray.address)"
        )
    else:
        ran = False
        with structlog.testing.capture_logs() as logs, cluster(scenario, str(path)):
            ran = True
        assert ran
        assert [(e["event"], e["log_level"]) for e in logs] == [
            ("no node of the cluster can host a placement yet", "warning")
        ]
        assert logs[0]["placement"].startswith("$.runtime.ray.env_workers: each process")


@pytest.mark.parametrize(
    ("workers", "cpus", "short"),
    [
        (2, 1.0, ""),
        (8, 1.0, "the run's actors reserve 8 CPU together; its nodes have 2 CPU"),
        (8, 0.25, ""),
    ],
)
def test_placements_that_fit_a_node_each_but_not_all_together_are_refused_on_its_own_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, cpus: float, short: str
) -> None:
    """Eight env workers of one CPU on a 2-CPU instance: each fits, so the run started, and six
    of them waited ``start_timeout``, restarted, and failed the run after ``max_restarts``."""
    monkeypatch.setattr(ray_cluster, "ray_api", lambda: FakeRay({"CPU": 2.0}))
    monkeypatch.setattr(ray_cluster, "connected", lambda *_: contextlib.nullcontext())
    extra = f"\n[runtime.ray.env_workers]\nnum_cpus = {cpus}\n"
    path = scenario_path(tmp_path, extra)
    scenario = load_scenario(path)
    scenario = msgspec.structs.replace(
        scenario, run=msgspec.structs.replace(scenario.run, workers=workers)
    )
    assert ray_cluster.short_together([(ray_backend.Placement(num_cpus=cpus), workers)]) == short
    if not short:
        with cluster(scenario, str(path)):
            pass
        return
    with (
        pytest.raises(ScenarioInvalid, match=r"\$\.runtime\.ray: " + short),
        cluster(scenario, str(path)),
    ):
        pytest.fail("the block ran")


def test_coevo_run_refuses_such_a_placement_before_it_makes_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(ray_backend, "available", lambda: True)
    monkeypatch.setattr(ray_cluster, "ray_api", lambda: FakeRay({"CPU": 2.0}))
    monkeypatch.setattr(ray_cluster, "connected", lambda *_: contextlib.nullcontext())
    path = scenario_path(tmp_path, "\n[runtime.ray.env_workers]\nnum_gpus = 1\n")
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "$.runtime.ray.env_workers: each process reserves 1 CPU, 1 GPU" in err
    assert not out.exists()


class _FakeRay:
    """``ray.init`` as Ray behaves: it installs its own SIGTERM handler (``sys.exit(15)``)
    and an ignored SIGINT's default; ``term`` sends a SIGTERM while it starts."""

    def __init__(self, term: bool) -> None:
        self.term, self.shut = term, 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **options: object) -> None:
        import signal
        import sys

        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.term:
            signal.raise_signal(signal.SIGTERM)

    def shutdown(self) -> None:
        self.shut += 1


@pytest.mark.parametrize(
    ("error", "hinted"),
    [(ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6380"), True),
     (RuntimeError("Version mismatch: The cluster was started with Ray 2.9"), False)],
)  # fmt: skip
def test_a_head_that_answers_and_refuses_to_connect_names_the_token(
    monkeypatch: pytest.MonkeyPatch, error: Exception, hinted: bool
) -> None:
    """An outside tester's wrong ``RAY_AUTH_TOKEN``: Ray logged an InvalidAuthToken line, then
    blamed "a previous Ray instance that has since crashed", and coevo's line said only
    ConnectionError: nothing named the token DEPLOY.md tells a user to set."""

    class Refusing(_FakeRay):
        def init(self, **options: object) -> None:
            raise error

    monkeypatch.setattr(ray_cluster, "ray_api", lambda: Refusing(False))
    monkeypatch.setattr(ray_cluster, "_check_answers", lambda *_: None)  # it answered
    with pytest.raises(ClusterUnavailable) as caught, ray_cluster.connected("192.0.2.2:6380"):
        pytest.fail("connected")
    said = str(caught.value)
    assert said.startswith(
        f"cannot join the Ray cluster at '192.0.2.2:6380' ([runtime.ray] address): "
        f"{type(error).__name__}: {error}"
    )
    assert ("RAY_AUTH_MODE and RAY_AUTH_TOKEN here must be the cluster's" in said) is hinted


class _Ours(KeyboardInterrupt):
    """What the process's own SIGTERM handler raises (coevo's ``Terminated``)."""


@pytest.mark.parametrize("term", [False, True], ids=["started", "SIGTERM while starting"])
def test_rays_start_keeps_the_processs_signal_handlers(
    monkeypatch: pytest.MonkeyPatch, term: bool
) -> None:
    """Ray's start replaced coevo's SIGTERM handler with ``sys.exit(15)``: a SIGTERM while Ray
    started (or later, in the closing report) ended the process with exit 15 and no word; an
    ignored SIGINT (a background job's) was then honoured."""
    import signal

    def ours(signum: int, frame: object) -> None:
        raise _Ours

    fake = _FakeRay(term)
    monkeypatch.setattr(ray_cluster, "ray_api", lambda: fake)
    before = {signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
    before[signal.SIGINT] = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGTERM, ours)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if term:
            with pytest.raises(_Ours), ray_cluster.connected("local"):
                pytest.fail("Ray did not start")
        else:
            with ray_cluster.connected("local"):
                assert signal.getsignal(signal.SIGTERM) is ours
                assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert fake.shut == 1  # what Ray started is shut down either way
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("ray", [True, False], ids=["ray imported", "no ray"])
def test_a_stopped_command_that_imported_ray_leaves_without_the_teardown(ray: bool) -> None:
    """A Ctrl-C that lands while Ray starts leaves its core worker half up, and the
    interpreter's teardown then crashed the process (exit 139 after ``coevo: interrupted``,
    2 of 3 such stops measured): such a process leaves at once, its output flushed."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import atexit, sys, types
        if {ray}:
            sys.modules["ray"] = types.ModuleType("ray")
        atexit.register(lambda: print("|teardown", end=""))
        import scenarios.cli.commands as commands
        def main(argv=None):
            print("said before the stop", end="")  # buffered: a pipe, no newline
            raise KeyboardInterrupt
        commands.main = main
        from scenarios.cli import entry
        entry.run([])
        """
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert done.returncode == 130 and done.stderr.endswith("coevo: interrupted\n")
    assert done.stdout == "said before the stop" + ("" if ray else "|teardown")


def test_a_cluster_address_where_nothing_answers_is_one_line_not_a_wait_without_end() -> None:
    """``ray.init`` at a ``HOST:PORT`` where nothing listens retried for minutes with no end
    in sight (and "auto" with no cluster, or a Ray Client address, ended in a traceback):
    the address is now tried first, and every failure to join is one line, exit 2."""
    import socket

    with socket.socket() as free:  # a port nothing listens on once it is closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ClusterUnavailable) as err, ray_cluster.connected(f"127.0.0.1:{port}"):
        pytest.fail("joined a cluster that is not there")
    assert str(err.value).startswith(f"cannot join the Ray cluster at '127.0.0.1:{port}'")
    assert "nothing answers there" in str(err.value) and err.value.exit_code == 2


def test_an_address_where_something_else_listens_is_one_line_not_a_wait_without_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ray.init`` at a ``HOST:PORT`` where a web server (or anything not a Ray head)
    listens, or something that accepts and never answers, waited for good with Ray's
    warnings every 40 s; "auto" naming a head that ended without ``ray stop`` (its address
    still in Ray's file, or ``RAY_ADDRESS``) did too. Each is one line now, exit 2."""
    import http.server
    import socket
    import threading

    pytest.importorskip("ray")
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts (the kernel does), never answers
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = free.getsockname()[1]
    monkeypatch.setattr(ray_cluster, "CONNECT_TIMEOUT_S", 1.0)
    try:
        cases = [
            (f"127.0.0.1:{web.server_address[1]}", None, "something else listens there"),
            (f"127.0.0.1:{silent.getsockname()[1]}", None, "does not answer as a Ray cluster"),
            ("auto", f"127.0.0.1:{dead}", "nothing answers there"),
        ]
        for address, env, said in cases:
            if env is not None:
                monkeypatch.setenv("RAY_ADDRESS", env)
            with pytest.raises(ClusterUnavailable) as err, ray_cluster.connected(address):
                pytest.fail(f"joined a cluster at {address}")
            assert said in str(err.value) and err.value.exit_code == 2, str(err.value)
            assert "\n" not in str(err.value)
            named = f"'auto' found {env} (RAY_ADDRESS)" if env else repr(address)
            assert str(err.value).startswith(f"cannot join the Ray cluster at {named}")
    finally:
        web.shutdown()
        web.server_close()
        silent.close()


class _Unresolved:
    """A Ray object ref that never resolves: a call on an actor no node has placed."""

    def future(self) -> concurrent.futures.Future[object]:
        return concurrent.futures.Future()


class _UnplacedRay:
    """Ray with one actor process it never places: every call on it waits; what was called and
    what was killed is kept."""

    class exceptions:
        RayError = type("RayError", (Exception,), {})
        RayTaskError = type("RayTaskError", (RayError,), {})

    def __init__(self) -> None:
        self.called: list[str] = []
        self.killed = 0
        handle = SimpleNamespace(**{
            method: SimpleNamespace(remote=lambda *_, m=method: self._call(m))
            for method in ("add", "deliver", "poll", "stop")
        })  # fmt: skip
        self._class = SimpleNamespace(options=lambda **_: SimpleNamespace(remote=lambda: handle))

    def _call(self, method: str) -> _Unresolved:
        self.called.append(method)
        return _Unresolved()

    def remote(self, cls: type) -> SimpleNamespace:
        return self._class

    def kill(self, handle: object, no_restart: bool) -> None:
        self.killed += 1

    def nodes(self) -> list[dict[str, object]]:
        return [{"Alive": True, "Resources": {"CPU": 2.0}}]


def test_an_actor_ray_never_places_fails_at_its_start_timeout_without_a_stop_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An outside tester's run: "not started within 5 s" came 20 s after the start, the driver
    waiting 15 s more for a stop call to a process Ray had never placed (each of the
    ``max_restarts`` waits 15 s longer than ``start_timeout`` says)."""
    fake = _UnplacedRay()
    monkeypatch.setattr(ray_cluster, "ray_api", lambda: fake)
    monkeypatch.setattr(ray_backend, "_host_class", lambda: fake.remote(object))
    placement = ray_backend.Placement(num_cpus=64, start_timeout=0.05)
    proxy = ray_backend.RemoteActor(
        Actor,
        placement,
        Inflight(),
        8,
        ray_backend._Process(placement, 1),  # pyright: ignore[reportPrivateUsage]
    )
    ctx = SimpleNamespace(name="worker-0", run_seed=0, attempt=0)

    async def main() -> None:
        with pytest.raises(RemoteActorLost, match=r"worker-0: not started within 0\.05 s"):
            await proxy.run(ctx)  # pyright: ignore[reportArgumentType]

    trio.run(main)
    assert (fake.called, fake.killed) == (["add"], 1)


def _unplaced_proxy(monkeypatch: pytest.MonkeyPatch) -> ray_backend.RemoteActor:
    fake = _UnplacedRay()
    monkeypatch.setattr(ray_cluster, "ray_api", lambda: fake)
    monkeypatch.setattr(ray_backend, "_host_class", lambda: fake.remote(object))
    placement = ray_backend.Placement(num_cpus=64, start_timeout=60)
    process = ray_backend._Process(placement, 1)  # pyright: ignore[reportPrivateUsage]
    return ray_backend.RemoteActor(Actor, placement, Inflight(), 8, process)


def test_a_cluster_lost_while_the_run_stops_is_the_proxys_error_not_a_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The raylet killed under a run: one worker's proxy found no live node and the run began
    to stop; the other's found the same as the stop reached it, and raised a group of its
    ``RemoteClusterLost`` and the stop's ``Cancelled``, which escaped the run as a traceback
    (``tests/integration/test_ray_raylet_lost.py``, one run in two after the Ray cases)."""
    proxy = _unplaced_proxy(monkeypatch)
    stopping = trio.CancelScope()

    async def no_node_left(name: str) -> None:
        await trio.sleep(0.01)
        stopping.cancel()  # the run's stop, as the proxy finds the cluster gone
        raise RemoteClusterLost(f"{name}: the Ray cluster has no live node left")

    monkeypatch.setattr(ray_backend, "_watch_nodes", no_node_left)
    ctx = SimpleNamespace(name="worker-1", run_seed=0, attempt=0)
    raised: list[BaseException] = []

    async def main() -> None:
        with stopping:
            try:
                await proxy.run(ctx)  # pyright: ignore[reportArgumentType]
            except BaseException as exc:
                raised.append(exc)
                raise

    with contextlib.suppress(RemoteClusterLost):
        trio.run(main)
    assert [type(e) for e in raised] == [RemoteClusterLost]
    assert "worker-1: the Ray cluster has no live node left" in str(raised[0])
